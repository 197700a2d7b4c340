"""Telemetry: what each rank (or the kernel) reports while a ``%%kdist`` cell trains.

Two entry points, both context managers feeding plain JSON-able dict rows to
``sink(kind, row)`` (``kind`` is ``metric``, ``progress`` or ``sample``), so
rows can cross process boundaries unchanged:

* :func:`attached` -- every ``keras.Model.fit`` called inside the block gets a
  :class:`KDistCallback` appended. It emits

  - ``metric`` rows ``{rank, epoch, step, batch, time, kind: "step", loss, <metrics>,
    lr, steps_per_s, samples_per_s, step_time, gap_time}`` at most every ``min_interval`` seconds
    (``step_time``/``gap_time``: mean seconds inside a step and between steps since the last
    row, which :mod:`kdist_magics.watch.stragglers` reads; None on JAX, whose batch ends run late;
    ``collective_time``: mean seconds of the gradient all-reduce, timed where it runs, under
    kdist's Horovod binding and its averaged fit on PyTorch: :mod:`.collective`) (plus the last
    step of every epoch), and ``kind: "epoch"`` rows with the epoch logs (validation metrics
    included) at every epoch end;
  - ``progress`` rows ``{rank, epochs, steps_per_epoch, epoch, step, total_steps,
    fit_started, time, samples_per_s, steps_per_s}`` with the same throttle.

  Throttling keeps the per-step cost to a clock read and a comparison; rows
  (and, on TensorFlow, the learning-rate read) happen a few times a second.
  The callback is ``async_safe``: on backends where Keras runs batch-end
  callbacks on a thread pool (JAX), it does not pull them back onto the
  training loop.

* :func:`~kdist_magics.watch.sampling.sampling` (in :mod:`kdist_magics.watch.sampling`, re-exported
  here) -- a daemon thread samples this process's utilisation.

Nothing here imports TensorFlow or Keras at module import.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

from .collective import timing as collective_timing
from .step_probe import fit_batch_size, probe_for_fit

Sink = Callable[[str, dict[str, Any]], None]

#: default seconds between step rows (and progress rows) from one rank
MIN_INTERVAL = 0.2


def _number(value: Any):
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if out == out else None  # NaN -> None keeps rows JSON-able


def _learning_rate(model) -> float | None:
    try:
        return _number(model.optimizer.learning_rate)
    except Exception:
        try:
            import keras

            return _number(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        except Exception:
            return None


def make_callback(
    sink: Sink,
    rank: int = 0,
    batch_size: int | None = None,
    min_interval: float = MIN_INTERVAL,
    clock: Callable[[], float] = time.time,
    step_offset: int = 0,
    fit_index: int = 0,
):
    """A Keras callback sending throttled step rows, epoch rows and progress to ``sink``.

    ``batch_size`` (samples per step, when known) turns steps/s into samples/s.
    ``clock`` is injectable for tests. Rows' ``step`` counts from ``step_offset``, so
    several ``fit`` calls in one cell draw one continuous curve (``fit`` says which);
    progress rows count the steps of this ``fit``.

    The Keras classes are made when ``fit`` first runs (:func:`_keras_classes`), so Keras is
    imported only then; their methods are :class:`_Telemetry`'s and :class:`_Mark`'s.
    """
    callback, mark = _keras_classes()
    return callback(mark, sink, rank, batch_size, min_interval, clock, step_offset, fit_index)


_classes: tuple | None = None


def _keras_classes() -> tuple:
    """``(KDistCallback, _StepMark)``: the mixins below on ``keras.callbacks.Callback``."""
    global _classes
    if _classes is None:
        import keras

        base = keras.callbacks.Callback
        _classes = (
            type("KDistCallback", (_Telemetry, base), {"__doc__": _Telemetry.__doc__}),
            type("_StepMark", (_Mark, base), {"__doc__": _Mark.__doc__}),
        )
    return _classes


class _Telemetry:
    """Sends loss/metrics/lr/throughput per step (throttled) and per epoch to kdist.

    ``async_safe``: Keras 3 runs batch-end callbacks on a thread pool, off the
    training loop, only when every callback says it is safe; a callback without it
    would make every step wait for its logs. Batch ends may therefore arrive on
    several threads (and slightly out of order): a lock guards the state, and the
    step number comes from (epoch, batch), not from a counter.
    """

    async_safe = True

    def __init__(self, mark, sink, rank, batch_size, min_interval, clock, step_offset, fit_index):
        import keras

        super().__init__()
        self._lock = threading.Lock()
        self._sink, self._clock = sink, clock
        self._step_offset, self._fit_index = step_offset, fit_index
        self.rank = rank
        self.batch_size = batch_size
        self.min_interval = min_interval
        self.epoch = 0
        self.step = 0  # steps done in this fit, over all epochs
        self.epochs = None
        self.steps_per_epoch = None
        self.fit_started = None
        self._last_emit = None
        self.lr = None
        # Reading the optimizer from a batch-end callback is only safe where Keras runs
        # those on the training thread (TensorFlow); on JAX they run on a thread pool
        # while the next step may be donating the very buffers, so lr is read at train
        # begin and epoch ends (training thread, state synced) and reused in between.
        self._live_lr = keras.backend.backend() == "tensorflow"
        self._last_emit_step = 0
        # Step timing: the step begins at the *last* callback's batch begin and ends at the
        # *first* callback's batch end (``markers``: one goes before the user's callbacks,
        # one after), so other callbacks' work counts as time between steps. This one stays
        # after the user's, so it reads their epoch logs (Horovod's averaged metrics).
        self._timed = keras.backend.backend() != "jax"
        self._began = self._ended = self._step_ended = None
        self._in_step = self._between = 0.0
        self._n_in = self._n_between = 0
        self._collective = None  # (seconds, count) of the gradient collective at the last row
        # read only where batch ends run on the training thread: on JAX they run on a thread
        # pool, where Keras' Callback.model syncs the model's state from buffers the next step
        # may be donating ("Array has been deleted"); and no JAX collective is timed
        self._reads_collective = keras.backend.backend() != "jax"
        self.markers = (mark(self, "_step_ended"), mark(self, "_began"))

    # -- helpers ---------------------------------------------------------
    def _rates(self, now: float) -> dict[str, Any]:
        dt = now - self._last_emit if self._last_emit is not None else None
        steps = self.step - self._last_emit_step
        if not dt or dt <= 0 or steps <= 0:
            return {"steps_per_s": None, "samples_per_s": None}
        sps = steps / dt
        return {"steps_per_s": sps, "samples_per_s": sps * self.batch_size if self.batch_size else None}

    def _progress(self, now: float, rates: dict[str, Any]) -> None:
        total = self.epochs * self.steps_per_epoch if self.epochs and self.steps_per_epoch else None
        self._sink(
            "progress",
            {
                "rank": self.rank,
                "epochs": self.epochs,
                "steps_per_epoch": self.steps_per_epoch,
                "epoch": self.epoch,
                "step": self.step,
                "total_steps": total,
                "fit_started": self.fit_started,
                "time": now,
                **rates,
            },
        )

    # -- Keras hooks -----------------------------------------------------
    def on_train_begin(self, logs=None):
        params = self.params or {}
        self.epochs = params.get("epochs")
        self.steps_per_epoch = params.get("steps")
        self.fit_started = self._last_emit = self._clock()
        self.lr = _learning_rate(self.model)
        self._last_emit_step = 0
        self._progress(self.fit_started, {"steps_per_s": None, "samples_per_s": None})

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self._ended = None  # the last epoch's validation is not time between steps

    def _time_step(self, now: float) -> None:
        began, self._began = self._began, None
        if not self._timed or began is None:
            return
        self._in_step += now - began
        self._n_in += 1
        if self._ended is not None:
            self._between += max(0.0, began - self._ended)
            self._n_between += 1
        self._ended = now

    def _timings(self) -> dict[str, Any]:
        out = {
            "step_time": self._in_step / self._n_in if self._n_in else None,
            "gap_time": self._between / self._n_between if self._n_between else None,
        }
        self._in_step = self._between = 0.0
        self._n_in = self._n_between = 0
        timed = _collective_timing(self.model) if self._reads_collective else None
        if timed is not None:
            before = self._collective or (0.0, 0)
            if timed[1] < before[1]:  # a new clock (a new fit's): counted from nothing
                before = (0.0, 0)
            self._collective = timed
            if timed[1] > before[1]:  # mean seconds in the collective per step since the last row
                out["collective_time"] = (timed[0] - before[0]) / (timed[1] - before[1])
        return out

    def on_train_batch_end(self, batch, logs=None):
        now, self._step_ended = self._step_ended or self._clock(), None
        with self._lock:
            self._batch_end(batch, logs, now)

    def _batch_end(self, batch, logs, now):
        self._time_step(now)
        if self.steps_per_epoch:
            self.step = max(self.step, self.epoch * self.steps_per_epoch + batch + 1)
        else:
            self.step += 1
        last_of_epoch = self.steps_per_epoch is not None and batch + 1 >= self.steps_per_epoch
        if not last_of_epoch and self._last_emit is not None and now - self._last_emit < self.min_interval:
            return  # throttled: no row
        rates = self._rates(now)
        row = {
            "rank": self.rank,
            "epoch": self.epoch,
            "step": self._step_offset + self.step,
            "batch": batch,
            "fit": self._fit_index,
            "time": now,
            "kind": "step",
            "batch_size": self.batch_size,
        }
        row.update({k: _number(v) for k, v in (logs or {}).items()})
        if self._live_lr:
            self.lr = _learning_rate(self.model)
        row["lr"] = self.lr
        row.update(rates)
        row.update(self._timings())
        self._sink("metric", row)
        self._progress(now, rates)
        self._last_emit, self._last_emit_step = now, self.step

    def on_epoch_end(self, epoch, logs=None):
        with self._lock:
            self._epoch_end(epoch, logs)

    def _epoch_end(self, epoch, logs):
        now = self._clock()
        row = {
            "rank": self.rank,
            "epoch": epoch,
            "step": self._step_offset + self.step,
            "fit": self._fit_index,
            "time": now,
            "kind": "epoch",
        }
        row.update({k: _number(v) for k, v in (logs or {}).items()})
        row["lr"] = self.lr = _learning_rate(self.model)
        elapsed = now - (self.fit_started or now)
        sps = self.step / elapsed if elapsed > 0 else None
        row["steps_per_s"] = sps
        row["samples_per_s"] = sps * self.batch_size if sps and self.batch_size else None
        self._sink("metric", row)

    def on_train_end(self, logs=None):
        now = self._clock()
        elapsed = now - (self.fit_started or now)
        sps = self.step / elapsed if elapsed > 0 and self.step else None
        self._progress(
            now, {"steps_per_s": sps, "samples_per_s": sps * self.batch_size if sps and self.batch_size else None}
        )


def _collective_timing(model) -> tuple[float, int] | None:
    """The gradient collective's seconds and count so far on this rank, where it is timed
    where it runs (:mod:`.collective`); None elsewhere, or when it cannot be read now."""
    try:
        return collective_timing(getattr(model, "optimizer", None))
    except Exception:  # a variable on a device being torn down: no figure this time
        return None


class _Mark:
    """Stamps the time into ``owner.<field>``: at batch end (``_step_ended``, the first
    callback: the step has just ended) or at batch begin (``_began``, the last callback:
    the step starts now)."""

    async_safe = True

    def __init__(self, owner, field):
        super().__init__()
        self.owner, self.field = owner, field

    def on_train_batch_begin(self, batch, logs=None):
        if self.field == "_began":
            self.owner._began = self.owner._clock()

    def on_train_batch_end(self, batch, logs=None):
        if self.field == "_step_ended":
            self.owner._step_ended = self.owner._clock()


@contextlib.contextmanager
def attached(
    sink: Sink,
    rank: int = 0,
    min_interval: float = MIN_INTERVAL,
    stop_after: int | None = None,
    batch_scale: float | None = None,
):
    """Within the block, ``keras.Model.fit`` gets the kdist callback appended.

    A ``fit`` that already carries a callback with ``kdist_opt_out = True`` (or is
    called with ``kdist=False``) is left alone: that is the per-call opt-out.
    ``stop_after`` (``%kdist scale``'s runs): every ``fit`` also gets a
    :class:`~kdist_magics.watch.step_probe.StepProbe`, which stops it after that many steps and
    sends the step timings; ``batch_scale`` multiplies a ``batch_size`` ``fit`` is given (a
    strategy whose cells give the global batch keeps each rank's batch as the probe asks).
    """
    import keras

    original = keras.Model.fit
    done = {"steps": 0, "fits": 0}  # over the fits of this block (one cell)

    def fit(model, *args, **kwargs):
        __tracebackhide__ = True  # IPython leaves kdist's wrapper out of the user's traceback
        enabled = kwargs.pop("kdist", True)
        callbacks = list(kwargs.pop("callbacks", None) or [])
        cb = None
        if stop_after:
            callbacks.append(probe_for_fit(sink, rank, stop_after, batch_scale, args, kwargs))
        if enabled and not any(getattr(c, "kdist_opt_out", False) for c in callbacks):
            cb = make_callback(
                sink,
                rank,
                batch_size=fit_batch_size(args, kwargs),
                min_interval=min_interval,
                step_offset=done["steps"],
                fit_index=done["fits"],
            )
            ended, began = cb.markers
            callbacks = [ended, *callbacks, cb, began]  # see make_callback: step timing
        try:
            return original(model, *args, callbacks=callbacks, **kwargs)
        finally:
            if cb is not None:
                done["steps"] += cb.step
                done["fits"] += 1

    fit.__wrapped__ = original
    fit.__doc__ = original.__doc__
    keras.Model.fit = fit
    try:
        yield
    finally:
        keras.Model.fit = original
