"""Whether a cluster's processes are alive: the watching half of :class:`~.cluster.EngineCluster`.

Death is detected by polling the engine processes (owned, or attached engines on this host)
and by ipyparallel's own unregistration (engines elsewhere), so a dead engine is noticed
within a poll interval rather than when a collective times out. A local engine stopped
(SIGSTOP, a debugger) for :data:`FROZEN_AFTER` seconds is ended when kdist started it, and
counts as lost otherwise. The controller is watched too: an owned cluster's through its
launcher, an attached cluster's, when it runs on this host, through the process listening on
its registration address.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from ..errors import ClusterError
from .exits import describe_exit, exiting

#: seconds a local engine may stay stopped (SIGSTOP, a debugger) before kdist ends it
FROZEN_AFTER = 10.0


def _ended(pid: int, status: str) -> bool:
    """A process whose status reads ``status`` has ended: a zombie, or being torn down."""
    import psutil

    return status == psutil.STATUS_ZOMBIE or exiting(pid)


@dataclass(frozen=True)
class EngineInfo:
    engine_id: int
    pid: int
    hostname: str
    machine: str = ""  # :func:`~.machine.machine_id` as the engine reported it


class Liveness:
    """Mixed into :class:`~.cluster.EngineCluster`, whose state it reads: ``engines``,
    ``client``, ``cluster``, ``owned``/``attached``, ``_exits``, ``_pids_started``,
    ``_stopped_since``, ``_ended_why``, ``_theirs`` and ``namespace``."""

    def _starting_trouble(self) -> str | None:
        """Why the engines will never all register: the controller ended (an attached cluster's,
        when it runs on this host, too), or an engine of an owned cluster ended (or stayed
        stopped for ``FROZEN_AFTER`` s, and was ended) before it did."""
        import psutil

        if gone := self.controller_gone():
            return f"{'the' if self.owned else 'its'} controller {gone} while the engines registered"
        if not self.owned:
            return None
        now = time.monotonic()
        for pid in sorted(self._pids_started):
            try:
                status = psutil.Process(pid).status()
            except psutil.NoSuchProcess:
                status = psutil.STATUS_ZOMBIE
            if not _ended(pid, status):
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
            raise ClusterError(
                f"its controller is not running: nothing listens on {url}, the address in "
                f"its connection file; start the cluster again"
            )
        try:
            return (pid, psutil.Process(pid).create_time()) if pid else None
        except psutil.Error:
            return None

    def _local(self, engine: EngineInfo) -> bool:
        from .machine import same_machine

        return self.owned or same_machine(engine)

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
                    gone = _ended(engine.pid, status) or (self.attached and engine.pid in self._ended_why)
                except psutil.NoSuchProcess:
                    gone = True
            elif engine.engine_id not in registered:
                gone = True
            if gone:
                out[engine.engine_id] = self._ended_why.get(engine.pid) or self._gone_words(engine)
        return out

    def why_restart(self) -> str | None:
        """Why this running cluster cannot take the next run as it is (an engine died, the
        controller died, the private network's holder ended), or None when it can."""
        if self.dead(settle=True):
            return "an engine died"
        if self.controller_gone():
            return "the controller died"
        if getattr(self.namespace, "gone", False):
            return "the private network's holder ended"
        return None

    def _gone_words(self, engine: EngineInfo) -> str:
        if self.owned:
            return describe_exit(self.exit_status(engine))
        if not self._local(engine):  # frozen (no heartbeat), ended, or cut off: it cannot be told
            return (
                f"on {engine.hostname} left the cluster (its controller unregistered it: it ended, "
                f"or stopped answering ipyparallel's heartbeat)"
            )
        return f"has ended (pid {engine.pid}; kdist did not start it, so its exit status is not known here)"

    def controller_gone(self) -> str | None:
        """How the controller of an owned cluster ended ("was killed by SIGKILL"), or None
        while it runs; for an attached cluster whose controller runs on this host, "has ended
        (pid N)" once it has (its exit status is its starter's to know); None for one elsewhere."""
        import psutil

        if self.attached:
            from .lifetime import alive

            theirs = self._theirs
            return None if theirs is None or alive(*theirs) else f"has ended (pid {theirs[0]}, on this host)"
        controller = getattr(self.cluster, "controller", None) if self.owned else None
        pid = getattr(controller, "pid", -1) if controller is not None else -1
        if pid is None or pid <= 0:
            return None
        try:
            if not _ended(pid, psutil.Process(pid).status()):
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
                    f"the cluster's engines)"
                )
                return
            self._ended_why[pid] = (
                f"was stopped ({how}) for {FROZEN_AFTER:.0f} s while its peers waited for it; kdist ended it"
            )
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
