"""Horovod on an engine: what the kernel's :class:`~.horovod.HorovodStrategy` runs there.

``hvd_init`` sets a rank's HOROVOD_*/Gloo variables, (re)initialises Horovod and binds
``hvd``; ``hvd_join`` is the same for an engine joining an elastic run under way;
``_watch_abort`` waits on the kernel's abort line ("abort your collectives", or "hosts
added" in an elastic run); ``hvd_shutdown`` ends Horovod after the cell.
These functions travel to the engines by reference (this module is importable there).
"""

from __future__ import annotations

import os
import threading
from typing import Any

#: an elastic run's bound on one Gloo wait: a rank blocked on a peer that is itself stuck in
#: the lost rank's collective notices this late at most (Horovod's default is 30 s)
ELASTIC_GLOO_TIMEOUT = "10"


def elastic_env(env: dict[str, str]) -> dict[str, str]:
    """An elastic rank's variables: ``env`` plus the Gloo wait bound (see ELASTIC_GLOO_TIMEOUT)."""
    timeout = os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", ELASTIC_GLOO_TIMEOUT)
    return {**env, "HOROVOD_GLOO_TIMEOUT_SECONDS": timeout}


#: variables only elastic runs set (removed again on an engine's next non-elastic run)
ELASTIC_VARS = ("HOROVOD_ELASTIC", "HOROVOD_GLOO_TIMEOUT_SECONDS")


def hvd_init(env: dict[str, str], abort: tuple[str, int] | None = None) -> dict[str, Any]:
    """Set this rank's HOROVOD_*/Gloo variables, (re)initialise Horovod, bind ``hvd``.

    ``hvd`` is kdist's Keras-3 Horovod binding (``keras_horovod``, installed so
    ``import horovod.tensorflow.keras as hvd`` resolves to it) when Keras 3 is the
    active Keras; with Keras 2 / tf_keras (``install()`` returns False) it is
    Horovod's own ``horovod.tensorflow.keras``, which works there. ``abort``: the
    kernel's abort line for this run, ``(address, port)`` (see ``_watch_abort``).
    """
    from IPython import get_ipython

    # what a previous (elastic) run set and this one does not: a warm engine whose Horovod
    # was shut down would otherwise take Horovod's elastic re-initialising path
    before = set(_run_hvd.pop("env_set", ()))
    for name in before - set(env):
        os.environ.pop(name, None)
    _run_hvd["env_set"] = [k for k in ELASTIC_VARS if k in env and (k in before or k not in os.environ)]
    os.environ.update(env)
    import horovod.tensorflow as core

    try:
        if core.is_initialized():
            core.shutdown()
    except Exception:
        pass
    from ... import keras_horovod

    if keras_horovod.install():
        hvd = keras_horovod
    else:
        import horovod.tensorflow.keras as hvd  # Keras 2 / tf_keras: Horovod's own module
    hvd.init()
    from .compat_horovod import fresh_traces

    fresh_traces()  # a trace kept from another model would name this run's collectives apart
    if abort is not None:
        _watch_abort(*abort)  # replaces the previous run's watcher
    else:
        _stop_abort_watch()
    shell = get_ipython()
    if shell is not None:
        shell.user_ns["hvd"] = hvd
    from ..frameworks.compat_keras import keras_name_uids

    return {
        "rank": core.rank(),
        "size": core.size(),
        "local_rank": core.local_rank(),
        "binding": hvd.__name__,
        "keras_names": keras_name_uids(),
    }


def warm_imports() -> bool:
    """An engine about to join an elastic run: import what ``hvd_init`` needs now, so that
    joining later is quick (the others wait for it in the rendezvous)."""
    import horovod.tensorflow  # noqa: F401  (TensorFlow too)
    import keras  # noqa: F401

    from ... import keras_horovod

    keras_horovod.install()
    return True


def hvd_join(
    env: dict[str, str], store: tuple[str, int], key: str, abort: tuple[str, int] | None, keras_names: dict | None
) -> dict[str, Any]:
    """Join an elastic run that is under way: ask the kernel's store for this engine's rank
    (the answer comes once every rank of the re-formed job is ready), then ``hvd_init``.
    ``keras_names``: the other ranks' Keras naming counters at the start of the cell, so
    this fresh process names the cell's layers (and Horovod's collectives) as they do."""
    import urllib.request

    if keras_names is not None:
        import keras  # noqa: F401

        from ..frameworks.compat_keras import set_keras_name_uids

        set_keras_name_uids(keras_names)
    url = f"http://{store[0]}:{store[1]}/rank_and_size/{key}"
    if ":" in store[0]:
        url = f"http://[{store[0]}]:{store[1]}/rank_and_size/{key}"
    with urllib.request.urlopen(url, timeout=None) as reply:  # the kernel decides how long
        rank, size, local_rank, local_size, cross_rank, cross_size = reply.read().decode().split(",")
    if int(rank) < 0:
        raise RuntimeError("this engine was not taken into the elastic run")
    env = {
        **env,
        "HOROVOD_RANK": rank,
        "HOROVOD_SIZE": size,
        "HOROVOD_LOCAL_RANK": local_rank,
        "HOROVOD_LOCAL_SIZE": local_size,
        "HOROVOD_CROSS_RANK": cross_rank,
        "HOROVOD_CROSS_SIZE": cross_size,
    }
    return hvd_init(env, abort)


def _watch_abort(address: str, port: int) -> None:
    """Wait on the kernel's abort line (``rendezvous.AbortLine``); on "abort", shut Horovod down.

    A rank blocked in a collective whose peer raised or was interrupted never returns
    to Python, so neither an exception nor SIGINT reaches it. Horovod's shutdown is
    coordinated by the background threads of all ranks (still alive), and ends every
    pending collective with an error: the cell fails on this rank and the engine stays
    warm. The watcher blocks in ``recv`` (no polling while training runs); the kernel
    hanging up, or :func:`_stop_abort_watch`, ends it.
    """
    import socket

    _stop_abort_watch()
    sock = socket.create_connection((address, port), timeout=30)
    sock.settimeout(None)
    stop = threading.Event()

    def watch():
        while True:
            try:
                told = sock.recv(1)
            except OSError:
                told = b""
            if told == HOSTS_ADDED and not stop.is_set():
                # an elastic run takes in a new engine: interrupt at the next commit
                from ...keras_horovod import elastic

                elastic.hosts_added()
                continue
            if told and not stop.is_set():
                hvd_shutdown(_from_watch=True)
            return

    thread = threading.Thread(target=watch, name="kdist-abort-watch", daemon=True)
    _run_hvd["abort"] = (stop, thread, sock)
    thread.start()


HOSTS_ADDED = b"+"  # what the abort line says when an elastic run takes in engines


def _stop_abort_watch() -> None:
    import socket

    stop, thread, sock = _run_hvd.pop("abort", (None, None, None))
    if stop is None:
        return
    stop.set()
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked recv
    except OSError:
        pass
    sock.close()
    if thread is not threading.current_thread():
        thread.join(timeout=2)


_run_hvd: dict[str, Any] = {}


def hvd_shutdown(_from_watch: bool = False) -> None:
    import sys

    if not _from_watch:
        _stop_abort_watch()
    core = sys.modules.get("horovod.tensorflow")
    if core is not None:
        try:
            if core.is_initialized():
                core.shutdown()
        except Exception:
            pass
