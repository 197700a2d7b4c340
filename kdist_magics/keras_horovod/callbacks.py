"""Horovod's Keras callbacks for Keras 3 (``hvd.callbacks.*``)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import keras

import horovod.tensorflow as hvd_tf

from ._state import tf_variable

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "BestModelCheckpoint",
]


def _is_seed_state(v):
    return getattr(v, "name", "").split("/")[-1].split(":")[0] == "seed_generator_state"


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast the model's and the optimizer's variables from ``root_rank`` to every other
    rank, so all ranks start from the same state (random init or a checkpoint on one rank).

    Horovod broadcasts after the first batch. Keras 3 builds the model and the optimizer
    before ``on_train_begin``, so here the broadcast happens there, before any step (the
    optimizer is built first if it is not yet). A model that is still unbuilt at that
    point is broadcast after its first batch, as in Horovod.
    """

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self._local_vars = set()
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var):
        """Do not broadcast ``var`` (a Keras or TensorFlow variable)."""
        try:
            self._local_vars.add(tf_variable(var).ref())
        except TypeError:
            raise ValueError("All local variables must be Keras or tf.Variable variables.") from None

    def _variables(self):
        model = self.model
        opt = getattr(model, "optimizer", None)
        if opt is not None and not opt.built and model.trainable_variables:
            opt.build(model.trainable_variables)
        # Random-seed states (Dropout's SeedGenerator) stay per rank, so ranks keep drawing
        # different dropout masks as they did under Keras 2, which had no such variables.
        model_vars = [
            v for v in model.variables if tf_variable(v).ref() not in self._local_vars and not _is_seed_state(v)
        ]
        opt_vars = list(opt.variables) if opt is not None else []
        return model_vars, opt_vars

    def _broadcast(self):
        model = self.model
        # An unbuilt model (e.g. a Sequential without an Input, fed a dataset) gets its
        # weights in the first step; some layers (Dropout's seed state) already have
        # variables. Wait for the weights, as Horovod does (after the first batch). A model
        # whose weights are all frozen (no trainable variable) is broadcast like any other.
        if not getattr(model, "built", True) or not any(not _is_seed_state(v) for v in model.variables):
            return False
        model_vars, opt_vars = self._variables()
        with tf.device(self.device):
            for group in (model_vars, opt_vars):
                if group:
                    hvd_tf.broadcast_variables([tf_variable(v) for v in group], root_rank=self.root_rank)
        self.broadcast_done = True
        return True

    def on_train_begin(self, logs=None):
        if not self.broadcast_done:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Replace each metric in the epoch's logs by its average over ranks.

    Put it before callbacks that read metrics (ReduceLROnPlateau, EarlyStopping, ...).
    """

    def __init__(self, device=""):
        super().__init__()
        self.device = device

    def _average_metrics_in_place(self, logs):
        if not logs:
            return
        names = sorted(logs)  # the same order on every rank
        values = [np.asarray(logs[n], dtype=np.float64) for n in names]
        with tf.device(self.device):
            reduced = hvd_tf.grouped_allreduce([tf.constant(v) for v in values], op=hvd_tf.Average)
        for name, value in zip(names, reduced):
            value = value.numpy()
            logs[name] = float(value) if np.ndim(value) == 0 else value

    def on_epoch_end(self, epoch, logs=None):
        self._average_metrics_in_place(logs)


def _get_lr(opt):
    return float(keras.ops.convert_to_numpy(opt.learning_rate))


def _set_lr(opt, value):
    try:
        opt.learning_rate = value
    except TypeError as err:
        raise TypeError(
            "this callback sets the optimizer's learning rate, but the optimizer uses a "
            "LearningRateSchedule; give it a float learning rate instead"
        ) from err


def _momentum_slots(opt):
    for attr in ("momentums", "_momentums"):
        slots = getattr(opt, attr, None)
        if slots:
            return [s for s in slots if s is not None]
    return []


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` to
    ``end_epoch`` (exclusive); per epoch (``staircase=True``) or per batch, with
    ``epoch = epoch + batch / steps_per_epoch``. ``multiplier`` may be a constant
    (``multiplier ** (epoch - start_epoch)``) or a function of the epoch.

    Momentum correction: Keras 3 compiles an optimizer's ``momentum`` into the train step
    as a constant, so Horovod's trick (scaling ``momentum`` by ``new_lr / old_lr`` for one
    batch) cannot reach it. The same update is obtained by scaling the momentum buffers by
    ``new_lr / old_lr`` when the learning rate changes (exact for SGD and RMSprop with
    momentum; for Nesterov SGD the look-ahead term keeps the unscaled momentum).
    """

    def __init__(
        self,
        initial_lr,
        multiplier,
        start_epoch=0,
        end_epoch=None,
        staircase=True,
        momentum_correction=True,
        steps_per_epoch=None,
    ):
        super().__init__()
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.initial_lr = initial_lr
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        if not callable(multiplier):
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)
        else:
            self.multiplier = multiplier
        if self.initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")

    def _autodetect_steps_per_epoch(self):
        if self.params.get("steps"):
            return self.params["steps"]
        if self.params.get("samples") and self.params.get("batch_size"):
            return self.params["samples"] // self.params["batch_size"]
        raise ValueError(
            "Could not autodetect the number of steps per epoch. Please specify the "
            f"steps_per_epoch parameter to the {type(self).__name__}() "
            "(fit() on a dataset of unknown length does not tell callbacks)."
        )

    def _adjust_learning_rate(self, epoch):
        opt = self.model.optimizer
        old_lr = _get_lr(opt)
        new_lr = self.initial_lr * self.multiplier(epoch)
        _set_lr(opt, new_lr)
        if self.momentum_correction and getattr(opt, "momentum", 0) and old_lr > 0 and new_lr != old_lr:
            ratio = new_lr / old_lr
            for slot in _momentum_slots(opt):
                slot.assign(slot * ratio)

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
            self.end_epoch is not None and self.current_epoch >= self.end_epoch
        ):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``
    ("Accurate, Large Minibatch SGD", Goyal et al. 2017), adjusted every batch::

        epoch' = epoch + (batch + 1) / steps_per_epoch
        lr     = initial_lr / size * (epoch' * (size - 1) / warmup_epochs + 1)
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # Round numbers at the end of each epoch, as in Horovod.
            epoch += 1.0 / self.steps_per_epoch
            n = hvd_tf.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and hvd_tf.rank() == 0:
            print(
                "\nEpoch %d: finished gradual learning rate warmup to %g." % (epoch + 1, _get_lr(self.model.optimizer))
            )


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """``ModelCheckpoint`` that keeps only the best model (``save_best_only=True``).

    Horovod leaves ``filepath`` to be set later; Keras 3 needs a ``.keras`` (or, with
    ``save_weights_only``, ``.weights.h5``) path, so one may be given here.
    """

    def __init__(
        self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto", save_freq="epoch", filepath=None
    ):
        if filepath is None:
            filepath = "best_model.weights.h5" if save_weights_only else "best_model.keras"
        super().__init__(
            filepath=filepath,
            monitor=monitor,
            verbose=verbose,
            save_best_only=True,
            save_weights_only=save_weights_only,
            mode=mode,
            save_freq=save_freq,
        )
