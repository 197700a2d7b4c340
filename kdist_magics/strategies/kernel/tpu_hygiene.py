"""TPU session hygiene: what to say, before a TPU cell runs, when the TPU cannot be had.

libtpu lets one process use a host's TPU at a time. A kernel that crashed (or another notebook)
may still hold it: the next process to start on the TPU then fails deep in libtpu ("TPU
initialization failed: open(/dev/accel0): Device or resource busy", or it waits on libtpu's lock
file, jax-ml/jax#10192). :func:`held_by` finds the other process that has libtpu's lock file or
a TPU device file open, so ``--strategy tpu`` can name it, and the fix, in one line.
"""

from __future__ import annotations

import os

#: libtpu's lock file (libtpu 0.0.x: one process per host holds it while it uses the TPU)
LIBTPU_LOCK = "/tmp/libtpu_lockfile"


def tpu_paths(found_by: str = "") -> list[str]:
    """What a process using this host's TPU holds open: libtpu's lock file and the device files."""
    import glob

    devices = sorted(glob.glob("/dev/accel[0-9]*")) + sorted(glob.glob("/dev/vfio/[0-9]*"))
    extra = [found_by] if found_by.startswith("/dev/") else []
    return [LIBTPU_LOCK, *dict.fromkeys(extra + devices)]


def held_by(paths: list[str], me: int | None = None) -> tuple[int, str] | None:
    """``(pid, command line)`` of another process that has one of ``paths`` open, or None."""
    import psutil

    me = os.getpid() if me is None else me
    wanted = {os.path.realpath(p) for p in paths if os.path.exists(p)}
    if not wanted:
        return None
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.info["pid"] == me:
            continue
        fd_dir = f"/proc/{proc.info['pid']}/fd"
        try:
            targets = {os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)}
        except OSError:  # gone, or another user's
            continue
        if targets & wanted:
            return proc.info["pid"], " ".join(proc.info["cmdline"] or [])[:120]
    return None
