"""What ``multiworker`` shares under the Keras backends whose engines are framework processes
in one process group (JAX: :mod:`.jax_processes`, torch: :mod:`.torch_processes`).

:class:`ProcessGroupStrategy` plans the run (ranks grouped by host; :meth:`_plan` says why the
engines cannot join, if they cannot), restarts an owned cluster whose engines cannot join and
says why, names the problem for an attached one (kdist never restarts what it did not start),
sets ``KERAS_BACKEND`` on every engine before Keras starts there, and refuses a loopback
rendezvous for engines on several hosts.
"""

from __future__ import annotations

from ...cluster.cluster import EngineCluster
from ...errors import KDistError
from ...messages import restarting_engines, say
from ...cluster.placement import host_grouped_ranks
from ..engines import waiting
from ..base import RunContext
from ..engines.strategy import EngineStrategy


class ProcessGroupStrategy(EngineStrategy):
    name = "multiworker"
    bound_names = ("strategy",)
    backend = "?"  # the Keras backend (KERAS_BACKEND on every engine): "jax" or "torch"
    #: why a process that already started cannot join, for the restart line
    restart_because = ""
    #: what an attached cluster's user must do, after the reason
    attached_advice = ": restart these engines (e.g. client.shutdown(restart=True)) and run the cell again"

    def __init__(self):
        super().__init__()
        self._ranks: list[int] = []

    def _plan(self, cluster: EngineCluster, ctx: RunContext) -> str:
        """Set ``self._ranks``; '' when the engines can join, else why they must restart
        (raise for what a restart cannot mend)."""
        raise NotImplementedError

    def _cluster(self, ctx: RunContext) -> EngineCluster:
        cluster = super()._cluster(ctx)
        reason = self._look(cluster, ctx)
        if reason:
            if not cluster.owned:
                raise KDistError(reason + self.attached_advice)
            say(restarting_engines(reason + self.restart_because))
            cluster.restart()
            reason = self._look(cluster, ctx)
            if reason:  # pragma: no cover - a fresh engine that starts the framework at start-up
                raise KDistError(f"{reason} even on freshly started engines")
        return cluster

    def _look(self, cluster: EngineCluster, ctx: RunContext) -> str:
        """:meth:`_plan`, an engine or the controller ending meanwhile named (:mod:`.waiting`)."""
        ranks = host_grouped_ranks([e.hostname for e in cluster.engines])
        with waiting.named_deaths(self, ranks, "while the engines were asked what they hold"):
            return self._plan(cluster, ctx)

    def ranks(self, cluster: EngineCluster, ctx: RunContext) -> list[int]:
        return list(self._ranks) or host_grouped_ranks([e.hostname for e in cluster.engines])

    def engine_env(self, cluster: EngineCluster, ctx: RunContext) -> list[dict[str, str]]:
        return [{"KERAS_BACKEND": self.backend} for _ in cluster.engines]

    def teardown(self) -> None:
        self._ranks = []
        super().teardown()

    @staticmethod
    def check_reachable(address: str, cluster: EngineCluster, what: str) -> None:
        """A loopback ``address`` for ``what`` cannot serve engines on several hosts."""
        if address.startswith("127.") and len({e.hostname for e in cluster.engines}) > 1:
            raise KDistError(
                f"the engines run on several hosts but rank 0 would listen on loopback "
                f"for {what}; set %config KDist.worker_network = '<interface, network "
                f"or address every engine reaches>'"
            )
