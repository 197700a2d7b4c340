"""``--strategy multiworker`` under ``KERAS_BACKEND=jax``: one JAX process per engine (and,
with ModelParallel over a mesh instead of DataParallel, ``--strategy sharded --np N``).

Keras 3's own answer for more than one process: every engine joins ``jax.distributed``
(coordinator on rank 0) and the cell runs under a ``keras.distribution.DataParallel`` over
every process's devices, so it is ordinary Keras (``model.fit(x, y)``) and every process
ends with the same weights. Per run:

1. **Plan** (:meth:`JaxMultiWorkerStrategy._cluster`): each engine reports whether JAX is
   installed, whether its backends started and its ``jax.distributed`` state. JAX missing is
   a one-line error before any engine runs the cell. Engines already in kdist's process
   group for exactly these ranks are reused (warm). An engine where JAX already started any
   other way cannot join (``jax.distributed.initialize`` runs once, before other JAX use), so
   an owned cluster restarts and kdist says why; an attached one is the user's to restart.
   The coordinator listens on loopback for a cluster kdist started (``coordinator_bind_address``
   too, never every interface), on rank 0's address towards the others (``KDist.worker_network``)
   for an attached one; the port is chosen free by rank 0.
2. **Before the cell** (:func:`_setup`, on every engine at once): ``jax.distributed.initialize``
   (once per process), one random seed for the run on every process (a variable's initial
   value must be the same everywhere), ``DataParallel(devices=jax.devices(),
   auto_shard_dataset=False)``, and ``strategy`` bound to a :class:`ProcessesStrategy`.
3. **Data** (:func:`process_shards`): Keras (<= 3.15) takes a NumPy array given to ``fit`` as
   this process's own data, so the same full array on every engine would train each sample
   once per process per epoch. While the cell runs, ``fit``/``evaluate`` given in-memory arrays
   take this process's contiguous 1/N of them (equal sizes, so every process makes the same
   number of steps; a remainder of fewer than N samples is left out and said once), and
   ``validation_split``/``validation_data`` likewise. ``batch_size`` is per process (global
   batch = ``batch_size`` x processes, as under Horovod). Datasets and generators are passed
   through: give each process its own part (``ds.shard(strategy.num_processes,
   strategy.process_index)``). ``predict`` inside the cell raises a clear error (its output
   spans every process); ``--pull model`` and predict in the kernel. A distribution the cell
   sets itself (Keras' guide's ``ModelParallel`` over a ``(1, 2)`` mesh) is honoured: arrays go
   by this process's position on its data axis (:func:`..frameworks.on_jax.feeding`: processes
   sharing a position get the same rows), with its ``auto_shard_dataset`` off (Keras' own takes
   tf.data only).
   Inside the cell ``jax.distributed.initialize()`` and ``keras.distribution.initialize()``
   (no arguments, or ones matching the run) are no-ops (:mod:`.launcher_env`).
4. **After the cell**: the patches go; the process group stays for the next cell. A run
   stopped mid-way may leave collectives out of step: an owned cluster restarts before the
   next run.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable

from ...cluster.cluster import EngineCluster
from ...errors import KDistError
from ...cluster.network import engine_address, free_port, join
from ...cluster.placement import host_grouped_ranks
from ..base import RunContext
from ..engines import finish, waiting
from .group import ProcessGroupStrategy
from ..frameworks.fit_data import process_shards
from ..frameworks.on_jax import DataParallelStrategy, data_parallel
from .launcher_env import jax_calls
from ..frameworks.compat_jax import device_put_takes_keras_variables, locations_alike

SETUP_TIMEOUT = 120.0  # seconds for every process to join (they wait for each other)


class JaxMultiWorkerStrategy(ProcessGroupStrategy):
    setup_words = "jax.distributed (JAX import, initialize)"
    warm_modules = ("jax",)
    exposure = "jax"  # messages.EXPOSED: what other local users can reach
    backend = "jax"
    collective_values = True  # saving a model whose variables span the processes is collective
    restart_because = "; jax.distributed must start before any other JAX use in each process"
    attached_advice = (
        ". jax.distributed.initialize runs once per process, before any other JAX use, "
        "so these engines cannot join: restart them (e.g. client.shutdown(restart=True)) "
        "and run the cell again"
    )

    def __init__(self):
        super().__init__()
        self.coordinator = ""
        self._bind = ""

    # -- plan ------------------------------------------------------------------
    def _plan(self, cluster: EngineCluster, ctx: RunContext) -> str:
        """Choose ranks and the coordinator; '' when ready, else why the engines must restart."""
        mode = "loopback" if cluster.loopback else ctx.options.worker_network
        ars = [cluster.client[e.engine_id].apply_async(_probe, mode) for e in cluster.engines]
        infos = [ar.get(timeout=60) for ar in ars]
        ranks = host_grouped_ranks([e.hostname for e in cluster.engines])
        self._ranks = ranks
        missing = sorted(r for r, i in zip(ranks, infos) if not i["jax"])
        if missing:
            raise KDistError(
                f"KERAS_BACKEND=jax: JAX is not installed on rank "
                f"{', '.join(map(str, missing))} (pip install 'jax[cpu]' in the "
                f"engines' environment). The cell did not run."
            )
        other = sorted(r for r, i in zip(ranks, infos) if i["keras"] not in (None, "jax"))
        if other:
            return f"Keras already runs on {infos[ranks.index(other[0])]['keras']} on rank {other[0]}"
        n = len(ranks)
        dists = [i["distributed"] for i in infos]
        if (
            all(dists)
            and len({d["coordinator"] for d in dists}) == 1
            and all(d["processes"] == n and d["process"] == r for d, r in zip(dists, ranks))
        ):
            self.coordinator, self._bind = dists[0]["coordinator"], ""  # it runs already
            return ""
        started = sorted(r for r, i in zip(ranks, infos) if i["started"] or i["distributed"])
        if started:
            return f"JAX already started on rank {', '.join(map(str, started))}"
        bad = [f"rank {r}: {i['error']}" for r, i in zip(ranks, infos) if i.get("error")]
        if bad:
            raise KDistError("no coordinator address: " + "; ".join(bad))
        first = infos[ranks.index(0)]
        self.check_reachable(first["address"], cluster, "JAX's coordinator")
        self.coordinator = join(first["address"], first["port"])
        self._bind = self.coordinator  # the coordinator binds this address only, never [::]
        return ""

    # -- hooks -----------------------------------------------------------------
    def keras_distribution(self, ctx: RunContext) -> tuple[Callable, tuple]:
        """What each process builds its Keras distribution with: a function importable on the
        engines, given ``jax.devices()`` and the arguments after it. Multiworker's is Keras'
        DataParallel; ``--strategy sharded --np N`` hands its ModelParallel over the mesh."""
        return data_parallel, ()

    def before_cell(self, cluster: EngineCluster, ctx: RunContext, ranks: list[int]) -> None:
        import secrets

        n = len(ranks)
        seed = secrets.randbelow(2**31)  # one per run, the same on every process
        make, args = self.keras_distribution(ctx)
        ars = [
            cluster.client[e.engine_id].apply_async(_setup, self.coordinator, n, rank, self._bind, seed, make, args)
            for e, rank in zip(cluster.engines, ranks)
        ]
        infos = waiting.setup_results(
            self.run_now,
            ars,
            ranks,
            "jax.distributed",
            self.coordinator,
            SETUP_TIMEOUT,
            "joining jax.distributed failed",
        )
        for rank, info in infos.items():
            if info["process"] != rank or info["processes"] != n:  # pragma: no cover - defensive
                raise KDistError(
                    f"engine became JAX process {info['process']} of {info['processes']}, expected {rank} of {n}"
                )

    def after_cell(self, cluster: EngineCluster, ctx: RunContext, ok: bool) -> None:
        finish.end_collective_cell(self.run_now, ok, "the JAX processes' collectives", _leave)

    def listen_addresses(self) -> list[str]:
        """The coordinator's address, when this run is to start it (rank 0 binds it in set-up)."""
        return [self._bind] if self._bind else []

    def teardown(self) -> None:
        self.coordinator, self._bind = "", ""
        super().teardown()

    def status(self) -> dict[str, Any]:
        facts = super().status()
        if self.coordinator and self.cluster is not None and self.cluster.running:
            facts["jax coordinator"] = self.coordinator
        return facts


# -- engine side -----------------------------------------------------------------------
_run: dict[str, Any] = {}  # on an engine: the patches of the current cell


def _probe(mode: str) -> dict[str, Any]:  # runs on an engine
    """JAX installed?, started?, its distributed state, Keras' backend, an address and free port."""
    import importlib.util
    import socket

    from ..frameworks.compat_jax import jax_state

    keras = sys.modules.get("keras")
    out: dict[str, Any] = {
        "host": socket.gethostname(),
        "jax": importlib.util.find_spec("jax") is not None,
        "keras": keras.backend.backend() if keras is not None else None,
        "address": "",
        "port": 0,
        **jax_state(),
    }
    try:
        out["address"] = engine_address(mode)
        out["port"] = free_port(out["address"])
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def _setup(
    coordinator: str, processes: int, process: int, bind: str, seed: int, make: Callable, args: tuple
) -> dict[str, Any]:
    """On an engine: join ``jax.distributed`` (once per process), seed Keras alike on every
    process, set the distribution ``make(jax.devices(), *args)`` builds (the strategy's
    :meth:`~JaxMultiWorkerStrategy.keras_distribution`) and bind ``strategy`` to it, feed array
    inputs by data-axis position (:func:`..frameworks.on_jax.feeding`)."""
    import os

    from IPython import get_ipython

    from ..frameworks.compat_jax import jax_state

    _leave()  # a previous run interrupted before its end
    os.environ["KERAS_BACKEND"] = "jax"
    import jax

    if jax_state()["distributed"] is None:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=processes,
            process_id=process,
            coordinator_bind_address=bind or None,
            initialization_timeout=int(SETUP_TIMEOUT),
        )
    import keras

    # A variable's initial value must be the same on every process (jax checks it in
    # device_put, and older versions silently keep diverging replicas): same seed everywhere.
    keras.utils.set_random_seed(seed)
    devices = jax.devices()
    distribution = make(devices, *args)
    keras.distribution.set_distribution(distribution)
    strategy = ProcessesStrategy(distribution, devices, jax.process_index(), jax.process_count())
    local = jax.local_device_count()
    stack = _cell_patches(strategy, distribution, local)
    _run["stack"] = stack
    shell = get_ipython()
    if shell is not None:
        shell.user_ns["strategy"] = strategy
    return {
        "process": jax.process_index(),
        "processes": jax.process_count(),
        "devices": len(devices),
        "local_devices": local,
    }


def _cell_patches(strategy: "ProcessesStrategy", distribution, local: int) -> contextlib.ExitStack:
    """What a cell runs under on a JAX process, undone by :func:`_leave`: ``fit``'s arrays
    by this process's position, the cell's own set-up calls made the run's, JAX's workarounds,
    and batches that split over ``local`` devices."""
    from ..frameworks.on_jax import divisible_batches, feeding

    stack = contextlib.ExitStack()
    stack.enter_context(
        process_shards(
            strategy.process_index,
            strategy.num_processes,
            say=print if strategy.process_index == 0 else (lambda m: None),
            fit_callbacks=lambda: [_from_process_zero()],
            no_predict=(
                f"kdist: predict() inside a multiworker JAX cell would return an array spread over "
                f"{strategy.num_processes} processes; --pull the model and predict in the notebook instead"
            ),
            position=feeding(distribution, strategy.process_index, strategy.num_processes),
        )
    )
    # the cell's own jax.distributed.initialize() / keras.distribution.initialize(): the run's
    stack.enter_context(jax_calls(strategy.process_index, strategy.num_processes))
    stack.enter_context(device_put_takes_keras_variables())  # Keras' JAX guide, on JAX 0.12
    stack.enter_context(locations_alike())  # one cell, one program on every process (JAX 0.12.1)
    if local > 1:  # several devices per process: each process's batches must split over them
        stack.enter_context(divisible_batches(local))
    return stack


def _leave() -> None:  # runs on an engine
    """Undo the cell's patches (idempotent); the process group stays."""
    stack = _run.pop("stack", None)
    if stack is not None:
        stack.close()


class ProcessesStrategy(DataParallelStrategy):
    """``strategy`` on a JAX process: DataParallel over every process's devices."""

    def __init__(self, distribution, devices, process_index: int, num_processes: int):
        super().__init__(distribution, devices)
        self.process_index = process_index
        self.num_processes = num_processes

    def __repr__(self) -> str:
        return (
            f"<DataParallelStrategy {len(self.devices)} devices over {self.num_processes} "
            f"JAX processes (this is process {self.process_index})>"
        )


def _from_process_zero():
    """A callback: at the start of ``fit`` every process takes process 0's weights (as
    Horovod's broadcast callback does); a model built with a different seed on each process
    would otherwise train diverging replicas that JAX believes identical."""
    import keras
    import numpy as np

    class FromProcessZero(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            from jax.experimental import multihost_utils

            variables = list(self.model.variables)
            local = [np.asarray(v.value.addressable_data(0)) for v in variables]
            for v, value in zip(variables, multihost_utils.broadcast_one_to_all(local)):
                v.assign(np.asarray(value))

    return FromProcessZero()
