"""JAX 0.7-0.12: the process's JAX state, the one call of Keras' JAX guide that JAX now
refuses, and the source locations JAX 0.12.1 lets split a process group, as the JAX
strategies need them.

Each function names the versions it bridges and the upstream change."""

from __future__ import annotations

import contextlib


def jax_state() -> dict:
    """Whether JAX's backends have started in this process, and its ``jax.distributed`` state.

    Reads ``jax._src.xla_bridge.backends_are_initialized`` and ``jax._src.distributed.global_state``
    (checked against jax 0.7.2, Colab's, 0.12.0 and 0.12.1): ``jax.distributed.initialize`` must run
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
        dist = {"coordinator": state.coordinator_address, "processes": state.num_processes, "process": state.process_id}
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
        x = jax.tree_util.tree_map(
            lambda v: v.value if isinstance(v, keras.Variable) else v,
            x,
            is_leaf=lambda v: isinstance(v, keras.Variable),
        )
        return original(x, *args, **kwargs)

    device_put.__doc__ = original.__doc__
    device_put.__wrapped__ = original
    return mock.patch.object(jax, "device_put", device_put)


@contextlib.contextmanager
def locations_alike():
    """While a cell runs on JAX processes, the programs JAX compiles carry no Python source
    locations, so every process compiles the same program from the same cell.

    JAX puts up to ``jax_traceback_in_locations_limit`` user frames (10 in JAX 0.7, 100 in
    0.12) into each compiled program's locations. An IPython kernel names a cell's file after
    its own pid (``/tmp/ipykernel_<pid>/<hash>.py``), so the same cell on two engines gives
    two locations.
    JAX 0.12.0 ignored that; JAX 0.12.1 (tested here: jax and jaxlib 0.12.1 on CPU, Gloo)
    does not: a ``jit`` with a collective, called from different files on two processes,
    waits forever in the collective (two plain processes reproduce it with
    ``exec(compile(code, f"/tmp/cell_{rank}.py", "exec"))``; named files alike, it returns).
    Keras' ``fit`` under ``DataParallel`` hangs at its first step so. With the limit 0 the
    programs match and it trains; only XLA's dumps and profiles lose the cell's line numbers.
    No upstream report found as of 6 Dec 2026. Undone after the cell."""
    import jax

    before = getattr(jax.config, "jax_traceback_in_locations_limit", None)  # jax >= 0.4.14
    if before is None:
        yield
        return
    jax.config.update("jax_traceback_in_locations_limit", 0)
    try:
        yield
    finally:
        jax.config.update("jax_traceback_in_locations_limit", before)
