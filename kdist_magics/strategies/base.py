"""What every strategy provides. One object per strategy, kept by the magics
between cells so it can reuse what it set up (engines, a TPU connection)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..record import RunRecord
from ..spec import RunSpec


@dataclass
class RunContext:
    """Everything a strategy's ``run`` may use besides the cell itself."""

    shell: Any  # the IPython InteractiveShell
    spec: RunSpec
    record: RunRecord
    config: Any  # the KDist magics object (its traitlets are the configuration)


class Strategy:
    """Base class: ``run`` a cell; ``teardown`` what ``run`` set up."""

    name = "?"
    #: True when the cell runs in the notebook's own namespace
    in_kernel = True

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
