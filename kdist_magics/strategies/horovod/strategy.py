"""``--strategy horovod``: the cell on N ipyparallel engines as Horovod ranks.

Per run: Horovod's own rendezvous server runs in the kernel (bound to loopback
for a local cluster, :attr:`KDist.bind_address` for an attached one), ranks and
local/cross ranks come from Horovod's host assignment over the engines'
hostnames, every engine gets its HOROVOD_* and Gloo variables and calls
``hvd.init()`` (after ``hvd.shutdown()`` of the previous run, so warm engines
re-initialise in well under a second), ``hvd`` is bound in the engine
namespace, and Horovod is shut down after the cell.

With ``--min-np K`` the run is elastic: the ranks run with ``HOROVOD_ELASTIC=1``, and when
an engine dies while at least K ranks are left, the kernel acts as Horovod's elastic driver:
it re-forms the rendezvous with the engines left (:meth:`HorovodStrategy.go_on_without`),
whose ``hvd.elastic.run`` restores the last commit and re-initialises as the smaller job.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ...cluster.cluster import EngineCluster
from ...errors import KDistError, StrategyUnavailable
from ...messages import say
from ...cluster.network import interface_of, route_iface
from ..base import RunContext
from ..engines import waiting
from ..engines.strategy import EngineStrategy
from .on_engine import elastic_env, hvd_init, hvd_shutdown


def iface_for(address: str) -> str:
    """The network interface that carries ``address`` on this machine (Gloo needs a name)."""
    if ipaddress.ip_address(address).is_loopback:
        return "lo"
    try:
        return interface_of(address)
    except LookupError:
        raise KDistError(f"KDist.bind_address {address} is not an address of this machine") from None


class HorovodStrategy(EngineStrategy):
    name = "horovod"
    setup_words = "Horovod (TensorFlow import, hvd.init)"
    warm_modules = ("tensorflow", "horovod.tensorflow")
    exposure = "horovod"  # messages.EXPOSED: what other local users can reach
    bound_names = ("hvd",)

    def __init__(self):
        super().__init__()
        from ..frameworks.backends import require_tensorflow

        require_tensorflow("--strategy horovod (Horovod's Keras API runs on TensorFlow here)")
        try:
            import horovod.runner.http.http_server  # noqa: F401  (server side, no TF import)
        except ImportError as exc:
            raise StrategyUnavailable(
                "--strategy horovod needs Horovod, which is not installed here; build it against "
                "this TensorFlow with: python -m kdist_magics.strategies.horovod.build (needs cmake and g++; "
                "every other strategy works without it)"
            ) from exc
        self.rendezvous = None
        self.min_np: int | None = None  # the run's --min-np: elastic when set
        self.labels: dict[int, int] = {}  # engine index -> rank label, this run
        self.engine_of: dict = {}  # engine index -> EngineInfo, this run
        self.growth = None  # the run's Growth under --max-np

    def ranks(self, cluster: EngineCluster, ctx: RunContext) -> list[int]:
        from .rendezvous import assign

        return [slot.rank for slot in assign([e.hostname for e in cluster.engines])]

    def before_cell(self, cluster: EngineCluster, ctx: RunContext, ranks: list[int]) -> None:
        from .rendezvous import Rendezvous

        hosts = [e.hostname for e in cluster.engines]
        if cluster.loopback:
            address = "127.0.0.1"
        else:
            address = ctx.options.bind_address
            if ipaddress.ip_address(address).is_loopback and len(set(hosts)) > 1:
                raise KDistError(
                    f"the engines run on {len(set(hosts))} hosts but the rendezvous would listen on "
                    f"loopback; set %config KDist.bind_address = '<an address every engine reaches>'"
                )
        if not cluster.loopback and len(set(hosts)) > 1:
            from .hostnames import check

            check(cluster, ranks)  # an unresolvable peer would abort every rank unnamed
        spec = ctx.spec
        elastic = spec.min_np is not None or spec.max_np is not None
        self.min_np = (spec.min_np or len(hosts)) if elastic else None
        private = cluster.namespace  # the ranks' own loopback: only they can connect there
        self.rendezvous = Rendezvous(
            hosts,
            address=address,
            iface=iface_for(address),
            elastic=elastic,
            same_user=ctx.options.same_user_only and private is None,
            sockets=private.socket if private is not None else None,
        )
        self.labels = {i: slot.rank for i, slot in enumerate(self.rendezvous.slots)}
        self.engine_of = dict(enumerate(cluster.engines))  # engine index -> EngineInfo
        self.growth = None
        if cluster.loopback:
            ifaces = [self.rendezvous.iface] * len(hosts)
        else:  # each engine names its own interface towards the rendezvous
            ifaces = cluster.view().apply_sync(route_iface, address)
        self.rendezvous.start()
        abort = (self.rendezvous.address, self.rendezvous.abort_line.port)
        envs = [self.rendezvous.env(i, iface=ifaces[i]) for i in range(len(hosts))]
        if elastic:
            envs = [elastic_env(env) for env in envs]
        ars = [cluster.client[e.engine_id].apply_async(hvd_init, envs[i], abort) for i, e in enumerate(cluster.engines)]
        results = waiting.setup_results(
            self.run_now, ars, ranks, "Horovod", f"the rendezvous at {address}", 120, "hvd.init() failed"
        )
        infos = {}
        for rank, info in results.items():
            if info["rank"] != rank:  # pragma: no cover - defensive
                raise KDistError(f"engine became Horovod rank {info['rank']}, expected {rank}")
            infos[rank] = info
        self._align_keras_names(cluster, [infos[r].get("keras_names") for r in sorted(infos)])
        if elastic:
            self.rendezvous.plan.started()
        if spec.max_np is not None:
            from .grow import Growth

            self.growth = Growth(self, self.run_now, spec.max_np, infos[0].get("keras_names"))

    @staticmethod
    def _align_keras_names(cluster: EngineCluster, names: list) -> None:
        """Horovod matches the ranks' collectives by op name, and names come from per-process
        counters (Keras' automatic layer names, "dense_3"; TensorFlow's default graph's, which
        names eager broadcasts): engines that ran different cells before (an attached
        cluster's, or a run on fewer of them) would name the same cell's ops apart and wait for
        each other for ever. Keras' counters tell: where they differ, every rank's session is
        cleared (``keras.backend.clear_session()``: both counters start again) before the cell."""
        names = [n or {} for n in names]  # None: Keras not imported there yet, no name given
        if any(n != names[0] for n in names[1:]):
            cluster.view().apply_sync(_clear_session)

    def rank_engines(self, cluster: EngineCluster) -> dict | None:
        rdv = self.rendezvous
        if rdv is None or rdv.plan is None or len(rdv.plan.sizes) == 1:
            return None
        return {slot.rank: self.engine_of[i] for i, slot in rdv.plan.slots.items()}

    def next_label(self) -> int:
        """The rank label (in the record and the dashboard) of an engine joining the run."""
        return max(self.labels.values()) + 1 + len(self.growth.joining if self.growth else ())

    def grow(self, cluster: EngineCluster, ctx: RunContext, final: bool):
        return self.growth.step(final) if self.growth is not None else []

    def go_on_without(self, cluster: EngineCluster, ctx: RunContext, deaths: dict[int, str]) -> dict[int, int] | None:
        """Elastic runs: re-form the job without the dead ranks while ``--min-np`` are left;
        ``{rank: new rank}`` of the ranks left (None: too few, the run stops)."""
        from ...messages import too_few_left

        rdv = self.rendezvous
        if rdv is None or rdv.plan is None:
            return None
        rank_of = self.labels  # engine index -> its rank label in this run
        index_of = {r: i for i, r in rank_of.items()}
        left = len(rdv.plan.slots) - len(deaths)
        if left < self.min_np:
            say(too_few_left(left, self.min_np) + "; stopping the run", warn=True)
            rdv.plan.close()  # a rank re-initialising after the failure is told it is out
            return None
        new = rdv.shrink([index_of[r] for r in deaths])
        return {rank_of[i]: slot.rank for i, slot in new.items()}

    def abort_collectives(self, cluster: EngineCluster, ranks: list[int]) -> None:
        """Ask every rank's abort watcher (see :func:`.on_engine._watch_abort`) to shut Horovod down."""
        rdv = self.rendezvous
        if rdv is not None and rdv.abort_line is not None:
            rdv.abort_line.abort()

    def after_cell(self, cluster: EngineCluster, ctx: RunContext, ok: bool) -> None:

        try:
            if cluster.running and self.run_now.restart is None:
                ar = self.run_now.live_view().apply_async(hvd_shutdown)
                ar.wait(timeout=10)
        finally:
            if self.rendezvous is not None:
                self.rendezvous.stop()
                self.rendezvous = None

    def teardown(self) -> None:
        if self.rendezvous is not None:
            self.rendezvous.stop()
            self.rendezvous = None
        super().teardown()

    def status(self) -> dict[str, Any]:
        return super().status()


def _clear_session() -> None:
    """On an engine: Keras' and TensorFlow's name counters start again."""
    import keras

    keras.backend.clear_session()
