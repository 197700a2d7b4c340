"""ipyparallel engines as worker processes: start or attach, watch, signal, stop.

Nothing here knows about Horovod or TensorFlow. An :class:`EngineCluster` is
either *owned* (kdist started it: a local controller and N engines, every
socket on loopback) or *attached* (``--cluster-id`` / ``--profile``: somebody
else's cluster, which kdist connects to and never stops or kills).

Engines are reported in engine-id order as :class:`EngineInfo` (engine id, pid,
hostname). Whether they and the controller are alive is :mod:`.liveness`'s part.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Any, Callable, Iterable

from .compat_ipyparallel import LauncherExits, end_sync_thread
from ..errors import ClusterError, Interrupted
from ..messages import interrupted_start
from . import launch
from .exits import kill_pids
from .lifetime import end_groups, led_groups, process_tree
from ..rank.faults import hold
from .liveness import FROZEN_AFTER, EngineInfo, Liveness  # noqa: F401 (FROZEN_AFTER: for callers)


def _identify():  # runs on an engine
    import os
    import socket

    from kdist_magics.cluster.machine import machine_id

    return os.getpid(), socket.gethostname(), machine_id()


#: seconds to wait for engines on other hosts to answer a signal sent through ipyparallel
SIGNAL_WAIT = 5.0


class EngineCluster(Liveness):
    """A set of ipyparallel engines used as ranks.

    ``n``: engines to start (owned) or to wait for (attached).
    ``cluster_id`` / ``profile``: attach instead of starting.
    ``ip``: where an owned controller listens (loopback unless configured).
    ``private``: an owned cluster's engines get a network of their own (:mod:`.namespace`);
    the controller then listens on Unix sockets only, in a folder of this user's alone.
    ``preload``: modules an owned cluster's engines import as they start, while the controller
    and the other engines start (the strategy's framework, with ``threads`` per rank as the run
    sets them; 0: the run's rule); see :func:`kdist_magics.cluster.follow.preload`.

    What the strategies use of any cluster (a launcher's subclass keeps it): ``start``/``stop``/
    ``restart``, ``engines``, ``client``, ``loopback``, ``dead``/``kill``/``signal``,
    ``status``, ``options`` (a launcher's: same options, same cluster), ``give_up`` and
    ``kept_after_a_failed_run``.
    """

    #: which launcher started it (its --launcher name: cluster/launchers.py); an attached one's is local
    launcher = "local"
    #: a launcher's options (Slurm's, Ray's): a run asking for others needs another cluster
    options = None
    #: what a run that does not finish (Stop, a failure) does to an owned cluster: keep its
    #: engines warm for the next cell, or give what it holds back (a shared cluster's: Ray's)
    kept_after_a_failed_run = True

    def __init__(
        self,
        n: int,
        cluster_id: str | None = None,
        profile: str | None = None,
        ip: str = "127.0.0.1",
        start_timeout: float = 120.0,
        controller_nice: int = 0,
        private: bool = False,
        preload: tuple[str, ...] = (),
        threads: int = 0,
    ):
        self.n = n
        self.preload = tuple(preload)
        if preload:  # the run's rule (engine.threads_per_rank), as the preload must set it first
            from ..rank.lifecycle import threads_per_rank

            threads = threads_per_rank(n, threads)
        self.threads = threads
        self.controller_nice = controller_nice  # an owned controller runs this much nicer
        self.attached = cluster_id is not None or profile is not None
        self.private = private and not self.attached
        #: the running private network (:class:`~.namespace.Namespace`), while there is one
        self.namespace = None
        self.cluster_id = cluster_id
        self.profile = profile
        self.ip = ip
        self.start_timeout = start_timeout
        self.cluster = None  # ipyparallel.Cluster when owned
        self.client = None
        #: called with the number of engines registered so far while :meth:`start` waits
        self.on_registered: Callable[[int], None] | None = None
        #: a launcher with phases of its own (a Slurm job's queue): called with a phase's name,
        #: and with more about the current phase, while :meth:`start` waits
        self.on_phase: Callable[[str], None] | None = None
        self.on_detail: Callable[[str], None] | None = None
        self.engines: list[EngineInfo] = []
        #: fingerprints of the --push values its engines were sent (strategies/engines/push.py)
        self.held_prints: dict[str, str] = {}
        self._stopped_since: dict[int, float] = {}  # pids of local engines seen stopped (SIGSTOP, ptrace)
        self._ended_why: dict[int, str] = {}  # pids of engines kdist ended, and why (their death's words)
        self._pids_started: set[int] = set()
        self._exits = LauncherExits()
        self._theirs: tuple[int, float] | None = None  # an attached cluster's local controller: pid, start
        self.starts = 0

    # -- lifecycle -----------------------------------------------------------
    @property
    def owned(self) -> bool:
        return not self.attached

    @property
    def loopback(self) -> bool:
        """The ranks reach each other on this machine's loopback (a cluster kdist started here)."""
        return self.owned

    def give_up(self) -> None:
        """Called from another thread: end a :meth:`start` that waits for something else than
        its own processes (a Slurm job in the queue, :mod:`.slurm_engines`); nothing here."""

    @property
    def running(self) -> bool:
        return self.client is not None

    def start(self) -> "EngineCluster":
        """Start (owned) or connect (attached) and learn every engine's pid and host: every
        cluster's one start, whose steps a launcher's cluster (Slurm's, Ray's) overrides."""
        if self.running:
            return self
        self._before_start()
        self._stopped_since.clear()
        self._ended_why.clear()
        try:
            if self.owned:
                self._start_owned()
            else:
                self._connect()
            self._wait_for_engines()
            self.client.wait_for_engines(self.n, timeout=self.start_timeout, interactive=False)
        except KeyboardInterrupt:
            self._interrupted_start()  # leave nothing half-started behind
            raise Interrupted(interrupted_start(self.n)) from None  # one line, no kdist frames
        except Exception as exc:
            failed = self._start_failed(exc)
            if failed is exc:  # already the words to say
                raise
            raise failed from exc
        self.starts += 1
        launch.log_start(self)
        self._identify()
        self._after_start()
        if self.owned and not getattr(self, "_atexit", False):
            # kernel shutdown: stop what we started even if nobody called %kdist stop
            import atexit
            import weakref

            ref = weakref.ref(self)
            atexit.register(lambda: ref() is not None and ref().stop())
            self._atexit = True
        return self

    def _before_start(self) -> None:  # checks before anything starts (a launcher's own)
        pass

    def _after_start(self) -> None:  # every engine registered and identified
        pass

    def _interrupted_start(self) -> None:
        """Stop while starting: stop what started."""
        self.stop()

    def _start_owned(self) -> None:
        """Start a controller and ``n`` engines (in a private network when ``private``)."""
        import ipyparallel as ipp

        self.cluster_id = self.cluster_id or f"kdist-{uuid.uuid4().hex[:10]}"
        ip, args = self.ip, launch.heartbeat_args()
        if self.private:
            from .namespace import Namespace

            self.namespace = Namespace().start()
            self._pids_started.add(self.namespace.pid)
            ip, args = str(self.namespace.folder / "c"), [*args, "--transport=ipc"]
        self.cluster = ipp.Cluster(
            n=self.n,
            cluster_id=self.cluster_id,
            controller_ip=ip,
            controller_args=args,
            log_level=40,
            shutdown_atexit=True,
            config=launch.config(
                self.controller_nice, self.namespace and self.namespace.pid, self.preload, self.threads, self.n
            ),
        )
        self.cluster.start_controller_sync()
        self._exits.attach(self.cluster)  # the controller's exit is known at once
        hold("controller", self)
        self.cluster.start_engines_sync()
        self._exits.attach(self.cluster)  # engine exits are known at once from here on
        self._pids_started |= set(self._launched())  # (a stopped launcher leaves its set)
        hold("engines", self)
        self.client = self.cluster.connect_client_sync()

    def _connect(self) -> None:
        """Connect to a cluster someone else started (``cluster_id``/``profile``)."""
        import ipyparallel as ipp

        kwargs: dict[str, Any] = {}
        if self.cluster_id is not None:
            kwargs["cluster_id"] = self.cluster_id
        if self.profile is not None:
            kwargs["profile"] = self.profile
        self.client = ipp.Client(**kwargs)
        self._theirs = self._their_controller()

    def _start_failed(self, exc: Exception) -> ClusterError:
        """Stop what started, and the error that says why the start failed."""
        where = (
            "the local cluster"
            if self.owned
            else f"cluster {self.cluster_id or ''!s} (profile {self.profile or 'default'})"
        )
        gone = self.controller_gone() if self.owned and not isinstance(exc, ClusterError) else None
        self.stop()
        why = str(exc) if isinstance(exc, ClusterError) else f"{type(exc).__name__}: {exc}"
        if gone:  # ipyparallel's words for it name a status code
            why = f"the controller {gone} while the cluster started"
        return ClusterError(f"could not start {where} with {self.n} engines: {why}")

    def _wait_for_engines(self, every: float = 0.1) -> None:
        """Until ``n`` engines have registered (or the start timeout), telling
        :attr:`on_registered` each new count; ``wait_for_engines`` then checks and raises."""
        deadline = time.monotonic() + self.start_timeout
        told = -1
        while time.monotonic() < deadline:
            count = len(self.client.ids)
            if count != told and self.on_registered is not None:
                self.on_registered(min(count, self.n))
                told = count
            if count >= self.n:
                return
            if trouble := self._starting_trouble():
                raise ClusterError(trouble)
            time.sleep(every)

    def _launched(self) -> list[int]:
        """Pids of the engines an owned cluster's launchers started."""
        return [
            launcher.pid
            for engine_set in getattr(self.cluster, "engines", {}).values()
            for launcher in getattr(engine_set, "launchers", {}).values()
            if (getattr(launcher, "pid", None) or -1) > 0
        ]

    def processes(self) -> dict[str, Any]:
        """Pids so far: an owned cluster's ``controller`` (None when attached or not started),
        the engines its launchers started (``launched``), the registered ``engines``, and the
        holder of their private network (``netns``, None without one)."""
        pid = getattr(getattr(self.cluster, "controller", None), "pid", None)
        return {
            "controller": pid if (pid or -1) > 0 else None,
            "launched": self._launched(),
            "engines": [e.pid for e in self.engines],
            "netns": self.namespace.pid if self.namespace is not None else None,
        }

    def _identify(self) -> None:
        ids = sorted(self.client.ids)[: self.n]
        if len(ids) < self.n:
            raise ClusterError(f"{self.n} engines wanted, {len(ids)} registered")
        try:
            found = self.client[ids].apply_async(_identify).get(timeout=60)
        except Exception as exc:  # a stopped engine stays registered until its heartbeat stops
            raise ClusterError(
                f"the engines did not answer within 60 s ({type(exc).__name__}); is one of them stopped or busy?"
            ) from exc
        self.engines = [EngineInfo(eid, *facts) for eid, facts in zip(ids, found)]
        if self.owned:
            self._pids_started |= {e.pid for e in self.engines}
            self._pids_started |= set(self._process_tree_pids())

    def view(self, engine_ids: Iterable[int] | None = None):
        ids = [e.engine_id for e in self.engines] if engine_ids is None else list(engine_ids)
        return self.client[ids]

    def stop(self) -> None:
        """Disconnect; for an owned cluster stop controller and engines and reap every process."""
        # the tree first, while self.cluster still names the controller's launcher: read after,
        # it missed the controller, which then ended only if ipyparallel's stop reached it (a
        # controller still starting, as after a Slurm refusal, can miss that: rehearsal 16)
        tree = self._process_tree_pids() if self.cluster is not None else []
        # and the groups they lead: a controller that SIGTERM reaches while it starts its
        # schedulers dies at once, and those it forked after the tree was read stay in its
        # group, orphaned (make test, 4 Dec: two after a Slurm refusal); killed by group after
        groups = led_groups(tree)
        client, self.client = self.client, None
        cluster, self.cluster = self.cluster, None
        self._theirs = None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass
        if cluster is not None:
            self._exits.restore()
            # End every process we started, by pid (engines hold no state worth a slow
            # goodbye, and nannies would otherwise outlive stop_cluster by ~30 s), then
            # let ipyparallel tidy its files and bookkeeping (quick: nothing left to wait for).
            kill_pids(set(tree) | self._pids_started, grace=1.0)
            end_groups(groups)
            try:
                cluster.stop_cluster_sync()
            except Exception as exc:
                import logging

                logging.getLogger("kdist_magics").debug("stop_cluster: %r", exc)
            end_sync_thread(cluster)
        if self.namespace is not None:
            self.namespace.stop()
            self.namespace = None
        self._pids_started = set()
        self.engines = []
        self._exits.close()
        self._exits = LauncherExits()  # a restarted cluster's engines are new processes

    def restart(self) -> "EngineCluster":
        if not self.owned:
            raise ClusterError(
                "an attached cluster is not kdist's to restart; restart its engines (ipcluster) and run the cell again"
            )
        self.stop()
        self.cluster_id = None
        return self.start()

    def _process_tree_pids(self) -> list[int]:
        """Pids of every process this cluster started (controller, engines, nannies)."""
        facts = self.processes()
        roots = set(facts["launched"]) | ({facts["controller"]} if facts["controller"] else set())
        roots |= {e.pid for e in self.engines} if self.owned else set()
        return sorted(process_tree(roots))

    def node_of(self, engine: EngineInfo) -> str | None:
        """Where a scheduler placed ``engine``, said beside its host (None: nowhere more than the
        host, as here)."""
        return None

    # -- signalling ------------------------------------------------------------
    def signal(self, signum: int, engine_ids: Iterable[int] | None = None) -> None:
        """Send ``signum`` to engines (by pid when local, else through ipyparallel)."""
        wanted = set(e.engine_id for e in self.engines) if engine_ids is None else set(engine_ids)
        remote = []
        for engine in self.engines:
            if engine.engine_id not in wanted:
                continue
            if self._local(engine):
                try:
                    os.kill(engine.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass
            else:
                remote.append(engine.engine_id)
        if remote and self.client is not None:
            try:  # an engine whose host died stays registered until its heartbeat stops and
                # never answers: wait for the answers a while, never for ever
                self.client.send_signal(signum, targets=remote, block=False).result(timeout=SIGNAL_WAIT)
            except Exception:
                pass

    def kill(self, engine_ids: Iterable[int] | None = None) -> None:
        """SIGKILL engines (owned clusters only: never kill somebody else's engines)."""
        if not self.owned:
            self.signal(signal.SIGINT, engine_ids)
            return
        self.signal(signal.SIGKILL, engine_ids)

    def status(self) -> dict[str, Any]:
        if not self.running:
            return {"engines": "not started"}
        facts = {
            "engines": len(self.engines),
            "cluster": self.cluster_id or self.profile,
            "owned": self.owned,
            "hosts": ",".join(sorted({e.hostname for e in self.engines})),
        }
        if self.namespace is not None:  # (its holder's pid and socket folder: cluster.namespace)
            facts["network"] = "private (a network of the engines' own, unreachable to other users)"
        return facts
