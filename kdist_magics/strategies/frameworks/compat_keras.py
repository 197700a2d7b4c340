"""Keras 3: its automatic-name counters, ``LayoutMap``'s key rule, and when Keras on JAX creates
a sharded variable, as the strategies need them.

Each function names the Keras versions it was checked against and the upstream change."""

from __future__ import annotations


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
    """Set Keras' automatic-name counters to ``uids`` (as :func:`keras_name_uids` read them)."""
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
