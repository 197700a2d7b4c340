"""``--strategy default``: TensorFlow's default (no-op) strategy, in the notebook.

The degenerate case: one replica, the cell in the notebook's namespace with
``strategy`` bound. It proves the in-kernel path end to end and is what
``--strategy auto`` picks for a small job on one device.
"""

from __future__ import annotations

from typing import Any

from ..base import RunContext, Strategy
from .run import run_cell_here


class DefaultStrategy(Strategy):
    name = "default"

    def run(self, cell: str, ctx: RunContext) -> Any:
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
        ctx.record.set_rank(0, state="running", device="default")
        value = run_cell_here(cell, ctx, scope=strategy.scope(), bind={"strategy": strategy})
        ctx.record.set_rank(0, state="done")
        return value
