"""How processes end: an exit status in words, and ending a set of processes by pid."""

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
        hint = {"SIGKILL": " (killed: out of memory, or kill -9)", "SIGSEGV": " (segmentation fault)",
                "SIGABRT": " (aborted)"}.get(name, "")
        return f"was killed by {name}{hint}"
    return f"exited with status {code}"


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
