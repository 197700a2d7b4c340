"""A process that ends with another: wait for a pid to end (a pidfd where Linux has one), then
end this process's children and itself.

Used by :mod:`.follow` (the controller and engines end with the kernel) and by the private
network's holder (:mod:`.namespace`), which must join its namespaces before any thread starts
and so cannot run under ``follow``.
"""

from __future__ import annotations

import os
import threading

#: every kind of process kdist starts, by the module its command line runs (``python -m ...``):
#: the one list the test suite's session check and ``make test``'s last look read. A new
#: launcher adds its module here; tests/test_leftovers.py fails on a ``python -m`` kdist starts
#: that is missing.
STARTED = {
    "kdist_magics.cluster.follow": "a controller or engine on this host, its children, their guards",
    "kdist_magics.cluster.namespace": "a private network's holder",
    "kdist_magics.cluster.slurm": "a Slurm job's guard, and the engines on the job's nodes",
    "kdist_magics.cluster.ray_actors": "the engines in Ray's actors, on the Ray cluster's nodes",
}


def started_kind(cmdline: list[str]) -> str | None:
    """Which of :data:`STARTED` a process with ``cmdline`` is (its module), or None."""
    return next((m for m in STARTED if m in cmdline), None)


def alive(pid: int, started: float) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_for_exit(pid: int, started: float, every: float = 0.5) -> None:
    """Return once process ``pid`` (created at ``started``) is gone."""
    try:
        import select

        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            if alive(pid, started):  # the fd is the kernel, not a reused pid
                select.select([fd], [], [])
            return
        except OSError:
            pass
        finally:
            os.close(fd)
    while alive(pid, started):
        threading.Event().wait(every)


def end_with(pid: int, started: float) -> threading.Thread:
    """Start the thread that ends this process and its children once ``pid`` is gone."""

    def watch():
        wait_for_exit(pid, started)
        end_children()
        os._exit(0)

    thread = threading.Thread(target=watch, name="kdist-kernel-watch", daemon=True)
    thread.start()
    return thread


def end_children(quiet: float = 0.1, bound: float = 5.0) -> None:
    """Kill this process's children and theirs, again until none has appeared for ``quiet``
    seconds: the main thread may be starting one (an engine its nanny) as the kernel dies."""
    import time

    import psutil

    me = psutil.Process()
    calm_since = time.monotonic()
    deadline = calm_since + bound
    while time.monotonic() < deadline:
        children = [c for c in descendants(me) if _running(c)]
        for child in children:
            try:
                child.kill()
            except psutil.Error:
                pass
        now = time.monotonic()
        if children:
            calm_since = now
        elif now - calm_since >= quiet:
            return
        time.sleep(0.02)


def process_tree(pids) -> set[int]:
    """``pids`` and every process below each of them (:func:`descendants`); a pid already gone
    stays in, with nothing below it."""
    import psutil

    out = set(pids)
    for pid in pids:
        try:
            out |= {p.pid for p in descendants(psutil.Process(pid))}
        except psutil.Error:
            pass
    return out


def led_groups(pids) -> set[int]:
    """The process groups that processes ``pids`` lead (kdist's controller and engines lead
    their own: :func:`kdist_magics.cluster.follow.lead_own_group`), never this process's own."""
    mine = os.getpgid(0)
    out = set()
    for pid in pids:
        try:
            if os.getpgid(pid) == pid != mine:
                out.add(pid)
        except OSError:  # gone
            pass
    return out


def end_groups(pgids) -> None:
    """Kill every process left in process groups ``pgids``: what their leaders forked, found
    even after the leader is gone and even if forked after the tree was read (a controller
    SIGTERM reaches while it starts its schedulers: they stay, orphaned, in its group)."""
    import signal

    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:  # none left (or none of ours)
            pass


def live_in_group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that still run (zombies, killed and not yet
    reaped, left out)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except OSError:
            pass
    return found


def descendants(root) -> list:
    """Every process below ``root``, one level at a time: one that ends while the tree is
    being read drops out alone (psutil's recursive listing gives up on the whole tree)."""
    import psutil

    out, todo = [], [root]
    while todo:
        try:
            kids = todo.pop().children()
        except psutil.Error:
            continue
        out += kids
        todo += kids
    return out


def _running(proc) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE  # killed, not yet reaped: done
    except psutil.Error:
        return False


def remove_segments(of_pid: int | None = None, folder: str = "/dev/shm") -> list[str]:
    """Remove ``--push``'s shared-memory names (``kdist-<kernel pid>-*``) of kernel ``of_pid``,
    or of every kernel that is gone, other than this process; the names removed. A segment's
    memory stays while a process maps it: only its name goes."""
    import glob

    import psutil

    gone = []
    for path in glob.glob(os.path.join(folder, "kdist-*-*")):
        pid = os.path.basename(path).split("-")[1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        if (int(pid) == of_pid) if of_pid is not None else not psutil.pid_exists(int(pid)):
            try:
                os.unlink(path)
                gone.append(os.path.basename(path))
            except OSError:
                pass
    return gone
