"""Stop during an in-kernel ``fit`` stops it, every time.

The Stop button sends SIGINT; Python raises ``KeyboardInterrupt`` wherever the main thread is
between bytecodes. When that is inside a ``__del__`` (TensorFlow's
``ConcreteFunctionGarbageCollector.__del__`` runs often during ``fit``), Python prints
"Exception ignored in: ..." and goes on: the interrupt is lost and training runs to its last
epoch (1 in 4 Stops during a ``mirrored`` fit). Within :func:`stop_reaches_fit`
a SIGINT is also remembered, and every ``fit`` carries a callback that raises
``KeyboardInterrupt`` at the next batch once one has come: an interrupt that was lost is
raised again where it cannot be.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator


@contextlib.contextmanager
def stop_reaches_fit() -> Iterator[dict]:
    """Within the block (on the main thread, with Keras loaded): a SIGINT stops every ``fit``
    at its next batch even where the ``KeyboardInterrupt`` it raised was swallowed."""
    keras = sys.modules.get("keras")
    if keras is None or threading.current_thread() is not threading.main_thread():
        yield {"asked": False}
        return
    asked = {"asked": False}
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        asked["asked"] = True
        if callable(previous):
            previous(signum, frame)  # the default raises KeyboardInterrupt (--timeout's: its own)
        raise KeyboardInterrupt

    class StopAsked(keras.callbacks.Callback):
        def _check(self, *_args, **_kwargs):
            if asked["asked"]:
                raise KeyboardInterrupt

        on_train_batch_end = on_test_batch_end = on_predict_batch_end = on_epoch_end = _check

    original = keras.Model.fit

    def fit(model, *args, **kwargs):
        __tracebackhide__ = True  # not in the user's traceback
        callbacks = [*list(kwargs.pop("callbacks", None) or []), StopAsked()]
        return original(model, *args, callbacks=callbacks, **kwargs)

    fit.__wrapped__ = original
    fit.__doc__ = original.__doc__
    signal.signal(signal.SIGINT, on_sigint)
    keras.Model.fit = fit
    try:
        yield asked
    finally:
        keras.Model.fit = original
        signal.signal(signal.SIGINT, previous)
