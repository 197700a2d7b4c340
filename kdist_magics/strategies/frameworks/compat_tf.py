"""TensorFlow 2.16-2.21: whether its runtime is up in this process, which TF cannot be asked
publicly."""

from __future__ import annotations


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
