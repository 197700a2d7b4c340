"""Values crossing between an engine and the kernel (``--pull``, a cell's last value).

Both sides of one codec: on the engine :func:`fetch`/:func:`last_value` turn values into a
travelling form (:func:`pack`: Keras models as ``.keras`` archives, History objects as their
fields, anything else as itself), in the kernel :func:`unpack` turns that form back.
"""

from __future__ import annotations

import os
from typing import Any


def fetch(names: list[str]) -> dict[str, Any]:
    """``--pull``: the named values from the user namespace, ready to travel.

    Keras models travel as ``.keras`` archives (architecture, weights, compile state)
    and History objects as their ``history``/``params``/``epoch``; other values as
    themselves (as ipyparallel serialises them; one that cannot travel is reported by name).
    Raises KeyError naming every missing name.
    """
    from IPython import get_ipython
    from ipyparallel.serialize import serialize_object

    ns = get_ipython().user_ns
    missing = [n for n in names if n not in ns]
    if missing:
        raise KeyError(f"not defined on rank 0: {', '.join(missing)}")
    out: dict[str, Any] = {}
    for name in names:
        value = ns[name]
        packed = pack(value)
        if packed is None:
            try:
                serialize_object(value)  # what ipyparallel will do with the reply
            except Exception as exc:
                raise TypeError(
                    f"{name} ({type(value).__name__}) cannot travel to the notebook: {type(exc).__name__}: {exc}"
                ) from None
            packed = ("value", value)
        out[name] = packed
    return out


def last_value(count: int | None = None):
    """The cell's last expression value in a travelling form.

    ``count``: the cell's execution count (from its ``execute_result``): the value is read
    from the output cache (``_oh[count]``), which a cell that assigns ``_`` itself (``for _
    in range(5)``) cannot shadow; ``_`` is the fallback when the cache is off.
    """
    from IPython import get_ipython

    ns = get_ipython().user_ns
    cache = ns.get("_oh")
    if count is not None and isinstance(cache, dict) and count in cache:
        value = cache[count]
    else:
        value = ns.get("_")
    return pack(value) or ("value", value)


def pack(value: Any):
    """A travelling form for Keras models and History objects, else None."""
    import sys

    keras = sys.modules.get("keras")
    if keras is None:
        return None
    if isinstance(value, keras.Model):
        import tempfile

        from .gather import save

        with tempfile.TemporaryDirectory(prefix="kdist-pull-") as tmp:
            path = os.path.join(tmp, "model.keras")
            save(value, path)  # a model sharded over JAX processes: gathered, ordinary (collective)
            with open(path, "rb") as f:
                return ("keras_model", f.read())
    if isinstance(value, keras.callbacks.History):
        model = getattr(value, "model", None)
        return (
            "keras_history",
            {
                "history": dict(value.history),
                "params": dict(value.params or {}),
                "epoch": list(getattr(value, "epoch", [])),
                "model": pack(model) if model is not None else None,
            },
        )
    return None


def unpack(packed) -> Any:
    """In the kernel: the value for a :func:`pack`/:func:`fetch` form."""
    kind, data = packed
    if kind == "value":
        return data
    import keras

    if kind == "keras_model":
        import tempfile

        with tempfile.TemporaryDirectory(prefix="kdist-pull-") as tmp:
            path = os.path.join(tmp, "model.keras")
            with open(path, "wb") as f:
                f.write(data)
            return keras.saving.load_model(path)
    if kind == "keras_history":
        history = keras.callbacks.History()
        history.history = data["history"]
        history.params = data["params"]
        history.epoch = data["epoch"]
        if data.get("model") is not None:
            history.set_model(unpack(data["model"]))
        return history
    raise ValueError(f"unknown packed kind {kind!r}")


def pushable(ns: dict, names) -> dict:
    """The ``--push`` values from namespace ``ns``, checked before anything starts: defined,
    and able to travel (as ipyparallel will send them; functions included)."""
    from ipyparallel.serialize import serialize_object

    from ..errors import KDistError

    missing = [n for n in names if n not in ns]
    if missing:
        raise KDistError(f"--push: {', '.join(missing)} not defined in the notebook")
    out = {}
    for name in names:
        try:
            serialize_object(ns[name])
        except Exception as exc:
            raise KDistError(
                f"--push: {name} ({type(ns[name]).__name__}) cannot travel to the engines: {type(exc).__name__}: {exc}"
            ) from None
        out[name] = ns[name]
    return out
