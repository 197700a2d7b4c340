"""Telemetry: a Keras callback recording per-step and per-epoch logs.

:func:`attached` makes every ``Model.fit`` called inside it carry the
callback, feeding rows to ``sink(kind, row)``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

Sink = Callable[[str, dict[str, Any]], None]


def _number(value: Any):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def make_callback(sink: Sink, rank: int = 0):
    import keras

    class KDistCallback(keras.callbacks.Callback):
        """Sends loss/metrics per step and per epoch to the kdist record."""

        def __init__(self):
            super().__init__()
            self.epoch = 0
            self.step = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            row = {"rank": rank, "epoch": self.epoch, "step": self.step, "batch": batch,
                   "time": time.time(), "kind": "step"}
            row.update({k: _number(v) for k, v in (logs or {}).items()})
            sink("metric", row)

        def on_epoch_end(self, epoch, logs=None):
            row = {"rank": rank, "epoch": epoch, "step": self.step, "time": time.time(), "kind": "epoch"}
            row.update({k: _number(v) for k, v in (logs or {}).items()})
            sink("metric", row)

    return KDistCallback()


@contextlib.contextmanager
def attached(sink: Sink, rank: int = 0):
    """Within the block, ``keras.Model.fit`` gets the kdist callback appended."""
    import keras

    original = keras.Model.fit

    def fit(model, *args, **kwargs):
        callbacks = list(kwargs.pop("callbacks", None) or [])
        callbacks.append(make_callback(sink, rank))
        return original(model, *args, callbacks=callbacks, **kwargs)

    fit.__wrapped__ = original
    fit.__doc__ = original.__doc__
    keras.Model.fit = fit
    try:
        yield
    finally:
        keras.Model.fit = original


@contextlib.contextmanager
def sampling(sink: Sink, rank: int = 0, interval: float = 1.0):
    """Within the block, sample this process's utilisation every ``interval`` s into ``sink``.

    Interim: no sampler yet (the dashboard issue adds CPU, RSS and NVML sampling).
    """
    yield
