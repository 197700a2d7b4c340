"""Small shims for differences between versions of the libraries kdist runs on.

Each function names the versions it bridges and where the change came from, so an upgrade
that drops an old version touches this file only.
"""

from __future__ import annotations

from typing import Any


def net_connections(process: Any, kind: str = "inet") -> list:
    """``psutil.Process.net_connections(kind)``; its older name ``connections`` on psutil < 6.0.

    psutil 6.0.0 (June 2024) renamed ``Process.connections`` to ``net_connections``
    (giampaolo/psutil#2201); Colab ships psutil 5.9.5.
    """
    method = getattr(process, "net_connections", None) or process.connections
    return method(kind)


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


def jax_backend_ready() -> bool:
    """Whether JAX's backends already exist (then reading TPU memory cannot start them).

    ``jax._src.xla_bridge._backends`` (jax 0.7.2 to 0.12.0); no public accessor. Never starts
    a backend itself."""
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", None))
    except Exception:
        return False


def tf_started() -> bool:
    """Whether TensorFlow's eager context exists in this process (then its collectives, and a
    MultiWorkerMirroredStrategy, can no longer be set up).

    ``tensorflow.python.eager.context.context()._context_handle`` (TF 2.16 to 2.21); TF has no
    public "is the runtime up" question. A TF without it counts as started (the safe answer:
    the engine restarts)."""
    import sys

    if "tensorflow" not in sys.modules:
        return False
    try:
        from tensorflow.python.eager import context

        return context.context()._context_handle is not None
    except Exception:  # pragma: no cover - a TF without these internals
        return True


def colab_widgets_enabled() -> bool:
    """On Colab, turn on its custom widget manager (third-party widgets such as anywidget
    show only with it), once per kernel; True when this call turned it on.

    Colab's front end renders only its built-in widgets unless
    ``google.colab.output.enable_custom_widget_manager()`` was called (Colab's
    "Third-party Jupyter widgets" notes); nothing happens outside Colab. The "once" is
    remembered on Colab's own module, not in kdist.
    """
    import sys

    colab = sys.modules.get("google.colab")
    if colab is None or getattr(colab, "_kdist_widgets_on", False):
        return False
    colab._kdist_widgets_on = True
    try:
        colab.output.enable_custom_widget_manager()
    except Exception:
        return False
    return True


def keras_name_uids() -> dict | None:
    """Keras 3's per-process counters behind automatic names ("dense_3"), or None when Keras
    is not imported. Keras 3.0-3.15 keep them in ``global_state`` as ``object_name_uids``
    (``keras.src.utils.naming.get_uid``). A process that joins an elastic run takes the
    others' counters, so the same cell names its layers (and so Horovod's collectives, which
    are keyed by op names) as theirs."""
    import sys

    if "keras" not in sys.modules:
        return None
    try:
        from keras.src.backend.common import global_state
    except ImportError:
        return None
    return dict(global_state.get_global_attribute("object_name_uids") or {})


def set_keras_name_uids(uids: dict) -> None:
    import collections

    from keras.src.backend.common import global_state

    global_state.set_global_attribute("object_name_uids", collections.defaultdict(int, uids))


def layout_key_matches(key: str, path: str) -> bool:
    """Whether a ``keras.distribution.LayoutMap`` key matches a variable path, by the installed
    Keras' own rule: Keras 3.15 takes a key as a regex that must match the whole path
    (``re.fullmatch``), Keras 3.13 (Colab's) one found anywhere in it (``re.search``), so
    ``"d1/kernel"`` matches a Sequential's ``sequential/d1/kernel`` on 3.13 and not on 3.15.
    The rule is read from Keras itself (its lookup on a map holding only a key ``b``, asked for
    ``ab``), not from a version number."""
    import re

    rule = re.search if _layout_keys_searched() else re.fullmatch
    return key == path or rule(key, path) is not None


def _layout_keys_searched() -> bool:
    global _SEARCHED
    if _SEARCHED is None:
        import keras

        probe = keras.distribution.LayoutMap.__new__(keras.distribution.LayoutMap)
        probe._layout_map = {"b": "found"}  # the private store both versions look keys up in
        _SEARCHED = probe["ab"] is not None
    return _SEARCHED


_SEARCHED: bool | None = None


def shard_at_init() -> bool:
    """Keras on JAX (3.13 to 3.15) creates a sharded variable whole and then splits it, unless
    the variable is at least 250 MB (on 3.15, counted times the mesh's size): the whole copy is
    the peak a sharded model was meant to avoid (keras-team/keras#21634, out-of-memory at
    initialisation; the threshold's rule: keras-team/keras#22116). Under kdist's sharded
    distribution every variable laid out over a mesh axis is created already split (Keras' own
    path for large ones: its initializer jitted with the sharding as ``out_shardings``);
    replicated ones are left to Keras. The costs are Keras' own for large variables, now paid
    by every sharded one: a compilation each when the model is built (kdist's automatic layout
    shards only variables above a size threshold, so few), and an initializer must be one jit
    can trace (Keras' own are; one seeded with a ``SeedGenerator`` is not). Process-wide once
    applied (a later ``ModelParallel`` of the cell's own benefits too). Idempotent; returns
    whether it is in place (False where Keras has no such hook)."""
    try:
        from keras.src.backend.jax import core
    except ImportError:
        return False
    keras_rule = getattr(core, "should_shard_at_init", None)
    if keras_rule is None:
        return False
    if getattr(keras_rule, "kdist", False):
        return True

    def should_shard_at_init(init_layout, shape):
        spec = getattr(init_layout, "spec", None)
        if spec is not None and any(axis is not None for axis in spec):
            return True
        return keras_rule(init_layout, shape)

    should_shard_at_init.kdist = True
    core.should_shard_at_init = should_shard_at_init
    return True


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
