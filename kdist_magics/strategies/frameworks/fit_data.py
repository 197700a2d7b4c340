"""In-memory data given to ``fit``/``evaluate``/``predict``, fitted to how a run divides the work.

Keras (<= 3.15) takes a NumPy array given to ``fit`` as the calling process's own data and
needs batches that split over its devices. The wrappers here change the arguments of
``keras.Model.fit/evaluate/predict`` while a cell runs (:func:`patched_data_methods`, the one
mechanism), so the cell stays ordinary Keras:

* :func:`~kdist_magics.strategies.frameworks.on_jax.divisible_batches` (one process, several devices);
* :func:`process_shards` (several processes: each takes its contiguous 1/N of the samples,
  equal sizes, so every process makes the same number of steps), used by multiworker under
  JAX and torch.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable


def _rows(x) -> int | None:
    if isinstance(x, dict):
        x = next(iter(x.values()), None)
    elif isinstance(x, (list, tuple)):
        x = x[0] if x else None
        return _rows(x)
    shape = getattr(x, "shape", None)
    if shape is None or not len(shape) or not hasattr(x, "__getitem__"):
        return None
    return int(shape[0])


def _map(fn, x):
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, v) for v in x)
    return fn(x)


def _arrays(*parts) -> bool:
    """True when every part given is an in-memory array (or a structure of them)."""

    def ok(x):
        if x is None:
            return True
        if isinstance(x, dict):
            return all(ok(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return all(ok(v) for v in x)
        return _rows(x) is not None

    return parts[0] is not None and all(ok(p) for p in parts)


@contextlib.contextmanager
def patched_data_methods(wrap: Callable[[str, Callable], Callable]):
    """While open, ``keras.Model.fit/evaluate/predict`` are ``wrap(name, original)``; put back
    after. The one mechanism behind :func:`divisible_batches` and the JAX processes' shards."""
    import keras

    originals = {name: getattr(keras.Model, name) for name in ("fit", "evaluate", "predict")}
    for name, original in originals.items():
        method = wrap(name, original)
        method.__wrapped__ = original
        method.__doc__ = original.__doc__
        setattr(keras.Model, name, method)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(keras.Model, name, original)


def said_once(say: Callable[[str], None]) -> Callable[[str], None]:
    """``say``, but each distinct message only the first time."""
    said: set[str] = set()

    def once(message: str) -> None:
        if message not in said:
            said.add(message)
            say(message)

    return once


def shard(parts: dict[str, Any], rank: int, n: int, what: str, say) -> dict[str, Any]:
    rows = _rows(parts["x"])
    each = rows // n
    if each == 0:
        raise ValueError(f"kdist: {rows} {what} samples cannot be shared by {n} processes; give at least {n}")
    if rows % n:
        say(
            f"kdist: leaving out the last {rows % n} of {rows} {what} samples so every process gets "
            f"{each} (the same number of steps on each)"
        )
    lo, hi = rank * each, (rank + 1) * each
    return {k: _map(lambda a: a[lo:hi], v) for k, v in parts.items()}


def _validation_sharded(a: dict, x, y, sw, part: int, parts: int, once):
    """``fit``'s validation data (``a``: its bound arguments) as ``part`` of ``parts``: Keras'
    ``validation_split`` done here first, so both parts are sharded; the training arrays left."""
    split = float(a.get("validation_split") or 0.0)
    if split and a.get("validation_data") is None:  # Keras' split, then shard both parts
        at = int(_rows(x) * (1.0 - split))
        a["validation_data"] = tuple(_map(lambda v: v[at:], p) for p in (x, y, sw) if p is not None)
        x, y, sw = (_map(lambda v: v[:at], p) for p in (x, y, sw))
        a["validation_split"] = 0.0
    val = a.get("validation_data")
    if isinstance(val, tuple) and _arrays(*val):
        keys = ("x", "y", "sample_weight")[: len(val)]
        mine = shard(dict(zip(keys, val)), part, parts, "validation", once)
        a["validation_data"] = tuple(mine[k] for k in keys)
    return x, y, sw


@contextlib.contextmanager
def process_shards(
    rank: int,
    n: int,
    say=print,
    fit_callbacks: Callable[[], list] = list,
    no_predict: str = "",
    position: Callable[[], tuple[int, int, bool]] | None = None,
):
    """While open, ``fit``/``evaluate`` given in-memory arrays use process ``rank``'s 1/``n``;
    ``predict`` takes all of its input on every process.

    ``fit_callbacks()``: callbacks the backend adds to every ``fit`` (process 0's weights at
    the start, gradient averaging); ``no_predict``: when set, ``predict`` raises it;
    ``position()``: when given, asked at each call for ``(part, parts, replicated)`` instead of
    ``(rank, n)`` (JAX: the data-axis position, :func:`.on_jax.feeding`); ``fit_callbacks`` only where
    the model is ``replicated``.
    """
    once = said_once(say)

    def wrap(name: str, original):
        signature = inspect.signature(original)

        def method(model, *args, **kwargs):
            __tracebackhide__ = True  # not in the user's traceback
            if name == "predict":  # every process holds the whole model: all of x, everywhere
                if n > 1 and no_predict:
                    raise RuntimeError(no_predict)
                return original(model, *args, **kwargs)
            try:
                bound = signature.bind(model, *args, **kwargs)
            except TypeError:
                return original(model, *args, **kwargs)
            a = bound.arguments
            part, parts, replicated = position() if position is not None else (rank, n, True)
            if name == "fit" and n > 1 and replicated:
                a["callbacks"] = list(a.get("callbacks") or []) + list(fit_callbacks())
            x, y, sw = a.get("x"), a.get("y"), a.get("sample_weight")
            if parts == 1 or not _arrays(x, y, sw) or a.get("steps") or a.get("steps_per_epoch"):
                return original(*bound.args, **bound.kwargs)
            if name == "fit":
                x, y, sw = _validation_sharded(a, x, y, sw, part, parts, once)
            mine = shard(
                {"x": x, "y": y, "sample_weight": sw}, part, parts, "training" if name == "fit" else "evaluation", once
            )
            a.update({k: v for k, v in mine.items() if k in a or v is not None})
            return original(*bound.args, **bound.kwargs)

        return method

    with patched_data_methods(wrap):
        yield
