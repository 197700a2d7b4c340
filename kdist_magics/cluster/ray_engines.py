"""``--launcher ray``: an owned cluster whose engines Ray places.

kdist starts the controller on this host (as for a local cluster, ending with the kernel),
listening on ``KDist.bind_address`` (an address every Ray node reaches), and starts the engines
through :class:`RayEngines`, an ipyparallel engine launcher (registered as ``ray`` through
ipyparallel's ``ipyparallel.engine_launchers`` entry point, so ``ipcluster start --engines ray``
uses it too): one placement group, one actor per rank in it, each running that rank's engine
(:mod:`.ray_actors`). The engines get the controller's connection from the environment
(``IPP_CONNECTION_INFO``), so no file needs to be shared with the nodes.

kdist owns what it asked Ray for: ``%kdist stop``, a restart, Stop (during the start or while a
cell runs) and a failed start or run stop the engines, kill the actors and remove the placement
group, so a shared cluster's resources are not held by a run that did not finish (a run that
finishes keeps them warm for the next cell); the kernel's death ends them too
(Ray ends a driver's actors and placement groups with it; each engine dies with its actor). A
node lost mid-run is named: ``rank 2 on node <id> (host): the Ray node died``.
"""

from __future__ import annotations

import uuid

from ipyparallel.cluster.launcher import EngineLauncher
from traitlets import Any, CaselessStrEnum, Float, Unicode

from . import ray_actors
from . import launch
from .cluster import EngineCluster
from .lifetime import process_tree
from ..errors import ClusterError
from ..messages import ray_actor_ended, ray_engine_ended, ray_node_died, ray_placing


#: each engine's command, as the actor runs it (``python``: the node's own)
ENGINE = ["python", "-m", "kdist_magics.cluster.ray_actors", "engine"]


class RayEngines(EngineLauncher):
    """ipyparallel's engine-set launcher for a Ray cluster (see the module's docstring)."""

    entrypoint_name = "ray"
    address = Unicode("", config=True, help="the Ray cluster ('' : RAY_ADDRESS, else this machine's)")
    placement = CaselessStrEnum(
        ray_actors.PLACEMENTS, "spread", config=True, help="spread the ranks over Ray's nodes, or pack them on few"
    )
    ready_timeout = Float(60.0, config=True, help="seconds Ray may take to place every rank")
    #: how kdist says what it does (the run's ``say``; None: silent, as under ipcluster)
    news = Any(None)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.actors: list = []
        self.group = None
        self.placed: list[dict] = []  # per rank: its engine's pid, host and Ray node
        self.joined = False

    def find_args(self) -> list[str]:
        """What each actor runs (with its node's own Python)."""
        return [*ENGINE, *self.cluster_args, *self.engine_args]

    def start(self, n: int):
        import ray

        options = ray_actors.RayOptions(self.address or None, self.placement)
        self.n = n
        self.joined = ray_actors.connect(options)
        share = ray_actors.bundle(n)
        if self.news is not None:
            self.news(
                ray_placing(
                    n,
                    options.where(),
                    ray_actors.live_nodes(),
                    ray.cluster_resources().get("CPU", 0),
                    share,
                    self.placement,
                )
            )
        try:
            name = ray_actors.new_name()
            self.group = ray_actors.reserve(n, share, self.placement, self.ready_timeout, name)
            self.actors = ray_actors.hosts(self.group, n, share, name)
            env, args = self.get_env(), self.find_args()[len(ENGINE) :]
            self.placed = ray.get(
                [actor.start.remote(args, env, f"kdist-{self.cluster_id}-{i}") for i, actor in enumerate(self.actors)],
                timeout=self.ready_timeout,
            )
        except BaseException:
            self._release()
            raise
        return self.notify_start({"engines": self.placed})

    def _release(self) -> None:
        actors, group = self.actors, self.group
        self.actors, self.group = [], None
        ray_actors.release(actors, group)
        ray_actors.disconnect(self.joined)
        self.joined = False

    async def stop(self):
        self._release()
        return self.notify_stop({"exit_code": 0})

    def signal(self, sig):
        if ray_actors.connected():  # never after a stop: Ray would start a cluster of its own
            for actor in self.actors:
                actor.signal.remote(int(sig))

    def lost(self) -> dict[int, str]:
        """``{rank: words}`` for ranks whose node died or whose engine ended (asks each actor)."""
        import ray

        out: dict[int, str] = {}
        if not ray_actors.connected():
            return out
        for rank, actor in enumerate(self.actors):
            where = self.placed[rank] if rank < len(self.placed) else {"node": "?", "host": "?"}
            try:
                code = ray.get(actor.poll.remote(), timeout=5)
            except ray.exceptions.GetTimeoutError:
                continue  # busy, not gone
            except Exception as exc:  # RayActorError, ActorUnavailableError: its node too?
                out[rank] = (
                    ray_actor_ended(where["host"], type(exc).__name__)
                    if ray_actors.node_alive(where["node"])
                    else ray_node_died(where["node"], where["host"])
                )
                continue
            if code is not None:
                out[rank] = ray_engine_ended(where["host"], code)
        return out


class RayCluster(EngineCluster):
    """An owned :class:`~.cluster.EngineCluster` whose engines Ray places (see module doc)."""

    launcher = "ray"
    #: a team's cluster: a run that does not finish gives the engines and the placement back
    kept_after_a_failed_run = False

    def __init__(
        self, n: int, options: ray_actors.RayOptions, ip: str, start_timeout: float = 120.0, controller_nice: int = 0
    ):
        super().__init__(n, ip=ip, start_timeout=start_timeout, controller_nice=controller_nice)
        self.options = options
        self.news = None

    @property
    def loopback(self) -> bool:
        """The ranks talk over loopback only when Ray placed them all on this machine."""
        return bool(self.engines) and all(self._local(e) for e in self.engines)

    def _before_start(self) -> None:
        ray_actors.require()

    def _start_owned(self) -> None:
        """The controller here, the engines in Ray's actors (:class:`RayEngines`)."""
        import ipyparallel as ipp

        self.cluster_id = self.cluster_id or f"kdist-{uuid.uuid4().hex[:10]}"
        config = launch.config(self.controller_nice)
        config.RayEngines.address = self.options.address or ""
        config.RayEngines.placement = self.options.placement
        self.cluster = ipp.Cluster(
            n=self.n,
            cluster_id=self.cluster_id,
            controller_ip=self.ip,
            controller_args=launch.heartbeat_args(),
            log_level=40,
            shutdown_atexit=True,
            engines=RayEngines,
            config=config,
        )
        self.cluster.start_controller_sync()
        self._exits.attach(self.cluster)
        self._pids_started |= set(self._process_tree_pids())
        self.cluster.start_engines_sync(news=self.news)
        self.client = self.cluster.connect_client_sync()

    def _start_failed(self, exc: Exception) -> ClusterError:
        return launch.start_failed(self, exc, f"on the Ray cluster at {self.options.where()}")

    def _launcher(self) -> RayEngines | None:
        return next(iter(getattr(self.cluster, "engines", {}).values()), None)

    def _identify(self) -> None:
        super()._identify()
        # engine pids on other machines are not this machine's to kill
        self._pids_started -= {e.pid for e in self.engines if not self._local(e)}

    def dead(self, settle: bool = False) -> dict[int, str]:
        launcher = self._launcher()
        if launcher is not None and launcher.actors:
            by_pid = {p["pid"]: words for rank, words in launcher.lost().items() for p in [launcher.placed[rank]]}
            named = {e.engine_id: by_pid[e.pid] for e in self.engines if e.pid in by_pid}
            if named:
                return named
        return super().dead(settle)

    def node_of(self, engine) -> str | None:
        launcher = self._launcher()
        placed = {p["pid"]: p["node"] for p in (launcher.placed if launcher is not None else [])}
        return f"Ray node {placed[engine.pid][:12]}" if engine.pid in placed else None

    def kill(self, engine_ids=None) -> None:
        """Every engine ends with its actor (killed here with the placement group); only those
        on this machine are signalled as well (one on a dead node would never answer)."""
        launcher = self._launcher()
        if launcher is not None:
            launcher._release()
        local = [e.engine_id for e in self.engines if self._local(e)]
        wanted = local if engine_ids is None else [i for i in engine_ids if i in local]
        if wanted:
            super().kill(wanted)

    def _local(self, engine) -> bool:
        from .machine import same_machine

        return same_machine(engine)

    def _process_tree_pids(self) -> list[int]:
        """The controller's processes only: the engines are Ray's actors' children."""
        pid = self.processes()["controller"]
        return sorted(process_tree({pid})) if pid else []

    def stop(self) -> None:
        launcher = self._launcher()
        if launcher is not None:
            launcher._release()  # before the controller: the engines end, the group is removed
        super().stop()

    def status(self) -> dict:
        facts = super().status()
        launcher = self._launcher()
        if launcher is not None and launcher.placed:
            nodes = sorted({p["node"][:12] for p in launcher.placed})
            facts["ray"] = (
                f"{self.options.where()}, {self.options.placement}, "
                f"node{'s' if len(nodes) != 1 else ''} {', '.join(nodes)}"
            )
        return facts


def submit(n: int, ctx, news) -> RayCluster:
    """The run's Ray cluster, not yet started (``news``: how kdist tells what it does)."""
    cluster = RayCluster(n, ctx.spec.ray, ip=ctx.options.bind_address, controller_nice=ctx.options.helper_nice)
    cluster.news = news
    return cluster
