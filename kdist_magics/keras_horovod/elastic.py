"""``hvd.elastic`` for Keras 3: state that survives a lost rank, and the loop that resets.

Horovod 0.28.1's semantics (``horovod.tensorflow.keras.elastic``), on Keras 3:

* :class:`KerasState` ``(model, optimizer=None, **kwargs)`` keeps a host copy of the model's
  and the optimizer's variables and of the extra attributes (``state.epoch``, ``state.batch``
  ...). ``commit()`` takes a new copy (and checks for a pending host change), ``restore()``
  puts the last copy back, ``sync()`` broadcasts rank 0's variables and attributes to every
  rank. Random-seed states (Dropout's) stay per rank, as in the broadcast callback.
* :class:`CommitStateCallback`, :class:`UpdateBatchStateCallback`,
  :class:`UpdateEpochStateCallback`: commit every ``batches_per_commit`` batches and at each
  epoch's end; keep ``state.batch`` and ``state.epoch`` current.
* :func:`run` wraps a training function ``train(state, ...)``: sync, call it, and when a
  collective fails because a rank was lost (``HorovodInternalError``) restore the last commit,
  re-initialise Horovod (the rendezvous names the new ranks and size) and call it again; a
  pending host change (``state.on_hosts_updated(...)``, then ``HostsUpdatedInterrupt`` at
  the next commit) resets without restoring.

Under ``%%kdist --strategy horovod --min-np K`` the kernel is the elastic driver: it re-forms
the rendezvous with the ranks still alive; with ``--max-np M`` it also takes in engines that
register during the run, telling the ranks through its abort line (:func:`hosts_added`)
instead of Horovod's worker notification service, a listener on every rank, which is not
started.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np

import horovod.tensorflow as hvd_tf
from horovod.common.elastic import ObjectState
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from ._state import tf_variable

__all__ = [
    "KerasState",
    "CommitStateCallback",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
]


def _is_seed_state(v) -> bool:
    return getattr(v, "name", "").split("/")[-1].split(":")[0] == "seed_generator_state"


def _synced(variables):
    return [v for v in variables if not _is_seed_state(v)]


class KerasState(ObjectState):
    """State of a Keras 3 model and its optimizer (and ``kwargs`` as attributes) across resets.

    The model must be built. The optimizer (``optimizer`` or the model's compiled one) is
    built here if it is not yet, so its slots exist from the first commit on.
    """

    def __init__(self, model, optimizer=None, **kwargs):
        if not getattr(model, "built", True):
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer or getattr(model, "optimizer", None)
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(model.trainable_variables)
        self._save_model()
        super().__init__(bcast_object=hvd_tf.broadcast_object, get_rank=hvd_tf.rank, **kwargs)

    def _variables(self):
        opt = list(self.optimizer.variables) if self.optimizer is not None else []
        return _synced(self.model.variables) + _synced(opt)

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        for var, value in zip(self._variables(), self._saved_variables):
            var.assign(value)
        super().restore()

    def sync(self):
        # named by position, not by Keras' per-process variable names: a rank that joins
        # the run is a fresh process whose automatic names may differ
        for i, var in enumerate(tf_variable(v) for v in self._variables()):
            var.assign(hvd_tf.broadcast(var, root_rank=0, name=f"KDistElasticSync.{i}"))
        self._save_model()
        super().sync()

    def _save_model(self):
        self._saved_variables = [np.array(v.numpy(), copy=True) for v in self._variables()]


def _keras_callback():
    import keras

    return keras.callbacks.Callback


class CommitStateCallback(_keras_callback()):
    """Commit ``state`` every ``batches_per_commit`` batches and at the end of every epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # the same count on every rank

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(_keras_callback()):
    """Keep ``state.batch`` at the last finished batch of the epoch (0 after an epoch ends).

    As in Horovod, ``params['steps']`` of the first epoch after a reset is shortened by the
    batches already done (it is what progress bars read); the epoch's length itself is
    the ``steps_per_epoch`` given to ``fit``.
    """

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        steps = (self.params or {}).get("steps")
        if steps:
            if self.steps_per_epoch is None:
                self.steps_per_epoch = steps
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(_keras_callback()):
    """Keep ``state.epoch`` at the number of epochs finished, counted across resets."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        # Keras counts from 0 in every fit(); +1: the epoch just finished is done
        self.state.epoch = self.initial_epoch + epoch + 1


def _lost_rank_error(exc: BaseException) -> bool:
    """A TensorFlow op error raised by a Horovod collective that failed (a peer was lost)."""
    import tensorflow as tf

    if not isinstance(exc, tf.errors.OpError):
        return False
    text = str(exc)
    return "Horovod" in text or "gloo" in text.lower()


_waiting: list = []  # the states of running hvd.elastic.run calls
_waiting_lock = threading.Lock()


def hosts_added() -> int:
    """Hosts were added: each running state raises ``HostsUpdatedInterrupt`` at its next
    commit (rank 0's view decides, so every rank at the same one). Returns how many states
    were told. kdist's abort-line watcher calls this."""
    from horovod.runner.elastic.worker import HostUpdateResult

    with _waiting_lock:
        states = list(_waiting)
    for state in states:
        state.on_hosts_updated(time.time(), HostUpdateResult.added)
    return len(states)


def _reset():
    hvd_tf.shutdown()
    hvd_tf.init()


def run(func):
    """Run ``func(state, *args, **kwargs)`` until it returns, across resets (see module doc).

    ``func`` must not begin with a collective (a rank joining would meet the others in
    ``sync``); its first argument is the state object.
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        with _waiting_lock:
            _waiting.append(state)
        try:
            return _loop(func, state, args, kwargs)
        finally:
            with _waiting_lock:
                if state in _waiting:
                    _waiting.remove(state)

    return wrapper


def _loop(func, state, args, kwargs):
    skip_sync = False
    while True:
        try:
            if not skip_sync:
                state.sync()
            return func(state, *args, **kwargs)
        except HorovodInternalError:
            state.restore()
            skip_sync = False
        except HostsUpdatedInterrupt as exc:
            skip_sync = exc.skip_sync
        except Exception as exc:
            if not _lost_rank_error(exc):
                raise
            state.restore()
            skip_sync = False
        _reset()
        state.on_reset()
