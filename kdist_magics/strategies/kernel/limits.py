"""``--timeout`` and ``--checkpoint`` for cells that run in the notebook's own kernel
(``default``, ``mirrored``, ``tpu``, and Keras on JAX in the kernel), so each option means
there what it means on engines.

``--timeout SECONDS``: when the cell is still running after SECONDS, kdist interrupts it as
the Stop button would (SIGINT to the kernel's main thread, which also wakes a ``sleep`` or a
blocking read), but the exception the cell sees is :class:`CellTimeout`, so it is named as a
timeout, not as an interrupt. The run's status is ``timeout``; what the cell made before
stays in the notebook, and the kernel takes the next cell as usual. An interrupt lands
between Python bytecodes: a single long call into native code (one training step) ends first.

``--checkpoint DIR``: every ``fit`` in the cell saves the model to ``DIR/last.keras`` after
each epoch, atomically, with the same callback engine ranks use (rank 0 there; the kernel is
the only process here).
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
import time
from typing import Iterator

from ...errors import CellFailed


def _timeout_words(seconds: float) -> str:
    from ...messages import cell_timed_out

    return cell_timed_out(seconds)


class CellTimeout(KeyboardInterrupt):
    """Raised inside an in-kernel cell when its ``--timeout`` passes (an interrupt, named)."""

    def __init__(self, seconds: float):
        super().__init__(_timeout_words(seconds))
        self.seconds = seconds

    def _render_traceback_(self):
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class KernelRunTimedOut(CellFailed):
    """The ``%%kdist`` cell's error after a :class:`CellTimeout`: already shown, status timeout."""

    status = "timeout"


class _Limit:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.lock = threading.Lock()
        self.armed = True
        self.fired = False
        self.delivered = threading.Event()


def _async_raise(thread_id: int, seconds: float) -> None:
    """Raise CellTimeout in another thread (a cell not on the main thread: no signal there)."""
    exc = type("CellTimeoutAfter", (CellTimeout,), {"__init__": lambda self: CellTimeout.__init__(self, seconds)})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc))


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[_Limit | None]:
    """Interrupt the code inside with :class:`CellTimeout` once ``seconds`` have passed."""
    if not seconds:
        yield None
        return
    limit = _Limit(seconds)
    here = threading.current_thread()
    on_main = here is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main else None

    def on_sigint(signum, frame):
        if not limit.fired:  # the user's own interrupt (the Stop button)
            raise KeyboardInterrupt
        limit.delivered.set()
        if limit.armed:
            raise CellTimeout(seconds)

    def fire():
        with limit.lock:
            if not limit.armed:
                return
            limit.fired = True
        if on_main:
            signal.pthread_kill(here.ident, signal.SIGINT)
        else:
            _async_raise(here.ident, seconds)
            limit.delivered.set()

    if on_main:
        signal.signal(signal.SIGINT, on_sigint)
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield limit
    finally:
        with limit.lock:
            limit.armed = False
        timer.cancel()
        if on_main:
            _settle(limit)
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def _settle(limit: _Limit) -> None:
    """A timeout signal sent just as the cell ended reaches our handler, not the previous one."""
    if limit.fired:
        deadline = time.monotonic() + 2.0
        while not limit.delivered.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler runs between bytecodes of this loop


def timed_out(error: BaseException | None, limit: _Limit | None) -> KernelRunTimedOut | None:
    """The error to raise for a cell that ended with ``error`` under ``limit``, when that
    error is its timeout (also when the cell caught CellTimeout and raised something else)."""
    if limit is None or not limit.fired or error is None:
        return None
    failure = KernelRunTimedOut(error)
    failure.args = (_timeout_words(limit.seconds),)
    return failure


@contextlib.contextmanager
def checkpoint_each_epoch(directory: str | None) -> Iterator[None]:
    """Every ``fit`` inside saves the model to ``directory/last.keras`` after each epoch."""
    if not directory:
        yield
        return
    from ...rank.lifecycle import _checkpointing

    with _checkpointing(directory):
        yield
