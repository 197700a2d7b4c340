"""The gradient collective timed where it runs, read by the telemetry (:mod:`.telemetry`).

Where kdist issues the collective itself in Python (its averaged ``fit`` under Keras on
PyTorch), a :class:`CollectiveClock` kept on the optimizer sums the seconds each all-reduce took
on this rank. Horovod's all-reduce runs inside TensorFlow's compiled step, so kdist's Horovod
binding keeps its own sums in TensorFlow variables (``keras_horovod._optimizer``);
:func:`timing` reads whichever the optimizer has. Nothing here imports a framework.
"""

from __future__ import annotations

import sys
import threading

ATTRIBUTE = "_kdist_collective"


class CollectiveClock:
    """Seconds spent in the collective on this rank, and how many collectives."""

    def __init__(self):
        self._lock = threading.Lock()
        self.seconds, self.count = 0.0, 0

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds
            self.count += 1

    def read(self) -> tuple[float, int]:
        with self._lock:
            return self.seconds, self.count

    @classmethod
    def on(cls, optimizer) -> "CollectiveClock":
        """A new clock kept on ``optimizer`` (outside Keras' attribute tracking)."""
        clock = cls()
        object.__setattr__(optimizer, ATTRIBUTE, clock)
        return clock

    @staticmethod
    def off(optimizer) -> None:
        optimizer.__dict__.pop(ATTRIBUTE, None)


def timing(optimizer) -> tuple[float, int] | None:
    """``(seconds, count)`` of the collectives ``optimizer``'s steps ran so far on this rank,
    where they are timed (a clock kdist keeps on it, or kdist's Horovod binding); else None."""
    if optimizer is None:
        return None
    clock = getattr(optimizer, "__dict__", {}).get(ATTRIBUTE)
    if clock is not None:
        return clock.read()
    binding = sys.modules.get("kdist_magics.keras_horovod._optimizer")
    return binding.collective_timing(optimizer) if binding is not None else None
