"""What every strategy provides. One object per strategy, kept by the magics
between cells so it can reuse what it set up (engines, a TPU connection)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..watch.record import RunRecord
from ..spec import KINDS, RunSpec


@dataclass(frozen=True)
class RunOptions:
    """The settings (``%config KDist.<name>``) strategies read, as they were when the run
    began. The defaults here are the traitlets' defaults (:class:`~kdist_magics.magics.KDist`
    takes them from this class), so each lives once."""

    bind_address: str = "127.0.0.1"
    worker_network: str = ""
    threads_per_rank: int | None = None
    rank_gpus: str = "own"
    freeze_gc: bool = True
    tf_info_logs: bool = False
    stop_grace: float = 5.0
    helper_nice: int = 10  # kdist's helper threads and the controller, below the ranks
    same_user_only: bool = True  # kdist's own listeners refuse other local users (peers.py)
    private_network: bool = True  # a cluster kdist starts gets a network of its own (namespace.py)
    preload: bool = True  # engines kdist starts import the strategy's framework as they start (follow.py)

    @classmethod
    def of(cls, config: Any) -> "RunOptions":
        """The options from a configurable (the KDist magics), each missing one at its default."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)})


@dataclass
class RunContext:
    """Everything a strategy's ``run`` may use besides the cell itself."""

    shell: Any  # the IPython InteractiveShell
    spec: RunSpec
    record: RunRecord
    options: RunOptions = field(default_factory=RunOptions)
    quiet: bool = False  # no news lines (%kdist start's background thread)
    #: ``(steps, batch_scale)``: a run of ``%kdist scale``'s probe (kdist_magics.scale)
    probe: tuple[int, float | None] | None = None


class Strategy:
    """Base class: ``run`` a cell; ``teardown`` what ``run`` set up."""

    name = "?"
    #: the Keras backend this object's engines were made for (multiworker follows the backend);
    #: None: any. The magic makes a new object when the backend has changed since.
    backend: str | None = None

    @property
    def in_kernel(self) -> bool:
        """True when the cell runs in the notebook's own namespace (:data:`spec.KINDS`)."""
        return KINDS.get(self.name) == "kernel"

    def size(self, spec: RunSpec) -> int:
        """How many ranks/replicas a run of ``spec`` will show on the dashboard."""
        return 1

    def run(self, cell: str, ctx: RunContext) -> Any:
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        """A few facts for ``%kdist status``."""
        return {}

    def teardown(self) -> None:
        """Release whatever the strategy holds (engines, servers). Idempotent."""
