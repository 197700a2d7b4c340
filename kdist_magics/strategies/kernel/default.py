"""``--strategy default``: one device, the cell in the notebook as it is.

The degenerate case: one replica, the cell in the notebook's namespace with ``strategy``
bound. It proves the in-kernel path end to end and is what ``--strategy auto`` picks for a
small job on one device. On Keras' tensorflow backend ``strategy`` is TensorFlow's default
(no-op) strategy; on jax or torch, where TensorFlow may not be installed at all (Colab's TPU
runtime), it is :class:`OneDevice`, which has the same two members cells use.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..base import RunContext, Strategy
from ..frameworks.backends import keras_backend, require_tensorflow
from .run import run_cell_here


class OneDevice:
    """``strategy`` for a default cell on Keras' jax or torch backend: one replica, and a
    ``scope()`` that changes nothing (as TensorFlow's default strategy)."""

    num_replicas_in_sync = 1

    def __init__(self, backend: str):
        self.backend = backend

    def scope(self):
        return contextlib.nullcontext()

    def __repr__(self) -> str:
        return f"OneDevice(keras backend {self.backend!r})"


class DefaultStrategy(Strategy):
    name = "default"

    def run(self, cell: str, ctx: RunContext) -> Any:
        from .tpu_hygiene import refuse_if_held

        refuse_if_held(strategy="default")  # Colab's one TPU chip, held by a crashed kernel: named, not libtpu's error
        backend = keras_backend()
        if backend == "tensorflow":
            require_tensorflow("--strategy default on Keras' tensorflow backend")
            from ..frameworks.on_tf import current_strategy

            strategy = current_strategy()
        else:
            strategy = OneDevice(backend)
        ctx.record.set_rank(0, state="running", device="default")
        value = run_cell_here(cell, ctx, scope=strategy.scope(), bind={"strategy": strategy})
        ctx.record.set_rank(0, state="done")
        return value
