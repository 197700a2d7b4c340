"""JAX 0.7-0.12: the process's JAX state, and the one call of Keras' JAX guide that JAX now
refuses, as the JAX strategies need them.

Each function names the versions it bridges and the upstream change."""

from __future__ import annotations


def jax_state() -> dict:
    """Whether JAX's backends have started in this process, and its ``jax.distributed`` state.

    Reads ``jax._src.xla_bridge.backends_are_initialized`` and ``jax._src.distributed.global_state``
    (checked against jax 0.7.2, Colab's, and 0.12.0): ``jax.distributed.initialize`` must run
    before any other JAX use and only once per process (jax-ml/jax#9582), and neither fact has
    a public accessor in 0.7. Nothing is imported when JAX is not loaded yet.
    """
    import sys

    if "jax" not in sys.modules:
        return {"started": False, "distributed": None}
    from jax._src import distributed, xla_bridge

    state = distributed.global_state
    dist = None
    if getattr(state, "client", None) is not None:
        dist = {"coordinator": state.coordinator_address, "processes": state.num_processes,
                "process": state.process_id}
    return {"started": bool(xla_bridge.backends_are_initialized()), "distributed": dist}


def device_put_takes_keras_variables():
    """While a JAX cell runs, ``jax.device_put`` takes Keras variables, as Keras' guide
    "Multi-GPU distributed training with JAX" passes them (``model.trainable_variables``).

    JAX converted such objects through ``__jax_array__``, deprecated and now refused: JAX 0.12.0
    (tested here) raises "Triggering __jax_array__() during abstractification is no longer
    supported"; Keras stopped relying on it itself (keras-team/keras#21702), but the guide still
    does. Inside the cell a ``keras.Variable`` leaf is replaced by its ``.value`` (what the old
    conversion gave); everything else goes to JAX untouched. Undone after the cell."""
    from unittest import mock

    import jax
    import keras

    original = jax.device_put

    def device_put(x, *args, **kwargs):
        x = jax.tree_util.tree_map(lambda v: v.value if isinstance(v, keras.Variable) else v, x,
                                   is_leaf=lambda v: isinstance(v, keras.Variable))
        return original(x, *args, **kwargs)

    device_put.__doc__ = original.__doc__
    device_put.__wrapped__ = original
    return mock.patch.object(jax, "device_put", device_put)
