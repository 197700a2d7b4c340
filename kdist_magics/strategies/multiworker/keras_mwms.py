"""A narrow fix that lets Keras 3 ``fit`` run under MultiWorkerMirroredStrategy.

The bug: https://github.com/keras-team/keras/issues/20585 (open as of Keras 3.15.1).
``model.fit`` (and ``evaluate``) under ``tf.distribute.MultiWorkerMirroredStrategy``
with two or more workers fails before the first step with::

    ValueError: Attempt to convert a value (PerReplica:{...}) with an
    unsupported type (<class '...values.PerReplica'>) to a Tensor.

Two causes, both in ``keras/src/backend/tensorflow/trainer.py`` (Keras 3.15.1):

1. ``TensorFlowTrainer._maybe_symbolic_build`` takes the first distributed
   batch and passes the whole nested structure ``(x, y)`` to
   ``strategy.reduce("MEAN", batch, axis=None)`` only to learn its shapes and
   dtypes for ``_symbolic_build``. ``Strategy.reduce`` takes one value, not a
   structure; with several workers the collective path calls
   ``convert_to_tensor`` on the tuple of ``PerReplica`` values and raises the
   error above. The reduce is also a needless cross-worker collective:
   ``_symbolic_build`` reads only ``shape`` and ``dtype``.
2. Past that, ``reduce_per_replica(..., reduction="auto")`` (the train/test
   step's logs) takes the multi-worker branch ``strategy.reduce("MEAN", v,
   axis=0)`` for every log value; the loss and metric results are scalars, so
   the first step fails with ``Invalid reduction dimension 0 for input with 0
   dimensions``.

The fix, active only while :func:`applied` is (and only for a
``MultiWorkerMirroredStrategy`` in multi-worker mode; everything else goes to
Keras's own code unchanged):

1. ``_maybe_symbolic_build`` gives ``_symbolic_build`` this worker's first
   local replica batch (``strategy.experimental_local_results(v)[0]`` per
   leaf): the same per-replica shapes and dtypes the MEAN would have had, and
   no collective.
2. ``reduce_per_replica`` reduces scalar log values with ``strategy.reduce(
   "MEAN", v, axis=None)`` (the mean over all replicas of all workers, which
   is what ``axis=0`` means for a value with a batch axis); values with a
   batch axis, and other reductions, go to Keras's function.

Scope: kdist enters :func:`applied` on every engine of a ``--strategy
multiworker`` run and leaves it when the cell ends; nothing is patched outside
kdist runs or on import. Each part is applied only while the installed Keras
still has the code it replaces (:func:`needed` says why or why not), so the
patch does nothing once Keras is fixed. When Keras releases a fix, set
:data:`FIXED_IN` and delete this module; ``tests/test_keras_mwms.py`` also runs
stock Keras and fails once the stock failure is gone, which is the signal.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

ISSUE = "https://github.com/keras-team/keras/issues/20585"
#: first Keras version with the upstream fix (unknown as of 3.15.1)
FIXED_IN: tuple[int, ...] | None = None

_lock = threading.Lock()
_state: dict[str, Any] = {"depth": 0, "originals": {}}


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _trainer_module():
    from keras.src.backend.tensorflow import trainer

    return trainer


def _code_objects(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_consts"):
            yield from _code_objects(const)


def _build_has_bug(module) -> bool:
    """``_maybe_symbolic_build`` still reduces the data batch across workers."""
    method = _state["originals"].get("build") or module.TensorFlowTrainer._maybe_symbolic_build
    return "reduce" in method.__code__.co_names


def _logs_have_bug(module) -> bool:
    """``reduce_per_replica`` still has the multi-worker ``reduce("MEAN", v, axis=0)``."""
    func = _state["originals"].get("logs") or module.reduce_per_replica
    for code in _code_objects(func.__code__):
        consts = code.co_consts
        if "MEAN" in consts and ("axis",) in consts and 0 in consts:
            return True
    return False


def needed() -> tuple[bool, str]:
    """(whether the fix applies to the installed Keras, why in words)."""
    try:
        import keras
    except ImportError:
        return False, "Keras is not installed"
    version = keras.version()
    if _version(version) < (3,):
        return False, f"Keras {version} (Keras 2 has no such bug)"
    if FIXED_IN is not None and _version(version) >= FIXED_IN:
        return False, f"Keras {version} includes the upstream fix"
    if keras.backend.backend() != "tensorflow":
        return False, f"Keras backend is {keras.backend.backend()}, not tensorflow"
    parts = _parts(_trainer_module())
    if not parts:
        return False, f"Keras {version} no longer has the code this fix replaces"
    return True, f"Keras {version} has {ISSUE} ({', '.join(parts)})"


def _parts(module) -> list[str]:
    return [name for name, has_bug in (("build", _build_has_bug), ("logs", _logs_have_bug)) if has_bug(module)]


def _multiworker(strategy) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and strategy.extended._in_multi_worker_mode()


def _fixed_build(original):
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if strategy is None or iterator is None or not _multiworker(strategy):
            return original(self, iterator=iterator, data_batch=data_batch)
        import tensorflow as tf
        from keras.src import tree

        batch = None
        for _, _, it in iterator:  # the first batch, as Keras does (fit resets the iterator)
            batch = next(it)
            break
        if batch is None:  # pragma: no cover - an empty dataset: let Keras say so
            return original(self, iterator=iterator, data_batch=data_batch)

        def local(value):
            if isinstance(value, tf.distribute.DistributedValues):
                return strategy.experimental_local_results(value)[0]
            return value

        with strategy.scope():
            self._symbolic_build(data_batch=tree.map_structure(local, batch))

    _maybe_symbolic_build.__doc__ = f"kdist_magics.strategies.multiworker.keras_mwms: no cross-worker reduce ({ISSUE})"
    _maybe_symbolic_build.__wrapped__ = original
    return _maybe_symbolic_build


def _fixed_logs(original):
    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not _multiworker(strategy):
            return original(values, strategy, reduction)
        import tensorflow as tf
        from keras.src import tree

        def reduce(value):
            local = value
            if isinstance(value, tf.distribute.DistributedValues):
                local = strategy.experimental_local_results(value)[0]
            if getattr(getattr(local, "shape", None), "rank", None) == 0:
                return strategy.reduce("MEAN", value, axis=None)
            return original(value, strategy, reduction)

        return tree.map_structure(reduce, values)

    reduce_per_replica.__doc__ = (
        f"kdist_magics.strategies.multiworker.keras_mwms: scalar logs reduce with axis=None ({ISSUE})"
    )
    reduce_per_replica.__wrapped__ = original
    return reduce_per_replica


def install() -> bool:
    """Apply the fix (nested calls are counted); True when it is active afterwards."""
    with _lock:
        if _state["depth"]:
            _state["depth"] += 1
            return True
        ok, _ = needed()
        if not ok:
            return False
        module = _trainer_module()
        parts = _parts(module)
        originals = _state["originals"] = {}
        if "build" in parts:
            originals["build"] = module.TensorFlowTrainer._maybe_symbolic_build
            module.TensorFlowTrainer._maybe_symbolic_build = _fixed_build(originals["build"])
        if "logs" in parts:
            originals["logs"] = module.reduce_per_replica
            module.reduce_per_replica = _fixed_logs(originals["logs"])
        _state["depth"] = 1
        return True


def uninstall() -> None:
    """Undo one :func:`install`; the last one restores Keras's own code."""
    with _lock:
        if not _state["depth"]:
            return
        _state["depth"] -= 1
        if _state["depth"]:
            return
        module = _trainer_module()
        originals, _state["originals"] = _state["originals"], {}
        if "build" in originals:
            module.TensorFlowTrainer._maybe_symbolic_build = originals["build"]
        if "logs" in originals:
            module.reduce_per_replica = originals["logs"]


def active() -> bool:
    return _state["depth"] > 0


@contextlib.contextmanager
def applied():
    """``with applied(): model.fit(...)``: the fix inside, Keras untouched outside.

    Yields whether the fix is active (False where Keras does not need it).
    """
    on = install()
    try:
        yield on
    finally:
        if on:
            uninstall()
