"""TPU session hygiene: what to say, before a TPU cell runs, when the TPU cannot be had.

libtpu lets one process use a host's TPU at a time. A kernel that crashed (or another notebook)
may still hold it: the next process to start on the TPU then fails deep in libtpu ("TPU
initialization failed: open(/dev/accel0): Device or resource busy", or it waits on libtpu's lock
file, jax-ml/jax#10192). :func:`held_by` finds the other process that has libtpu's lock file or
a TPU device file open, so every strategy that takes the TPU in the kernel (``tpu``, and
``default``, which ``auto`` picks on Colab's one chip) names it, and the fix, in one line
(:func:`refuse_if_held`).
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


def refuse_if_held(find=None, strategy: str = "tpu", started=None) -> None:
    """Before this process first takes a TPU of this host: raise ``StrategyUnavailable``
    naming another process that holds it (pid, command, the fix). Nothing where there is no
    local TPU, or where ``started()`` says this process has taken it already (default: its
    JAX has started its backend, so it holds the TPU itself, or runs on another platform)."""
    from ...hardware import detect_tpu

    tpu = (find or detect_tpu)()
    if tpu is None or tpu.target != "local" or (started or backend_started)():
        return
    holder = held_by(tpu_paths(tpu.found_by))
    if holder is not None:
        from ... import errors

        raise errors.tpu_held(*holder, strategy=strategy)


#: what a cell calls to join a multi-host JAX job (keras.distribution.initialize wraps JAX's)
INITIALIZERS = ("jax.distributed.initialize", "keras.distribution.initialize")


def calls_initialize(code: str) -> str | None:
    """The multi-host initializer ``code`` calls (``jax.distributed.initialize``, or Keras' own
    wrapper of it), or None. ``code`` is Python (a cell already turned from IPython syntax)."""
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None  # the cell's own error comes when it runs
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = dotted(node.func)
            for full in INITIALIZERS:  # the whole name, or its tail from a dot on
                if name and name.count(".") >= 1 and (full == name or full.endswith("." + name)):
                    return full
    return None


def dotted(node) -> str | None:
    """``a.b.c`` for an attribute chain (``distributed.initialize`` if imported ``from jax``)."""
    import ast

    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def backend_started() -> bool:
    """Has JAX started its backend in this process (any computation, jax.devices(), ...)? Never
    imports JAX: a kernel that has not imported it has not started it."""
    import sys

    if "jax" not in sys.modules:
        return False
    try:  # JAX 0.4.x-0.8: the one public-ish question; absent elsewhere, assume not
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return False


def joined() -> bool:
    """Has this process already joined a multi-host JAX job (jax.distributed.initialize ran)?"""
    import sys

    if "jax" not in sys.modules:
        return False
    try:
        return bool(sys.modules["jax"].distributed.is_initialized())
    except AttributeError:  # JAX before 0.4.32 has no is_initialized
        return False


def refuse_late_initialize(code: str, strategy: str) -> None:
    """Before a cell runs in the kernel: one that joins a multi-host JAX job
    (``jax.distributed.initialize``) once JAX has started, or once ``strategy`` will start it to
    find the devices, is one line, and nothing runs. ``code``: the cell as Python."""
    from ...errors import initialize_again, initialize_too_late
    from ..frameworks.backends import keras_backend

    call = calls_initialize(code)
    if call is None:
        return
    if joined():
        raise initialize_again(call)
    if backend_started():
        why = "it has started in this kernel (an earlier cell used JAX or Keras on JAX)"
    elif keras_backend() == "jax" and strategy != "default":
        why = f"--strategy {strategy} starts it to find the devices before the cell runs"
    else:
        return
    raise initialize_too_late(call, why)
