"""How processes end: an exit status in words, a process seen ending, and ending a set of
processes by pid."""

from __future__ import annotations

import signal
from typing import Iterable


def describe_exit(code: int | None) -> str:
    """Human words for a process exit status (negative: killed by a signal)."""
    if code is None:
        return "exited (status unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = {
            "SIGKILL": " (killed: out of memory, or kill -9)",
            "SIGSEGV": " (segmentation fault)",
            "SIGABRT": " (aborted)",
        }.get(name, "")
        return f"was killed by {name}{hint}"
    return f"exited with status {code}"


#: ``PF_EXITING`` in ``/proc/PID/stat``'s flags (Linux, include/linux/sched.h)
PF_EXITING = 0x4


def exiting(pid: int, proc: str = "/proc") -> bool:
    """True while a process is being torn down: SIGKILL is pending for it, or it is exiting.

    Its status reads "running" meanwhile, not "zombie": a process as large as an engine with
    PyTorch or TensorFlow loaded takes a tenth of a second or more to end, long enough for
    the next cell to begin on it. Linux only (``proc``: procfs); elsewhere False, and the
    death is seen a moment later.
    """
    kill_bit = 1 << (signal.SIGKILL - 1)
    try:
        with open(f"{proc}/{pid}/stat") as f:
            flags = int(f.read().rsplit(")", 1)[1].split()[6])
        if flags & PF_EXITING:
            return True
        with open(f"{proc}/{pid}/status") as f:
            return any(line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & kill_bit for line in f)
    except (OSError, ValueError, IndexError):
        return False


def kill_pids(pids: Iterable[int], grace: float = 3.0) -> None:
    """End these processes (and only these): SIGTERM, then SIGKILL after ``grace`` s."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
