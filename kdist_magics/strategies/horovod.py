"""``--strategy horovod``: the cell on N ipyparallel engines as Horovod ranks.

Per run: Horovod's own rendezvous server runs in the kernel (bound to loopback
for a local cluster, :attr:`KDist.bind_address` for an attached one), ranks and
local/cross ranks come from Horovod's host assignment over the engines'
hostnames, every engine gets its HOROVOD_* and Gloo variables and calls
``hvd.init()`` (after ``hvd.shutdown()`` of the previous run, so warm engines
re-initialise in well under a second), ``hvd`` is bound in the engine
namespace, and Horovod is shut down after the cell.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ..cluster import EngineCluster
from ..errors import KDistError, StrategyUnavailable
from .base import RunContext
from .engines import EngineStrategy


def iface_for(address: str) -> str:
    """The network interface that carries ``address`` on this machine (Gloo needs a name)."""
    import psutil

    if ipaddress.ip_address(address).is_loopback:
        return "lo"
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    raise KDistError(f"KDist.bind_address {address} is not an address of this machine")


class HorovodStrategy(EngineStrategy):
    name = "horovod"
    bound_names = ("hvd",)

    def __init__(self):
        super().__init__()
        try:
            import horovod.runner.http.http_server  # noqa: F401  (server side, no TF import)
        except ImportError as exc:
            raise StrategyUnavailable(
                "--strategy horovod needs Horovod, which is not installed here; build it against "
                "this TensorFlow with: python -m kdist_magics.horovod_build (needs cmake and g++; "
                "every other strategy works without it)"
            ) from exc
        self.rendezvous = None

    def ranks(self, cluster: EngineCluster, ctx: RunContext) -> list[int]:
        from ..rendezvous import assign

        return [slot.rank for slot in assign([e.hostname for e in cluster.engines])]

    def before_cell(self, cluster: EngineCluster, ctx: RunContext, ranks: list[int]) -> None:
        from .. import engine
        from ..rendezvous import Rendezvous

        hosts = [e.hostname for e in cluster.engines]
        if cluster.owned:
            address = "127.0.0.1"
        else:
            address = getattr(ctx.config, "bind_address", "127.0.0.1")
            if ipaddress.ip_address(address).is_loopback and len(set(hosts)) > 1:
                raise KDistError(
                    f"the engines run on {len(set(hosts))} hosts but the rendezvous would listen on "
                    f"loopback; set %config KDist.bind_address = '<an address every engine reaches>'")
        self.rendezvous = Rendezvous(hosts, address=address, iface=iface_for(address))
        if cluster.owned:
            ifaces = [self.rendezvous.iface] * len(hosts)
        else:  # each engine names its own interface towards the rendezvous
            ifaces = cluster.view().apply_sync(engine.route_iface, address)
        self.rendezvous.start()
        abort = (self.rendezvous.address, self.rendezvous.abort_line.port)
        ars = [cluster.client[e.engine_id].apply_async(engine.hvd_init,
                                                       self.rendezvous.env(i, iface=ifaces[i]), abort)
               for i, e in enumerate(cluster.engines)]
        for ar in ars:
            ar.wait(timeout=120)
        for ar, rank in zip(ars, ranks):
            if not ar.ready():
                self.needs_restart = "Horovod initialisation did not finish"
                raise KDistError(f"hvd.init() did not finish on rank {rank} within 120 s")
            try:
                info = ar.get()
            except Exception as exc:
                detail = (f"{exc.ename}: {exc.evalue}" if hasattr(exc, "ename")
                          else f"{type(exc).__name__}: {exc}")
                raise KDistError(f"hvd.init() failed on rank {rank}: {detail}") from None
            if info["rank"] != rank:  # pragma: no cover - defensive
                raise KDistError(f"engine became Horovod rank {info['rank']}, expected {rank}")

    def abort_collectives(self, cluster: EngineCluster, ranks: list[int]) -> None:
        """Ask every rank's abort watcher (see ``engine._watch_abort``) to shut Horovod down."""
        rdv = self.rendezvous
        if rdv is not None and rdv.abort_line is not None:
            rdv.abort_line.abort()

    def after_cell(self, cluster: EngineCluster, ctx: RunContext, ok: bool) -> None:
        from .. import engine

        try:
            if cluster.running and self.needs_restart is None:
                ar = cluster.view().apply_async(engine.hvd_shutdown)
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
