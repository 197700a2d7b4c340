"""A probe's steps (``%kdist scale``): ``fit`` stops after a set number of steps on every rank
alike, and each rank times every step itself.

:class:`StepProbe` is a Keras callback that ``telemetry.attached(stop_after=N)`` adds to every
``fit``. It is deliberately *not* ``async_safe``: Keras then runs batch-end callbacks on the
training thread (JAX included), so every rank stops after exactly the same step (a rank that
stopped one step later would wait in a collective forever) and each step's end is its real end.
It times each step from batch begin to batch end (the step: forward, backward, the gradient
collective, the update) and from one batch begin to the next (the period; the difference is
the rest: input, callbacks). The first :data:`WARMUP` steps (compilation, first allocations)
are left out. At the end it sends one row, ``kind: "probe"``, with the medians.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

#: steps left out at the start of a probe (tracing and compilation, first allocations)
WARMUP = 3


class StepProbe:
    """Times each step and stops the ``fit`` after ``stop_after`` steps (see the module doc)."""

    kdist_probe = True

    def __init__(
        self, sink: Callable[[str, dict[str, Any]], None], rank: int, stop_after: int, batch_size: int | None, clock
    ):
        super().__init__()
        self.sink, self.rank, self.stop_after = sink, rank, stop_after
        self.batch_size, self.clock = batch_size, clock
        self.begins: list[float] = []
        self.ends: list[float] = []
        self.sent = False

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(self.clock())

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(self.clock())
        if len(self.ends) >= self.stop_after:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        if not self.sent:
            self.sent = True
            row = self.row()
            row["link"] = cells_own_link(row["grad_bytes"], self.model)
            self.sink("metric", row)

    def row(self) -> dict[str, Any]:
        """Medians over the steps after the warm-up: seconds in a step, seconds a step takes
        from begin to begin (its period), and the rest between steps."""
        n = min(len(self.begins), len(self.ends))
        steps = [self.ends[i] - self.begins[i] for i in range(WARMUP, n)]
        periods = [self.begins[i + 1] - self.begins[i] for i in range(WARMUP, n - 1)]
        step = statistics.median(steps) if steps else None
        period = statistics.median(periods) if periods else None
        rest = max(period - step, 0.0) if step is not None and period is not None else None
        return {
            "rank": self.rank,
            "kind": "probe",
            "steps": n,
            "measured_steps": len(steps),
            "step_s": step,
            "period_s": period,
            "rest_s": rest,
            "batch_size": self.batch_size,
            "grad_bytes": gradient_bytes(self.model),
        }


def cells_own_link(grad_bytes: int | None, model=None) -> dict[str, Any] | None:
    """The link timed with the cell's own collective where kdist can reach it at the end of a
    probed fit, every rank alike: Horovod's all-reduce, ``torch.distributed``'s where the
    torch processes' group is up, XLA's across the processes ``jax.distributed`` joined, or
    the fitted ``model``'s own ``MultiWorkerMirroredStrategy``'s (:mod:`kdist_magics.scale.collectives`);
    None elsewhere, and never an error that ends the run."""
    from functools import partial

    from ..scale import collectives as own

    timings = (own.horovod_link, own.torch_link, own.jax_link, partial(own.tf_link, model=model))
    for timing in timings:  # each None where its collective is not up
        try:
            timed = timing(grad_bytes or 0)
        except Exception:  # the probe's own figures are sent all the same; the kernel times the ring
            return None
        if timed is not None:
            return timed
    return None


def gradient_bytes(model) -> int | None:
    """Bytes of the model's trainable variables: what one all-reduce of its gradients moves."""
    try:
        total = 0
        for v in model.trainable_variables:
            size = 1
            for d in v.shape:
                size *= int(d)
            total += size * _itemsize(v.dtype)
        return total
    except Exception:
        return None


def _itemsize(dtype) -> int:
    import numpy as np

    try:
        return np.dtype(str(getattr(dtype, "name", dtype))).itemsize
    except TypeError:
        return 4


def make_probe(sink, rank: int, stop_after: int, batch_size: int | None, clock=None):
    """A :class:`StepProbe` that is also a ``keras.callbacks.Callback``."""
    import time

    import keras

    cls = type("KDistStepProbe", (StepProbe, keras.callbacks.Callback), {})
    return cls(sink, rank, stop_after, batch_size, clock or time.perf_counter)


def fit_batch_size(args: tuple, kwargs: dict[str, Any]) -> int | None:
    """Samples per step of a ``fit(x, ...)`` call, when it can be known without touching data."""
    if kwargs.get("batch_size"):
        return int(kwargs["batch_size"])
    x = args[0] if args else kwargs.get("x")
    if x is None:
        return None
    if hasattr(x, "shape") or isinstance(x, (list, tuple, dict)):
        return 32  # Keras' default for array-like input
    try:
        spec = getattr(x, "element_spec", None)  # tf.data.Dataset
        first = spec[0] if isinstance(spec, tuple) else spec
        dim = first.shape[0] if first is not None else None
        return int(dim) if dim else None
    except Exception:
        return None


def probe_for_fit(
    sink: Callable[[str, dict[str, Any]], None],
    rank: int,
    stop_after: int,
    batch_scale: float | None,
    args: tuple,
    kwargs: dict[str, Any],
):
    """The probe's callback for one ``fit``; its ``batch_size`` scaled first where asked."""
    batch = fit_batch_size(args, kwargs)
    if batch_scale and batch and (kwargs.get("batch_size") or (args and hasattr(args[0], "shape"))):
        kwargs["batch_size"] = batch = max(1, round(batch * batch_scale))
    return make_probe(sink, rank, stop_after, batch)
