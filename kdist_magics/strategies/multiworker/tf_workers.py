"""``--strategy multiworker``: the cell on N engines under MultiWorkerMirroredStrategy.

TensorFlow's own multi-worker data parallelism, one engine per worker, no
Horovod. Per run:

1. **Plan** (:meth:`MultiWorkerStrategy._cluster`): every engine reports its
   host, the address it should listen on, a free port there, and its
   TensorFlow state. Ranks are grouped by hostname (engines sharing a host get
   consecutive ranks, as under Horovod), and TF worker index = rank. A warm
   cluster whose engines already hold kdist's strategy for exactly these
   engines reuses it. An engine on which TensorFlow already started (any
   eager op, or another ``TF_CONFIG``) cannot join a new cluster --
   TensorFlow configures collectives once per process -- so an owned cluster
   is restarted and kdist says why; an attached cluster is the user's to
   restart, and kdist says so.
2. **Environment** (:meth:`engine_env`): ``TF_CONFIG`` (and
   ``KERAS_BACKEND=tensorflow``) set on each engine before TensorFlow
   initialises there.
3. **Before the cell** (:meth:`before_cell`, on every engine at once, since
   the workers wait for each other): create (or reuse) the strategy, bind it as
   ``strategy``, apply :mod:`kdist_magics.strategies.multiworker.keras_mwms` (the Keras 3 fix for
   keras-team/keras#20585), enter ``strategy.scope()``, and make the cell's own
   ``tf.distribute.MultiWorkerMirroredStrategy()`` return it (:mod:`kdist_magics.strategies.frameworks.compat_tf_strategy`).
4. **After the cell** (:meth:`after_cell`): leave the scope, remove the fix.
   ``strategy`` stays bound, like the rest of the namespace.

Addresses: a cluster kdist starts uses loopback only. On an attached cluster
(``--cluster-id``/``--profile``) each engine's ``TF_CONFIG`` address follows
``%config KDist.worker_network``: ``''`` (default) the address the engine
reaches the controller with; an interface name (``'eth0'``, ``'ib0'``); a
network (``'10.0.0.0/16'``); or an address to route towards. Ports are
chosen free by each engine on its own host.

A run that stops mid-way (a rank stopped, interrupted or timed out) may leave
the workers' collectives out of step, so an owned cluster restarts before the
next run (an attached one gets a warning); a run whose ranks all finished, each done or raising (a typo, a bad
shape), keeps the warm engines.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ...cluster.cluster import EngineCluster
from ..frameworks.compat_tf import tf_started
from ...errors import KDistError
from ...messages import restarting_engines, say
from ...cluster.network import engine_address, free_port, join
from ...cluster.placement import host_grouped_ranks
from ..base import RunContext
from ..engines import finish, waiting
from ..engines.strategy import EngineStrategy

SETUP_TIMEOUT = 120.0  # seconds for every worker to create the strategy (they wait for each other)


def for_backend() -> EngineStrategy:
    """``--strategy multiworker`` follows the kernel's Keras backend (read without importing
    Keras): JAX processes under ``jax``, torch processes under ``torch``,
    MultiWorkerMirroredStrategy otherwise."""
    from ..frameworks.backends import keras_backend

    backend = keras_backend()
    if backend == "jax":
        from ..processes.jax_processes import JaxMultiWorkerStrategy

        return JaxMultiWorkerStrategy()
    if backend == "torch":
        from ..processes.torch_processes import TorchMultiWorkerStrategy

        return TorchMultiWorkerStrategy()
    from ..frameworks.backends import require_tensorflow

    require_tensorflow("--strategy multiworker on Keras' tensorflow backend (MultiWorkerMirroredStrategy)")
    return MultiWorkerStrategy()


class MultiWorkerStrategy(EngineStrategy):
    name = "multiworker"
    setup_words = "TensorFlow's workers (TF_CONFIG)"
    warm_modules = ("tensorflow",)
    backend = "tensorflow"
    exposure = "multiworker"  # messages.EXPOSED: what other local users can reach
    bound_names = ("strategy",)

    def __init__(self):
        super().__init__()
        self._ranks: list[int] = []
        self._configs: list[str] = []  # TF_CONFIG per engine, in cluster.engines order
        self._made = False  # a strategy exists on the engines (their TF is committed to it)
        self.addresses: list[str] = []
        self._restart_reason = ""

    # -- plan ------------------------------------------------------------------
    def _cluster(self, ctx: RunContext) -> EngineCluster:
        cluster = super()._cluster(ctx)
        plan = self._plan(cluster, ctx)
        if plan is None:  # TF already started on the engines: only a fresh process can join
            why = self._restart_reason
            if not cluster.owned:
                raise KDistError(
                    f"{why}. TensorFlow sets up multi-worker collectives once per process, so "
                    f"these engines cannot join a new MultiWorkerMirroredStrategy: restart them "
                    f"(e.g. ipcluster stop/start, or client.shutdown(restart=True)) and run the "
                    f"cell again"
                )
            say(
                restarting_engines(
                    f"{why}; MultiWorkerMirroredStrategy must be created before TensorFlow starts in each process"
                )
            )
            cluster.restart()
            self._made = False
            plan = self._plan(cluster, ctx)
            if plan is None:  # pragma: no cover - a fresh engine that imports TF at start-up
                raise KDistError(f"{self._restart_reason} even on freshly started engines")
        self._ranks, self._configs = plan
        return cluster

    def _plan(self, cluster: EngineCluster, ctx: RunContext):
        """(ranks, TF_CONFIG per engine) or None when the engines must restart first."""
        mode = "loopback" if cluster.loopback else ctx.options.worker_network
        ars = [cluster.client[e.engine_id].apply_async(_probe, mode) for e in cluster.engines]
        for ar in ars:
            ar.wait(timeout=60)
        busy = [e.engine_id for e, ar in zip(cluster.engines, ars) if not ar.ready()]
        if busy:
            if cluster.owned:
                self.must_restart("engines did not answer")
            raise KDistError(
                f"engine {', '.join(map(str, busy))} did not answer within 60 s (still busy in an "
                f"earlier run?); "
                + (
                    "they restart with the next cell"
                    if cluster.owned
                    else "restart the cluster's engines and run the cell again"
                )
            )
        infos = [ar.get() for ar in ars]
        hosts = [e.hostname for e in cluster.engines]
        ranks = host_grouped_ranks(hosts)
        current = [i.get("tf_config") for i in infos]
        self._made = any(current)
        if all(current) and len(set(_cluster_part(c) for c in current)) == 1:
            spec = json.loads(current[0])["cluster"]["worker"]
            if len(spec) == len(ranks) and all(json.loads(c)["task"]["index"] == r for c, r in zip(current, ranks)):
                self._made = True
                self.addresses = [spec[r] for r in ranks]
                return ranks, current
        started = [r for r, i in zip(ranks, infos) if i["tf_started"] or i.get("tf_config")]
        if started:
            other = any(i.get("tf_config") for i in infos)
            self._restart_reason = f"TensorFlow already started on rank {', '.join(map(str, sorted(started)))}" + (
                " with another TF_CONFIG" if other else ""
            )
            return None
        loopback = [r for r, i in zip(ranks, infos) if i["address"].startswith("127.")]
        if loopback and len(set(hosts)) > 1:
            raise KDistError(
                f"the engines run on {len(set(hosts))} hosts but rank "
                f"{', '.join(map(str, loopback))} would listen on loopback for TF_CONFIG; set "
                f"%config KDist.worker_network = '<interface, network or address every engine "
                f"reaches>'"
            )
        bad = [f"rank {r}: {i['error']}" for r, i in zip(ranks, infos) if i.get("error")]
        if bad:
            raise KDistError("no TF_CONFIG address: " + "; ".join(bad))
        workers = _worker_addresses(cluster, ranks, infos, mode)
        configs = [
            json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}) for rank in ranks
        ]
        self.addresses = workers
        return ranks, configs

    # -- hooks -----------------------------------------------------------------
    def ranks(self, cluster: EngineCluster, ctx: RunContext) -> list[int]:
        return list(self._ranks) if self._ranks else host_grouped_ranks([e.hostname for e in cluster.engines])

    def engine_env(self, cluster: EngineCluster, ctx: RunContext) -> list[dict[str, str]]:
        return [{"TF_CONFIG": c, "KERAS_BACKEND": "tensorflow"} for c in self._configs]

    def listen_addresses(self) -> list[str]:
        return list(self.addresses)

    def before_cell(self, cluster: EngineCluster, ctx: RunContext, ranks: list[int]) -> None:
        ars = [
            cluster.client[e.engine_id].apply_async(_setup, config) for e, config in zip(cluster.engines, self._configs)
        ]
        infos = waiting.setup_results(
            self.run_now,
            ars,
            ranks,
            "MultiWorkerMirroredStrategy",
            ", ".join(self.addresses),
            SETUP_TIMEOUT,
            "creating MultiWorkerMirroredStrategy failed",
        )
        self._made = True
        for rank, info in infos.items():
            if info["task"] != rank or info["workers"] != len(ranks):  # pragma: no cover
                raise KDistError(
                    f"engine became worker {info['task']} of {info['workers']}, expected {rank} of {len(ranks)}"
                )

    def after_cell(self, cluster: EngineCluster, ctx: RunContext, ok: bool) -> None:
        finish.end_collective_cell(
            self.run_now, ok, "MultiWorkerMirroredStrategy's collectives", _leave, committed=self._made
        )

    def teardown(self) -> None:
        self._made = False
        self._ranks, self._configs = [], []
        super().teardown()

    def status(self) -> dict[str, Any]:
        facts = super().status()
        if self.addresses and self.cluster is not None and self.cluster.running:
            facts["workers"] = " ".join(self.addresses)
        return facts


# -- helpers (kernel side) -------------------------------------------------------------
def _cluster_part(tf_config: str) -> str:
    return json.dumps(json.loads(tf_config)["cluster"], sort_keys=True)


# -- engine side -----------------------------------------------------------------------
_mw: dict[str, Any] = {}  # on an engine: the strategy, its TF_CONFIG, the entered scope


def _worker_addresses(cluster: EngineCluster, ranks: list[int], infos: list[dict], mode: str) -> list[str]:
    """Each rank's ``host:port`` for TF_CONFIG, by rank, from the engines' answers: an engine
    whose port another on its host drew too draws again (up to five times)."""
    workers = [""] * len(ranks)
    for engine, rank, info in zip(cluster.engines, ranks, infos):
        workers[rank] = join(info["address"], info["port"])
        for _ in range(5):
            if workers.count(workers[rank]) == 1:
                break
            # two engines on one host drew the same port: this one draws again
            again = cluster.client[engine.engine_id].apply_async(_probe, mode).get(timeout=60)
            workers[rank] = join(again["address"], again["port"])
    return workers


def _probe(mode: str) -> dict[str, Any]:  # runs on an engine
    """Host, TF state, the address for TF_CONFIG (per ``mode``) and a free port there."""
    import socket

    out: dict[str, Any] = {
        "host": socket.gethostname(),
        "tf_config": _mw.get("tf_config"),
        "tf_started": tf_started(),
        "address": "",
        "port": 0,
    }
    try:
        address = engine_address(mode)
        out["address"], out["port"] = address, free_port(address)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def _setup(tf_config: str) -> dict[str, Any]:  # runs on an engine
    """Create (or reuse) the strategy for ``tf_config``, bind it, apply the Keras fix, enter its scope."""
    import os

    from IPython import get_ipython

    _leave()  # a previous run interrupted before its end
    strategy = _mw.get("strategy")
    if strategy is None or _mw.get("tf_config") != tf_config:
        if "keras" in sys.modules:
            backend = sys.modules["keras"].backend.backend()
            if backend != "tensorflow":
                raise RuntimeError(
                    f"Keras runs on {backend} on this engine; MultiWorkerMirroredStrategy needs the tensorflow backend"
                )
        os.environ["TF_CONFIG"] = tf_config
        from ..frameworks.on_tf import multi_worker_strategy

        strategy = multi_worker_strategy()
        _mw.update(strategy=strategy, tf_config=tf_config)
    from . import compat_backup, keras_mwms

    _mw["fix"] = keras_mwms.install()
    # BackupAndRestore: the chief alone writes the backup (compat_backup says why)
    _mw["backup"] = compat_backup.install(chief=strategy.cluster_resolver.task_id == 0)
    scope = strategy.scope()
    scope.__enter__()
    _mw["scope"] = scope
    from ..frameworks import compat_tf_strategy  # the cell's own MultiWorkerMirroredStrategy() is this one

    _mw["handback"] = compat_tf_strategy.multiworker(strategy)
    _mw["handback"].__enter__()
    shell = get_ipython()
    if shell is not None:
        shell.user_ns["strategy"] = strategy
    resolver = strategy.cluster_resolver
    return {
        "task": resolver.task_id,
        "workers": len(resolver.cluster_spec().as_dict()["worker"]),
        "replicas": strategy.num_replicas_in_sync,
        "fix": _mw["fix"],
    }


def _leave() -> None:  # runs on an engine
    """Leave the strategy's scope and remove the Keras fix (idempotent)."""
    handback = _mw.pop("handback", None)
    if handback is not None:
        handback.__exit__(None, None, None)
    scope = _mw.pop("scope", None)
    if scope is not None:
        try:
            scope.__exit__(None, None, None)
        except Exception:
            pass
    if _mw.pop("fix", False):
        from . import keras_mwms

        keras_mwms.uninstall()
    if _mw.pop("backup", False):
        from . import compat_backup

        compat_backup.uninstall()
