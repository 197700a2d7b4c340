"""``--strategy tpu``: TPUStrategy through TPUClusterResolver, in the notebook.

Where the TPU is comes from :func:`kdist_magics.hardware.detect_tpu`:

* TPU VMs -- Colab and Kaggle today, Cloud TPU VMs: ``/dev/accel*`` or
  ``/dev/vfio`` (or ``TPU_NAME=local``) -> ``TPUClusterResolver(tpu="local")``;
* the older address-based runtime (a TPU node): ``COLAB_TPU_ADDR`` -> ``grpc://host:port``,
  or ``TPU_NAME`` (a name or address) -> ``TPUClusterResolver(tpu=TPU_NAME)``.

Connecting and initialising the TPU system happens once per kernel (process);
later cells, and a new strategy object after ``%kdist restart``, reuse the same
``TPUStrategy`` -- re-initialising would wipe the TPU's memory, variables included.

Without a TPU the run stops before importing TensorFlow, with a three-line
message naming what was looked for and how to get a TPU runtime; the cell does
not run.

With ``KERAS_BACKEND=jax`` the TPU is driven by ``keras.distribution.DataParallel``
over ``jax.devices("tpu")`` instead (:mod:`.jax_dp`).

The TF calls go through a :class:`~..frameworks.on_tf.TPURuntime`, so tests inject a fake one.
"""

from __future__ import annotations

from typing import Any

from ... import errors
from ...errors import StrategyUnavailable
from ...hardware import TPU, TPU_PLACES, detect_tpu
from ..base import RunContext, Strategy
from ..frameworks.on_tf import TPURuntime
from .run import run_cell_here


def no_tpu(looked: str = TPU_PLACES, detail: str = ""):
    return errors.no_tpu(looked, detail)


#: connections of this process: target -> (resolver, strategy); once per kernel
_CONNECTIONS: dict[str, tuple[Any, Any]] = {}


def connect(tpu: TPU, runtime: TPURuntime, cache: dict | None = None):
    """The TPUStrategy for ``tpu``, connecting and initialising only the first time."""
    cache = _CONNECTIONS if cache is None else cache
    if tpu.target in cache:
        return cache[tpu.target][1]
    try:
        check = getattr(runtime, "check", None)
        if check is not None:
            check(tpu.target)
        resolver = runtime.resolver(tpu.target)
        runtime.initialize(resolver, tpu.target)
        strategy = runtime.strategy(resolver)
    except StrategyUnavailable:
        raise
    except Exception as exc:  # resolver ValueError, NotFoundError, connection refused, ...
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise no_tpu(
            f"{tpu.found_by or 'the TPU'} -> {tpu.target}", f"connecting failed ({type(exc).__name__}: {message[:160]})"
        ) from None
    cache[tpu.target] = (resolver, strategy)
    return strategy


class TPUStrategy(Strategy):
    name = "tpu"

    def __init__(self, runtime: TPURuntime | None = None, find=detect_tpu, cache: dict | None = None):
        self.runtime = runtime or TPURuntime()
        self.find = find
        self.cache = cache
        self.tpu: TPU | None = None
        self.strategy = None
        self._jax = None

    def size(self, spec) -> int:
        if self.strategy is not None:
            return int(self.strategy.num_replicas_in_sync)
        tpu = self.find()
        return tpu.cores if tpu is not None else 1

    def run(self, cell: str, ctx: RunContext) -> Any:
        tpu = self.find()
        if tpu is None:
            raise no_tpu()
        if self.strategy is None and self._jax is None:
            from .tpu_hygiene import refuse_if_held  # before this process takes the TPU

            refuse_if_held(lambda: tpu, started=lambda: False)  # its own runtimes say whether
        from ..frameworks.backends import check_backend

        if check_backend("tpu") == "jax":
            if self._jax is None:
                from .jax_dp import JaxDataParallel

                self._jax = JaxDataParallel(platform="tpu")
            return self._jax.run(cell, ctx)
        self.tpu = tpu
        self.strategy = connect(tpu, self.runtime, self.cache)
        n = int(self.strategy.num_replicas_in_sync)
        for rank in range(n):
            ctx.record.set_rank(rank, state="running", device=f"TPU:{rank}")
        value = run_cell_here(cell, ctx, scope=self.strategy.scope(), bind={"strategy": self.strategy})
        for rank in range(n):
            ctx.record.set_rank(rank, state="done")
        return value

    def status(self) -> dict[str, Any]:
        if self.strategy is None:
            return {"connected": False}
        return {"tpu": self.tpu.kind, "target": self.tpu.target, "replicas": int(self.strategy.num_replicas_in_sync)}

    def teardown(self) -> None:
        # The TPU system stays initialised for the kernel (see the module docstring).
        self.strategy = None
