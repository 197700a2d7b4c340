"""Horovod's Keras API for Keras 3, built on Horovod's core TensorFlow collectives.

``import kdist_magics.keras_horovod as hvd`` offers what ``horovod.tensorflow.keras``
offers (``init``, ``size``, ``rank``, ``DistributedOptimizer``, ``callbacks.*``,
``allreduce``, ``broadcast``, ``load_model`` ...) with the same argument names and
defaults, but works under Keras 3, where Horovod 0.28.1's own module trains ranks
that silently drift apart (its optimizer wrapper never sees Keras 3's gradients) and
whose callbacks crash.

How it works: ``DistributedOptimizer`` returns an instance of a subclass of your
optimizer's class (same class name and module, so saved models load without Horovod)
whose ``apply`` (the method Keras 3's compiled train step reaches through
``apply_gradients``) allreduces the gradients with ``horovod.tensorflow.grouped_allreduce``
before the update. Everything runs inside the compiled step (graph mode) as well as
eagerly (``run_eagerly=True``).

``install()`` makes ``import horovod.tensorflow.keras as hvd`` (and ``horovod.keras``)
resolve to this module while Keras 3 is the active Keras; with tf_keras / Keras 2 it
does nothing. ``uninstall()`` restores Horovod's modules.

Importing this module imports neither TensorFlow, Keras nor Horovod; the first call
that needs them does.
"""

from __future__ import annotations

import importlib

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "cross_size",
    "cross_rank",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "broadcast_variables",
    "broadcast_global_variables",
    "load_model",
    "Compression",
    "Average",
    "Sum",
    "Adasum",
    "callbacks",
    "install",
    "uninstall",
    "is_installed",
    "keras3_active",
]


from ._aliases import install, is_installed, keras3_active, uninstall  # noqa: E402
from ._compression import Compression, Compressor, FP16Compressor, NoneCompressor  # noqa: E402,F401


# ----------------------------------------------------------------------------------------
# Horovod basics (thin, lazy forwards to horovod.tensorflow)
def _hvd():
    import horovod.tensorflow as hvd_tf

    return hvd_tf


def init(comm=None, process_sets=None):
    """Initialise Horovod; a no-op when it is already initialised (kdist initialises it on
    each engine before the cell runs, so the ``hvd.init()`` in user code is harmless)."""
    hvd_tf = _hvd()
    if hvd_tf.is_initialized():
        if process_sets not in (None, [], ()):
            # Horovod would re-initialise; on a running job that is never what a cell wants.
            import warnings

            warnings.warn(
                "hvd.init(process_sets=...) ignored: Horovod is already initialised; "
                "use hvd.add_process_set(...) (needs process_sets='dynamic' at start)",
                stacklevel=2,
            )
        return
    hvd_tf.init(comm=comm, process_sets=process_sets)


def shutdown():
    _hvd().shutdown()


def is_initialized():
    return _hvd().is_initialized()


def size():
    return _hvd().size()


def rank():
    return _hvd().rank()


def local_size():
    return _hvd().local_size()


def local_rank():
    return _hvd().local_rank()


def cross_size():
    return _hvd().cross_size()


def cross_rank():
    return _hvd().cross_rank()


# Names that come straight from horovod.tensorflow, resolved on first access.
_FORWARDED = {
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "start_timeline",
    "stop_timeline",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "is_homogeneous",
    "join",
    "allgather_object",
    "broadcast_object",
}
_SUBMODULES = {"callbacks", "elastic"}


def __getattr__(name):
    if name in _FORWARDED:
        value = getattr(_hvd(), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _FORWARDED | _SUBMODULES)


# ----------------------------------------------------------------------------------------
# The optimizer
def DistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
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
    """Wrap a Keras 3 optimizer so that gradients are allreduced across ranks before the update.

    Same arguments and meaning as ``horovod.tensorflow.keras.DistributedOptimizer``
    (``op=None`` means ``hvd.Average`` and ``process_set=None`` the global process set;
    they are resolved lazily). Returns a new optimizer of a subclass of
    ``type(optimizer)`` built from ``optimizer.get_config()``, as Horovod does.

    - ``backward_passes_per_step=k`` sums gradients locally over k steps, allreduces the
      sum on the k-th and applies it (divided by k when ``average_aggregated_gradients``);
      ``optimizer.iterations`` counts every backward pass, as in Horovod.
    - ``compression=Compression.fp16`` sends float gradients as float16.
    - ``op`` may be ``Average`` or ``Sum`` (Horovod's Keras API refuses Adasum too).
    """
    from ._optimizer import create_distributed_optimizer

    return create_distributed_optimizer(
        optimizer,
        name=name,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        num_groups=num_groups,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )


def PartialDistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=None,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    groups=None,
    process_set=None,
    local_layers=None,
    scale_local_gradients=True,
):
    """``DistributedOptimizer`` whose ``local_layers`` keep their gradients to themselves.

    Horovod's ``horovod.keras.PartialDistributedOptimizer``: the trainable weights of
    ``local_layers`` (a Keras layer or a list of them) are registered as worker-local, so
    their gradients are not allreduced; with ``scale_local_gradients`` (the default) they
    are divided by the number of ranks instead, as Horovod does. Every other gradient is
    averaged as by ``DistributedOptimizer``. Without ``local_layers`` the two are the same.
    The other arguments are ``DistributedOptimizer``'s.
    """
    import keras

    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of keras.layers.Layer type.")
    opt = DistributedOptimizer(
        optimizer,
        name=name,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    for layer in local_layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


# ----------------------------------------------------------------------------------------
# Collectives on tensor-compatible values (eager), as in Horovod's Keras API
def allreduce(
    value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None, compression=Compression.none
):
    """Allreduce a tensor-compatible value (Average unless ``op`` says otherwise)."""
    import tensorflow as tf

    return _hvd().allreduce(
        tf.convert_to_tensor(value, name=name),
        average=average,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        op=op,
        compression=compression,
    )


def allgather(value, name=None):
    """Concatenate every rank's value along the first dimension."""
    import tensorflow as tf

    return _hvd().allgather(tf.convert_to_tensor(value, name=name))


def broadcast(value, root_rank, name=None):
    """Every rank gets ``root_rank``'s value."""
    import tensorflow as tf

    return _hvd().broadcast(tf.convert_to_tensor(value, name=name), root_rank)


def reducescatter(value, name=None, op=None):
    """Reduce across ranks and give each rank its slice of the first dimension."""
    import tensorflow as tf

    hvd_tf = _hvd()
    return hvd_tf.reducescatter(tf.convert_to_tensor(value, name=name), op=hvd_tf.Average if op is None else op)


def broadcast_variables(variables, root_rank, process_set=None):
    """Assign ``root_rank``'s values to ``variables`` (Keras 3 or TensorFlow variables)."""
    from ._state import tf_variable

    hvd_tf = _hvd()
    tf_vars = [tf_variable(v) for v in variables]
    if not tf_vars:
        return None
    return hvd_tf.broadcast_variables(tf_vars, root_rank, process_set=process_set or hvd_tf.global_process_set)


def broadcast_global_variables(root_rank):
    """Not available under Keras 3, which has no global variable collection."""
    raise RuntimeError(
        "broadcast_global_variables() has no meaning under Keras 3 (there is no global "
        "variable collection). Use hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) "
        "in fit(), or hvd.broadcast_variables(model.variables + optimizer.variables, root_rank)."
    )


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none, legacy_opts=False):
    """Load a ``.keras`` model and wrap its optimizer in ``DistributedOptimizer``.

    The optimizer's saved state (iterations, moments) is restored into the wrapped
    optimizer. Every optimizer class in ``keras.optimizers`` is wrapped without being
    named; pass your own classes in ``custom_optimizers``.
    """
    if legacy_opts:
        raise ValueError(
            "legacy_opts=True: Keras 3 has no legacy optimizers "
            "(tf.keras.optimizers.legacy is a tf_keras / Keras 2 feature)"
        )
    from ._optimizer import load_model as _load

    return _load(filepath, custom_optimizers, custom_objects, compression)
