"""ipyparallel engines as worker processes: start or attach, watch, signal, stop.

Nothing here knows about Horovod or TensorFlow. An :class:`EngineCluster` is
either *owned* (kdist started it: a local controller and N engines, every
socket on loopback) or *attached* (``--cluster-id`` / ``--profile``: somebody
else's cluster, which kdist connects to and never stops or kills).

Engines are reported in engine-id order as :class:`EngineInfo` (engine id, pid,
hostname). Death is detected by polling the engine processes (owned, or
attached engines on this host) and by ipyparallel's own unregistration
(engines elsewhere), so a dead engine is noticed within a poll interval rather
than when a collective times out.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .compat_ipyparallel import LauncherExits, end_sync_thread
from .errors import ClusterError
from .exits import describe_exit, kill_pids
from .faults import hold


@dataclass(frozen=True)
class EngineInfo:
    engine_id: int
    pid: int
    hostname: str


def _identify():  # runs on an engine
    import os
    import socket

    return os.getpid(), socket.gethostname()


def _following(controller_nice: int = 0):
    """Launcher configuration: an owned cluster's controller and engines start through
    :mod:`kdist_magics.follow`, so they (and their nannies and schedulers) end with this
    kernel from their first instant, even while they are still starting."""
    from traitlets.config import Config

    from .follow import command

    config = Config()
    config.LocalControllerLauncher.controller_cmd = command("ipyparallel.controller",
                                                            nice=controller_nice)
    config.LocalEngineLauncher.engine_cmd = command("ipyparallel.engine")
    config.LocalEngineSetLauncher.engine_cmd = command("ipyparallel.engine")
    return config


#: seconds a local engine may stay stopped (SIGSTOP, a debugger) before kdist ends it
FROZEN_AFTER = 10.0


class EngineCluster:
    """A set of ipyparallel engines used as ranks.

    ``n``: engines to start (owned) or to wait for (attached).
    ``cluster_id`` / ``profile``: attach instead of starting.
    ``ip``: where an owned controller listens (loopback unless configured).
    """

    def __init__(self, n: int, cluster_id: str | None = None, profile: str | None = None,
                 ip: str = "127.0.0.1", start_timeout: float = 120.0, controller_nice: int = 0):
        self.n = n
        self.controller_nice = controller_nice  # an owned controller runs this much nicer
        self.attached = cluster_id is not None or profile is not None
        self.cluster_id = cluster_id
        self.profile = profile
        self.ip = ip
        self.start_timeout = start_timeout
        self.cluster = None  # ipyparallel.Cluster when owned
        self.client = None
        #: called with the number of engines registered so far while :meth:`start` waits
        self.on_registered: Callable[[int], None] | None = None
        self.engines: list[EngineInfo] = []
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
    def running(self) -> bool:
        return self.client is not None

    def start(self) -> "EngineCluster":
        """Start (owned) or connect (attached) and learn every engine's pid and host."""
        import ipyparallel as ipp

        if self.running:
            return self
        self._stopped_since.clear()
        self._ended_why.clear()
        try:
            if self.owned:
                self.cluster_id = self.cluster_id or f"kdist-{uuid.uuid4().hex[:10]}"
                self.cluster = ipp.Cluster(n=self.n, cluster_id=self.cluster_id, controller_ip=self.ip,
                                           log_level=40, shutdown_atexit=True, config=_following(self.controller_nice))
                self.cluster.start_controller_sync()
                self._exits.attach(self.cluster)  # the controller's exit is known at once
                hold("controller", self)
                self.cluster.start_engines_sync()
                self._exits.attach(self.cluster)  # engine exits are known at once from here on
                self._pids_started |= set(self._launched())  # (a stopped launcher leaves its set)
                hold("engines", self)
                self.client = self.cluster.connect_client_sync()
            else:
                kwargs: dict[str, Any] = {}
                if self.cluster_id is not None:
                    kwargs["cluster_id"] = self.cluster_id
                if self.profile is not None:
                    kwargs["profile"] = self.profile
                self.client = ipp.Client(**kwargs)
                self._theirs = self._their_controller()
            self._wait_for_engines()
            self.client.wait_for_engines(self.n, timeout=self.start_timeout, interactive=False)
        except KeyboardInterrupt:
            self.stop()  # interrupted while starting: leave nothing half-started behind
            raise
        except Exception as exc:
            where = ("the local cluster" if self.owned else
                     f"cluster {self.cluster_id or ''!s} (profile {self.profile or 'default'})")
            gone = self.controller_gone() if self.owned and not isinstance(exc, ClusterError) else None
            self.stop()
            why = str(exc) if isinstance(exc, ClusterError) else f"{type(exc).__name__}: {exc}"
            if gone:  # ipyparallel's words for it name a status code
                why = f"the controller {gone} while the cluster started"
            raise ClusterError(f"could not start {where} with {self.n} engines: {why}") from exc
        self.starts += 1
        self._identify()
        if self.owned and not getattr(self, "_atexit", False):
            # kernel shutdown: stop what we started even if nobody called %kdist stop
            import atexit
            import weakref

            ref = weakref.ref(self)
            atexit.register(lambda: ref() is not None and ref().stop())
            self._atexit = True
        return self

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
            trouble = (self._starting_trouble() if self.owned else
                       (gone := self.controller_gone()) and f"its controller {gone} while the engines registered")
            if trouble:
                raise ClusterError(trouble)
            time.sleep(every)

    def _starting_trouble(self) -> str | None:
        """Why an owned cluster's engines will never all register: its controller ended, or an
        engine ended (or stayed stopped for ``FROZEN_AFTER`` s, and was ended) before it did."""
        import psutil

        if gone := self.controller_gone():
            return f"the controller {gone} while the engines registered"
        now = time.monotonic()
        for pid in sorted(self._pids_started):
            try:
                status = psutil.Process(pid).status()
            except psutil.NoSuchProcess:
                status = psutil.STATUS_ZOMBIE
            if status != psutil.STATUS_ZOMBIE:
                self._watch_frozen(pid, status, now)
                continue
            how = self._ended_why.get(pid) or describe_exit(self.exit_status(EngineInfo(-1, pid, "")))
            return f"an engine (pid {pid}) {how} before it registered"
        return None

    def _their_controller(self) -> tuple[int, float] | None:
        """An attached cluster's controller when it runs on this host (pid, start time), found
        by the address its connection file names: kdist watches it as it watches its own (never
        signalling it). A local address where nothing listens is a controller that is not
        running: say so now rather than wait out the start bound for its engines."""
        import psutil

        from .compat_ipyparallel import registration_url
        from .peers import listener

        url = registration_url(self.client)
        pid = listener(url) if url else None
        if pid == 0:
            raise ClusterError(f"its controller is not running: nothing listens on {url}, the address in "
                               f"its connection file; start the cluster again")
        try:
            return (pid, psutil.Process(pid).create_time()) if pid else None
        except psutil.Error:
            return None

    def _launched(self) -> list[int]:
        """Pids of the engines an owned cluster's launchers started."""
        return [launcher.pid for engine_set in getattr(self.cluster, "engines", {}).values()
                for launcher in getattr(engine_set, "launchers", {}).values()
                if (getattr(launcher, "pid", None) or -1) > 0]

    def processes(self) -> dict[str, Any]:
        """Pids so far: an owned cluster's ``controller`` (None when attached or not started),
        the engines its launchers started (``launched``), and the registered ``engines``."""
        pid = getattr(getattr(self.cluster, "controller", None), "pid", None)
        return {"controller": pid if (pid or -1) > 0 else None, "launched": self._launched(),
                "engines": [e.pid for e in self.engines]}

    def _identify(self) -> None:
        ids = sorted(self.client.ids)[: self.n]
        if len(ids) < self.n:
            raise ClusterError(f"{self.n} engines wanted, {len(ids)} registered")
        try:
            found = self.client[ids].apply_async(_identify).get(timeout=60)
        except Exception as exc:  # a stopped engine stays registered until its heartbeat stops
            raise ClusterError(f"the engines did not answer within 60 s ({type(exc).__name__}); is "
                               f"one of them stopped or busy?") from exc
        self.engines = [EngineInfo(eid, pid, host) for eid, (pid, host) in zip(ids, found)]
        if self.owned:
            self._pids_started |= {e.pid for e in self.engines}
            self._pids_started |= set(self._process_tree_pids())

    def view(self, engine_ids: Iterable[int] | None = None):
        ids = [e.engine_id for e in self.engines] if engine_ids is None else list(engine_ids)
        return self.client[ids]

    def stop(self) -> None:
        """Disconnect; for an owned cluster stop controller and engines and reap every process."""
        client, self.client = self.client, None
        cluster, self.cluster = self.cluster, None
        self._theirs = None
        tree = self._process_tree_pids() if cluster is not None else []
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
            try:
                cluster.stop_cluster_sync()
            except Exception as exc:
                import logging

                logging.getLogger("kdist_magics").debug("stop_cluster: %r", exc)
            end_sync_thread(cluster)
        self._pids_started = set()
        self.engines = []
        self._exits.close()
        self._exits = LauncherExits()  # a restarted cluster's engines are new processes

    def restart(self) -> "EngineCluster":
        if not self.owned:
            raise ClusterError("an attached cluster is not kdist's to restart; restart its engines "
                               "(ipcluster) and run the cell again")
        self.stop()
        self.cluster_id = None
        return self.start()

    def _process_tree_pids(self) -> list[int]:
        """Pids of every process this cluster started (controller, engines, nannies)."""
        import psutil

        facts = self.processes()
        roots = set(facts["launched"]) | ({facts["controller"]} if facts["controller"] else set())
        roots |= {e.pid for e in self.engines} if self.owned else set()
        pids = set(roots)
        for pid in roots:
            try:
                pids |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
            except psutil.Error:
                pass
        return sorted(pids)


    # -- watching and signalling ---------------------------------------------
    def _local(self, engine: EngineInfo) -> bool:
        return self.owned or engine.hostname == socket.gethostname()

    def exit_status(self, engine: EngineInfo) -> int | None:
        """Exit status of a dead engine this kernel started, when known."""
        if self.cluster is None:
            return None
        codes = self._exits.codes
        deadline = time.monotonic() + 2.0  # the launcher's watcher thread reports within ms
        while True:
            if engine.pid in codes:  # recorded by on_stop (LauncherExits)
                return codes[engine.pid]
            ours = False
            for engine_set in getattr(self.cluster, "engines", {}).values():
                for launcher in getattr(engine_set, "launchers", {}).values():
                    if getattr(launcher, "pid", None) == engine.pid:
                        ours = True
                        data = getattr(launcher, "stop_data", None)
                        if data is not None:
                            return data.get("exit_code")
            if not (ours or engine.pid in self._pids_started) or time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def dead(self, settle: bool = False) -> dict[int, str]:
        """Engines that are gone: ``{engine_id: 'exited with status 3'}`` (empty when all live).

        ``settle``: while an engine is seen stopped, look again until it runs again or is ended
        (at most ``FROZEN_AFTER`` s): used between runs, so that a stopped engine costs the next
        run a restart instead of a frozen rank.

        A local engine that stays stopped (SIGSTOP, or held by a debugger) for
        ``FROZEN_AFTER`` seconds is ended with SIGKILL, since its peers wait for it in their
        collectives for ever: it then reads as dead, "was stopped ... kdist ended it". An engine
        on another host that freezes stops answering ipyparallel's heartbeat and is
        unregistered (by default after 10 missed beats of 3 s).
        """
        import psutil

        if settle:
            deadline = time.monotonic() + FROZEN_AFTER + 1.0
            while not (out := self.dead()) and self._stopped_since and time.monotonic() < deadline:
                time.sleep(0.2)
            return out
        out: dict[int, str] = {}
        registered = set(self.client.ids) if self.client is not None else set()
        now = time.monotonic()
        for engine in self.engines:
            gone = False
            if self._local(engine):
                try:
                    proc = psutil.Process(engine.pid)
                    status = proc.status()
                    self._watch_frozen(engine.pid, status, now)
                    # an attached engine stopped too long counts as lost (it is not ended)
                    gone = status == psutil.STATUS_ZOMBIE or (self.attached and engine.pid in self._ended_why)
                except psutil.NoSuchProcess:
                    gone = True
            elif engine.engine_id not in registered:
                gone = True
            if gone:
                out[engine.engine_id] = self._ended_why.get(engine.pid) or self._gone_words(engine)
        return out

    def _gone_words(self, engine: EngineInfo) -> str:
        if self.owned:
            return describe_exit(self.exit_status(engine))
        if not self._local(engine):  # frozen (no heartbeat), ended, or cut off: it cannot be told
            return (f"on {engine.hostname} left the cluster (its controller unregistered it: it ended, "
                    f"or stopped answering ipyparallel's heartbeat)")
        return f"has ended (pid {engine.pid}; kdist did not start it, so its exit status is not known here)"

    def controller_gone(self) -> str | None:
        """How the controller of an owned cluster ended ("was killed by SIGKILL"), or None
        while it runs; for an attached cluster whose controller runs on this host, "has ended
        (pid N)" once it has (its exit status is its starter's to know); None for one elsewhere."""
        import psutil

        if self.attached:
            from .follow import alive

            theirs = self._theirs
            return None if theirs is None or alive(*theirs) else f"has ended (pid {theirs[0]}, on this host)"
        controller = getattr(self.cluster, "controller", None) if self.owned else None
        pid = getattr(controller, "pid", -1) if controller is not None else -1
        if pid is None or pid <= 0:
            return None
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return None
        except psutil.NoSuchProcess:
            pass
        deadline = time.monotonic() + 2.0  # its launcher's watcher reports the code within ms
        while pid not in self._exits.codes and time.monotonic() < deadline:
            time.sleep(0.02)
        if pid in self._exits.codes:
            return describe_exit(self._exits.codes[pid])
        process = getattr(controller, "process", None)  # the launcher's process, when local
        try:
            code = process.wait(timeout=0.5) if process is not None else None
        except Exception:
            code = None
        return describe_exit(code)

    def _watch_frozen(self, pid: int, status: str, now: float) -> None:
        """End a local engine (``pid``) seen stopped for ``FROZEN_AFTER`` s, remembering why."""
        import psutil

        if status not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            self._stopped_since.pop(pid, None)
            return
        since = self._stopped_since.setdefault(pid, now)
        if now - since >= FROZEN_AFTER and pid not in self._ended_why:
            how = "SIGSTOP" if status == psutil.STATUS_STOPPED else "a debugger"
            if not self.owned:  # never end an engine kdist did not start: it counts as lost
                self._ended_why[pid] = (
                    f"has been stopped ({how}) for {FROZEN_AFTER:.0f} s while its peers waited for "
                    f"it (kdist does not end engines it did not start: kill -CONT {pid}, or restart "
                    f"the cluster's engines)")
                return
            self._ended_why[pid] = (f"was stopped ({how}) for {FROZEN_AFTER:.0f} s while its peers "
                                    f"waited for it; kdist ended it")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

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
            try:
                self.client.send_signal(signum, targets=remote, block=True)
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
        return {"engines": len(self.engines), "cluster": self.cluster_id or self.profile,
                "owned": self.owned, "hosts": ",".join(sorted({e.hostname for e in self.engines}))}
