"""DistributedOptimizer for Keras 3 (TensorFlow backend) on Horovod's core collectives."""

from __future__ import annotations

import warnings

import tensorflow as tf

import horovod.tensorflow as hvd_tf

from ._state import _Settings, _State, tf_variable


def _check_backend():
    import keras

    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "the Keras 3 Horovod binding needs Keras' TensorFlow backend "
            f"(KERAS_BACKEND=tensorflow); the active backend is {keras.backend.backend()!r}"
        )


def collective_timing(optimizer) -> tuple[float, int] | None:
    """``(seconds, count)`` of the allreduces ``optimizer`` (a DistributedOptimizer of this
    binding) has run so far, read on the host; None for any other optimizer, or before its
    first allreduce was traced."""
    state = getattr(optimizer, "_kdist_hvd", None)
    if state is None or state.collective_s is None:
        return None
    return float(state.collective_s.numpy()), int(state.collectives.numpy())


def _make_class(base_cls, settings: _Settings):
    """A subclass of ``base_cls`` with the same name and module whose ``apply`` allreduces.

    It follows Horovod's own ``_make_class`` (one subclass of the user's optimizer class, made
    at run time), so a reader can hold the two side by side; the aggregation over
    ``backward_passes_per_step`` is :func:`_aggregate`."""

    class _DistributedOptimizer(base_cls):
        _kdist_hvd_settings = settings

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._kdist_hvd = _State(self._kdist_hvd_settings)

        def register_local_var(self, var):
            """Treat ``var`` as worker-local: its gradient is not allreduced (it is divided by
            the number of ranks when ``scale_local_gradients``, as in Horovod)."""
            self._kdist_hvd.local.append(tf_variable(var))

        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            if not grads:
                return super().apply(grads, trainable_variables)
            if trainable_variables is None:
                if not self.built:
                    return super().apply(grads, trainable_variables)  # Keras' own error
                variables = list(self._trainable_variables)
            else:
                variables = list(trainable_variables)
            state = self._kdist_hvd
            if state.s.backward_passes_per_step <= 1:
                return super().apply(state.reduce(grads, variables), trainable_variables)

            if not self.built:
                import keras

                with keras.name_scope(self.name, caller=self):
                    self.build(variables)
            _aggregate(self, super().apply, grads, variables, trainable_variables)
            return None

    _DistributedOptimizer.__name__ = base_cls.__name__
    _DistributedOptimizer.__qualname__ = base_cls.__qualname__
    _DistributedOptimizer.__module__ = base_cls.__module__
    _DistributedOptimizer.__doc__ = base_cls.__doc__
    return _DistributedOptimizer


def _aggregate(opt, base_apply, grads, variables, trainable_variables) -> None:
    """``backward_passes_per_step`` > 1: add ``grads`` to the accumulators; every k-th pass
    allreduce the sums and apply them with ``base_apply`` (the base class's ``apply``)."""
    state = opt._kdist_hvd
    k = state.s.backward_passes_per_step
    state.ensure_accumulators(grads, variables)
    dense = [None if g is None else state.dense(g) for g in grads]
    for acc, g in zip(state.accumulators, dense):
        if acc is not None and g is not None:
            acc.assign_add(tf.cast(g, acc.dtype))
    state.counter.assign_add(1)

    def allreduce_and_apply():
        summed = [None if acc is None else acc.read_value() for acc in state.accumulators]
        reduced = state.reduce(summed, variables)
        if state.s.average_aggregated_gradients:
            reduced = [None if r is None else r / k for r in reduced]
        base_apply(reduced, trainable_variables)
        for acc in state.accumulators:
            if acc is not None:
                acc.assign(tf.zeros_like(acc))
        state.counter.assign(0)
        return tf.constant(True)

    def count_only():
        # Horovod: the optimizer's iterations count every backward pass.
        opt._iterations.assign_add(1)
        return tf.constant(False)

    tf.cond(tf.equal(state.counter, k), allreduce_and_apply, count_only)


def _settings(
    name,
    base_cls,
    device_dense="",
    device_sparse="",
    compression=None,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=None,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=None,
    scale_local_gradients=True,
):
    from ._compression import Compression

    op = hvd_tf.Average if op is None else op
    if op != hvd_tf.Average and op != hvd_tf.Sum:
        raise ValueError("op currently only supports Average and Sum")
    if gradient_predivide_factor != 1.0 and hvd_tf.rocm_built():
        raise ValueError("gradient_predivide_factor not supported yet with ROCm")
    if gradient_predivide_factor <= 0:
        raise ValueError("gradient_predivide_factor must be > 0")
    if int(backward_passes_per_step) < 1:
        raise ValueError("backward_passes_per_step must be > 0")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
            stacklevel=3,
        )
        if groups is None:
            groups = num_groups
    if groups is not None:
        if isinstance(groups, bool) or not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")
    return _Settings(
        name=name or f"Distributed{base_cls.__name__}",
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=Compression.none if compression is None else compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=hvd_tf.global_process_set if process_set is None else process_set,
        scale_local_gradients=scale_local_gradients,
    )


def create_distributed_optimizer(optimizer, name=None, **kwargs):
    import keras

    _check_backend()
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "DistributedOptimizer expects a Keras 3 optimizer (keras.optimizers.*), got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}. tf.compat.v1 optimizers "
            "belong to horovod.tensorflow.DistributedOptimizer; tf_keras optimizers to "
            "Horovod's own horovod.tensorflow.keras (with TF_USE_LEGACY_KERAS=1)."
        )
    if hasattr(type(optimizer), "_kdist_hvd_settings"):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    if keras.config.dtype_policy().name == "mixed_float16" and not isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ):
        # compile() would wrap us in a LossScaleOptimizer, which checks for inf/nan *before*
        # our allreduce: one rank could skip the step (and the collective) while the other
        # waits in it. Loss-scale first, allreduce outermost: every rank sees the same
        # reduced gradients and takes the same branch.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    base_cls = type(optimizer)
    settings = _settings(name, base_cls, **kwargs)
    cls = _make_class(base_cls, settings)
    return cls.from_config(optimizer.get_config())


def _optimizer_classes(root):
    seen, stack = [], [root]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.append(sub)
                stack.append(sub)
    return [c for c in seen if not hasattr(c, "_kdist_hvd_settings")]


def load_model(filepath, custom_optimizers, custom_objects, compression):
    import keras

    _check_backend()
    objects = {}
    for cls in _optimizer_classes(keras.optimizers.Optimizer) + list(custom_optimizers or []):
        wrapped = _make_class(cls, _settings(None, cls, compression=compression))
        objects[cls.__name__] = wrapped
        objects[cls.__name__.lower()] = wrapped
    if custom_objects:
        objects.update(custom_objects)
    return keras.models.load_model(filepath, custom_objects=objects)
