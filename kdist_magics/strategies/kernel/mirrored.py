"""``--strategy mirrored [--devices N]``: one machine's devices, in the notebook.

The cell runs in the notebook's own namespace inside
``tf.distribute.MirroredStrategy(devices).scope()``; ``strategy`` is bound
before the cell and stays bound afterwards. Models built and compiled in the
cell get mirrored variables, and ``model.fit`` splits each batch over the
replicas.

Devices: all GPUs, or the first N with ``--devices N``. Without GPUs the CPU is
split into N logical devices (default 2) so a laptop can demonstrate data
parallelism -- it does not make training faster, the replicas share the cores.

TensorFlow fixes its devices when its runtime starts (the first op, or any
device listing). If it already started with fewer logical CPU devices than
asked for, nothing can change that in this process: the run stops before the
cell, the namespace is untouched, and the message says to restart the kernel
and run the ``%%kdist`` cell first.

With ``KERAS_BACKEND=jax`` the same flags use ``keras.distribution.DataParallel``
(:mod:`.jax_dp`).
"""

from __future__ import annotations

from typing import Any

from ..frameworks.backends import CPU_DEFAULT_DEVICES, check_backend, keras_backend
from ..frameworks.on_tf import mirrored_strategy, plan_devices
from ..base import RunContext, Strategy
from .run import run_cell_here


#: this process's MirroredStrategy per device list; kept across %kdist restart because
#: models built under one must keep training under the same one
_MIRRORED: dict[tuple[str, ...], Any] = {}


class MirroredStrategy(Strategy):
    name = "mirrored"

    def __init__(self):
        self._strategies = _MIRRORED  # one per device set, reused across cells
        self._jax = None
        self.kind = None

    def size(self, spec) -> int:
        if spec.devices:
            return spec.devices
        from ...hardware import detect_gpus

        return len(detect_gpus()) or CPU_DEFAULT_DEVICES

    def run(self, cell: str, ctx: RunContext) -> Any:
        check_backend("mirrored")
        if keras_backend() == "jax":
            if self._jax is None:
                from .jax_dp import JaxDataParallel

                self._jax = JaxDataParallel(platform=None)
            return self._jax.run(cell, ctx)
        devices, kind = plan_devices(ctx.spec.devices)
        key = tuple(devices)
        strategy = self._strategies.get(key)
        if strategy is None:
            strategy = mirrored_strategy(devices)
            self._strategies[key] = strategy
        self.kind = kind
        for rank, device in enumerate(devices):
            ctx.record.set_rank(rank, state="running", device=device)
        from ..frameworks.compat_tf_strategy import mirrored  # the cell's own MirroredStrategy() is this one

        value = run_cell_here(cell, ctx, scope=mirrored(strategy, devices), bind={"strategy": strategy})
        for rank in range(len(devices)):
            ctx.record.set_rank(rank, state="done")
        return value

    def status(self) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        if self._strategies:
            facts["replicas"] = ",".join(str(len(k)) for k in self._strategies)
            facts["devices"] = self.kind
        if self._jax is not None:
            facts.update(self._jax.status())
        return facts

    def teardown(self) -> None:
        # Nothing to release: the devices belong to TF for the life of the process, and models
        # in the namespace stay tied to their strategy, which is why the MirroredStrategy
        # objects live in the module (_MIRRORED) and outlive this object.
        self._jax = None
