"""Keras 3 on JAX: ``keras.distribution.DataParallel`` behind ``--strategy mirrored|tpu``.

Used when ``keras.backend.backend() == "jax"``. The flags are the same: mirrored
takes all GPUs (or ``--devices N`` of them); without GPUs the host CPU is split
into N devices (``jax_num_cpu_devices``, default 2) when JAX's backend has not
started yet -- like TensorFlow, JAX fixes its devices at start-up, so a kernel
that already started with fewer devices gets a restart hint and the cell does
not run. ``tpu`` takes every TPU core from ``jax.devices("tpu")``.

``strategy`` is bound to a small :class:`~..frameworks.on_jax.DataParallelStrategy` with the
tf.distribute-like surface notebooks use (``num_replicas_in_sync``,
``scope()``) and the Keras ``distribution`` itself.

Batches that split evenly over the devices and the devices themselves are what every family
asks of JAX: :mod:`..frameworks.on_jax` (:func:`~..frameworks.on_jax.divisible_batches`,
:func:`~..frameworks.on_jax.plan_devices`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..base import RunContext
from ..frameworks import on_jax
from ..frameworks.compat_jax import device_put_takes_keras_variables
from .run import run_cell_here


class JaxDataParallel:
    """The in-kernel JAX path shared by mirrored and tpu."""

    def __init__(self, platform: str | None = None):
        self.platform = platform
        self._strategies: dict[tuple, on_jax.DataParallelStrategy] = {}
        self.current: on_jax.DataParallelStrategy | None = None

    def run(self, cell: str, ctx: RunContext) -> Any:
        import keras

        devices = on_jax.plan_devices(ctx.spec.devices, self.platform)
        key = tuple(d.id for d in devices)
        strategy = self._strategies.get(key)
        if strategy is None:
            strategy = on_jax.DataParallelStrategy(keras.distribution.DataParallel(devices=devices), devices)
            self._strategies[key] = strategy
        self.current = strategy
        n = len(devices)
        if n == 1 and self.platform == "tpu" and not ctx.quiet:  # Colab's v5e-1, v6e-1
            from ...messages import one_tpu_chip, say

            say(one_tpu_chip(str(devices[0])))
        for rank, device in enumerate(devices):
            ctx.record.set_rank(rank, state="running", device=str(device))
        scope = contextlib.ExitStack()
        scope.enter_context(strategy.scope())
        scope.enter_context(device_put_takes_keras_variables())  # Keras' JAX guide, on JAX 0.12
        if n > 1:
            scope.enter_context(on_jax.divisible_batches(n))
        value = run_cell_here(cell, ctx, scope=scope, bind={"strategy": strategy})
        for rank in range(n):
            ctx.record.set_rank(rank, state="done")
        return value

    def status(self) -> dict[str, Any]:
        if self.current is None:
            return {}
        return {"backend": "jax", "replicas": self.current.num_replicas_in_sync}
