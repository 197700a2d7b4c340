"""``--strategy sharded [--devices N] [--mesh D,M]``: a model bigger than one device, Keras on JAX.

The cell runs in the notebook's own namespace inside a ``keras.distribution.ModelParallel``
over a mesh of D x M devices, axes ``("batch", "model")``: each batch is split over the data
axis D, each large variable over the model axis M (where the variables go:
:mod:`.layout`). ``strategy`` is bound to a :class:`ShardedRun` (``num_replicas_in_sync`` = D,
``scope()``, ``distribution``, ``mesh``).

Devices as for ``mirrored`` on JAX (:func:`..frameworks.on_jax.plan_devices`): every GPU or TPU core, or N
logical CPU devices (``--devices N``, default 2; JAX fixes them when it starts). ``--mesh D,M``
takes D x M devices; without it kdist takes the smallest model axis whose share of the
namespace's largest model (weights, gradients and two Adam moments) fits one device, the rest
data, and says so in one line; a later cell on the same devices keeps that mesh (a model built
under it must go on training under it).

In-memory arrays: batches are kept divisible by D while the cell runs, as under mirrored
(:func:`..frameworks.on_jax.divisible_batches`). After the cell, ``last_run().layout()`` is the table of
where each variable lives, and LayoutMap keys in the namespace that matched no variable are
said (Keras leaves those variables replicated without a word).

Keras 3.15 shards only on JAX: under TensorFlow or torch one line says so and nothing starts.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from ... import messages
from ...errors import StrategyUnavailable
from ...messages import say
from ...spec import sharded_on_engines as on_engines
from ..frameworks.backends import CPU_DEFAULT_DEVICES, keras_backend
from ..base import RunContext, Strategy
from ..kernel.run import run_cell_here


class ShardedRun:
    """What ``strategy`` is bound to in a sharded cell."""

    def __init__(self, distribution, devices, mesh: tuple[int, int]):
        self.distribution = distribution
        self.devices = list(devices)
        self.mesh = tuple(mesh)

    @property
    def num_replicas_in_sync(self) -> int:
        """How many ways each batch is split (the data axis)."""
        return self.mesh[0]

    def scope(self):
        return self.distribution.scope()

    def __repr__(self) -> str:
        kinds = "/".join(sorted({d.platform for d in self.devices}))
        return (
            f"<ShardedRun mesh {self.mesh[0]}x{self.mesh[1]} (batch x model) over "
            f"{len(self.devices)} {kinds} devices (keras.distribution.ModelParallel)>"
        )


def _device_bytes(devices) -> int | None:
    """One device's memory: what JAX reports (GPU, TPU), else what kdist detects (a GPU's; the
    host's shared by the devices). ``devices`` None: the engines' (not known in the kernel)."""
    try:
        limit = (devices[0].memory_stats() or {}).get("bytes_limit") if devices else None
    except Exception:
        limit = None
    if limit:
        return int(limit)
    from ...hardware import detect

    hw = detect()
    if hw.gpus or hw.tpu is not None:
        return hw.device_memory_bytes
    return int(hw.memory_bytes / len(devices)) if hw.memory_bytes and devices else hw.memory_bytes or None


def choose_mesh(n: int, user_ns, devices) -> tuple[tuple[int, int], str, bool]:
    """``(mesh, why, warn)`` for ``n`` devices when the line gives no ``--mesh``."""
    from ...choose.facts import TRAIN_STATE_FACTOR, human_bytes, inspect_model
    from .mesh import pick_model_axis

    model = inspect_model(user_ns)
    if model is None:
        return (1, n), messages.mesh_why_unknown(), False
    train = model["bytes"] * TRAIN_STATE_FACTOR
    device = _device_bytes(devices)
    words = f"'{model['name']}' (~{human_bytes(train)} to train)"
    m = pick_model_axis(n, train, device)
    if m is None and device:
        return (1, n), messages.mesh_why_too_big(words, human_bytes(train / n), human_bytes(device)), True
    if m is None:
        return (1, n), messages.mesh_why_unknown(), False
    return (n // m, m), messages.mesh_why_fits(words, human_bytes(train / m), human_bytes(device)), False


class ShardedStrategy(Strategy):
    name = "sharded"

    def __init__(self):
        self._runs: dict[tuple, ShardedRun] = {}  # one per (devices, mesh), reused across cells
        self._meshes: dict[tuple, tuple[int, int]] = {}  # the mesh chosen per device set
        self.current: ShardedRun | None = None
        self.engines = None  # the engine side, made by the first --np cell

    def size(self, spec) -> int:
        if on_engines(spec):
            return engine_count(spec)
        if spec.mesh:
            return spec.mesh[0] * spec.mesh[1]
        if spec.devices:
            return spec.devices
        from ...hardware import detect_gpus

        return len(detect_gpus()) or CPU_DEFAULT_DEVICES

    def _plan(self, ctx: RunContext) -> ShardedRun:
        """The devices, the mesh and the distribution for this cell (nothing runs yet)."""
        from ..frameworks import on_jax
        from .layout import distribution

        spec = ctx.spec
        wanted = spec.devices or (spec.mesh[0] * spec.mesh[1] if spec.mesh else None)
        devices = on_jax.plan_devices(wanted, None)
        n, ids = len(devices), tuple(d.id for d in devices)
        mesh = spec.mesh or self._meshes.get(ids)
        if mesh is None:
            mesh, why, warn = choose_mesh(n, ctx.shell.user_ns, devices)
            if not ctx.quiet:
                say(messages.mesh_chosen(mesh, n, why), warn=warn)
        elif not spec.mesh and not ctx.quiet:
            say(messages.mesh_reused(mesh, n))
        if mesh[0] * mesh[1] != n:
            raise StrategyUnavailable(messages.mesh_for_devices(mesh, n))
        cores = os.cpu_count() or 1  # said once per device set
        if not ctx.quiet and ids not in self._meshes and n > cores and all(d.platform == "cpu" for d in devices):
            say(messages.logical_devices_share_cores(n, cores))
        self._meshes[ids] = tuple(mesh)
        key = (ids, tuple(mesh))
        if key not in self._runs:
            self._runs[key] = ShardedRun(distribution(devices, mesh), devices, mesh)
        return self._runs[key]

    def run(self, cell: str, ctx: RunContext) -> Any:
        backend = keras_backend()
        if backend != "jax":
            raise StrategyUnavailable(messages.sharded_not_on(backend))
        if on_engines(ctx.spec):
            return self._on_engines(cell, ctx)
        run = self._plan(ctx)
        self._refuse_models_built_outside(cell, ctx, run)
        self.current = run
        ctx.record.mesh = tuple(run.mesh)  # the dashboard's title shows it
        for rank, device in enumerate(run.devices):
            ctx.record.set_rank(rank, state="running", device=str(device))
        scope = contextlib.ExitStack()
        scope.enter_context(run.scope())
        if run.mesh[0] > 1:
            from ..frameworks.on_jax import divisible_batches

            scope.enter_context(divisible_batches(run.mesh[0]))
        try:
            return run_cell_here(cell, ctx, scope=scope, bind={"strategy": run})
        finally:
            self._after(run, ctx)

    @staticmethod
    def _refuse_models_built_outside(cell: str, ctx: RunContext, run: ShardedRun) -> None:
        """A model the cell uses, built before it on one device: one line, nothing runs."""
        from .outside import built_outside

        shell = ctx.shell
        source = shell.transform_cell(cell) if shell is not None else cell
        names = built_outside(source, shell.user_ns, len(run.devices))
        if names:
            raise StrategyUnavailable(messages.built_outside_mesh(names, len(run.devices)))

    def _after(self, run: ShardedRun, ctx: RunContext) -> None:
        from .layout import table, unused_keys

        user_ns = ctx.shell.user_ns
        unused, example = unused_keys(user_ns)
        if unused:
            say(messages.layout_keys_unused(unused, example), warn=True)
        try:
            ctx.record.layout_table = table(user_ns, run.mesh)
        except Exception:  # a model left half-built by a failing cell: no table
            ctx.record.layout_table = None
        for rank in range(len(run.devices)):
            if ctx.record.ranks.get(rank) is not None and ctx.record.ranks[rank].state == "running":
                ctx.record.set_rank(rank, state="done")

    def _on_engines(self, cell: str, ctx: RunContext) -> Any:
        if self.engines is None:
            self.engines = engines_strategy()
        n = self.size(ctx.spec)
        mesh = ctx.spec.mesh
        if mesh is None:
            mesh, why, warn = choose_mesh(n, ctx.shell.user_ns, None)
            if not ctx.quiet:
                say(messages.mesh_chosen(mesh, n, why), warn=warn)
        self.engines.mesh = ctx.record.mesh = tuple(mesh)
        return self.engines.run(cell, ctx)

    def status(self) -> dict[str, Any]:
        facts = dict(self.engines.status()) if self.engines is not None else {}
        if self.current is not None:
            facts.update({"backend": "jax", "mesh": "x".join(map(str, self.current.mesh))})
        return facts

    def teardown(self) -> None:
        engines, self.engines = self.engines, None
        if engines is not None:
            engines.teardown()


# -- across engine processes (--np N) --------------------------------------------------------
def engine_count(spec) -> int:
    """How many engines: ``--np N``, else ``--mesh D,M``'s D x M, else the default."""
    from ...cluster.placement import default_np

    if "np" not in spec.given and spec.mesh:
        return spec.mesh[0] * spec.mesh[1]
    return spec.np or default_np()


def engines_strategy():
    """The engine side of ``--strategy sharded --np N``: multiworker's JAX processes
    (:mod:`..processes.jax_processes`: jax.distributed, warm engines, data by data-axis position) with
    kdist's ModelParallel over the mesh instead of DataParallel."""
    from ..processes.jax_processes import JaxMultiWorkerStrategy

    class ShardedEngines(JaxMultiWorkerStrategy):
        setup_words = "jax.distributed and the device mesh"
        mesh: tuple[int, int] = (1, 1)

        def keras_distribution(self, ctx):
            from .layout import engine_distribution

            return engine_distribution, (tuple(self.mesh),)

        def size(self, spec) -> int:
            return engine_count(spec)

        def after_cell(self, cluster, ctx, ok):
            # last_run().layout(): the shardings are global, so one process's view is the table
            ctx.record.layout_table = engine_table(cluster, self.mesh) if ok else None
            super().after_cell(cluster, ctx, ok)

    return ShardedEngines()


def engine_table(cluster, mesh):
    """The layout table of an engine run, read on the first engine; None when it cannot be."""
    from .layout import LayoutTable, engine_rows

    try:
        got = cluster.client[cluster.engines[0].engine_id].apply_async(engine_rows, tuple(mesh)).get(timeout=60)
    except Exception:  # the table is a view; a run is never failed for it
        return None
    return LayoutTable(tuple(mesh), rows=got["rows"], optimizer_bytes=got["optimizer_bytes"])
