"""A Keras model whose variables are sharded over several JAX processes, made whole for travel.

Keras (<= 3.15) saves a model by reading each variable's value in the calling process, which
JAX refuses for an array spanning other processes' devices ("spans non-addressable devices").
:func:`whole` gathers every variable on every process (a collective: each process calls it,
as ``--pull`` does under JAX) and returns an ordinary copy of the model, built without any
distribution: saved, pulled into the notebook, it predicts on one device. Optimizer state stays
behind (the copy is compiled afresh from the model's compile config).
"""

from __future__ import annotations

import contextlib


def spans_processes(model) -> bool:
    return any(not getattr(v.value, "is_fully_addressable", True) for v in model.weights)


@contextlib.contextmanager
def no_distribution():
    import keras

    before = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(before)


def whole(model):
    """``model`` itself when this process holds all of it, else an ordinary gathered copy."""
    if not spans_processes(model):
        return model
    import keras
    import numpy as np
    from jax.experimental import multihost_utils

    values = [
        np.asarray(v.value)
        if getattr(v.value, "is_fully_addressable", True)
        else np.asarray(multihost_utils.process_allgather(v.value, tiled=True))
        for v in model.weights
    ]
    with no_distribution():
        copy = keras.models.clone_model(model)
        if not copy.built:
            copy.build(model.input_shape if hasattr(model, "input_shape") else None)
        copy.set_weights(values)
        config = model.get_compile_config() if getattr(model, "compiled", False) else None
        if config:
            copy.compile_from_config(config)
    return copy


def save(model, path: str, write: bool = True) -> None:
    """``model.save(path)``, gathered first where it spans processes (every process calls
    this; only where ``write`` is a file written). The copy is saved with no distribution
    in force: Keras builds what it saves lazily (the optimizer's variables), and under the
    run's distribution one process alone would start a collective the others never join."""
    copy = whole(model)
    if not write:
        return
    if copy is model:
        model.save(path)
        return
    with no_distribution():
        copy.save(path)
