"""What kdist asks of JAX, for every family that runs Keras on JAX: the devices a cell gets
(:func:`plan_devices`: every GPU or TPU core, or N CPU devices configured before JAX starts),
what ``strategy`` is bound to for data parallelism (:class:`DataParallelStrategy`, over
``keras.distribution.DataParallel``) and batches that split evenly over the devices
(:func:`divisible_batches`), and which rows of in-memory arrays a JAX process feeds
(:func:`data_position`, :func:`feeding`).

Batches must split evenly over the devices, or XLA fails with an ``IndivisibleError`` deep in
``fit``. For in-memory arrays kdist handles it for the user while the cell runs:

* ``fit``/``evaluate``: a ``batch_size`` (default 32) that is not a multiple of the device
  count is rounded down to one (at least one sample per device), and when the number of
  samples is not a multiple of the device count the last ``N mod devices`` samples are left
  out (fewer than one per device); each adjustment is printed once as a ``kdist:`` line.
  ``validation_split`` is done by kdist (same split as Keras) so both parts are adjusted.
* ``predict``: the input is padded by repeating its last row and the padding is cut from the
  output, so every sample gets its prediction.

Datasets and generators are the user's to batch: ``drop_remainder=True`` with a batch size
that is a multiple of ``strategy.num_replicas_in_sync``. The in-kernel data parallelism is
:mod:`..kernel.jax_dp`, sharding :mod:`..sharded`, JAX processes :mod:`..processes.jax_processes`;
JAX's version workarounds are :mod:`.compat_jax`.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from typing import Any, Callable

from ...errors import DevicesFixed, StrategyUnavailable, no_tpu
from .backends import CPU_DEFAULT_DEVICES
from .fit_data import _arrays, _map, _rows, patched_data_methods, said_once


class DataParallelStrategy:
    """What ``strategy`` is bound to on the JAX backend."""

    def __init__(self, distribution, devices):
        self.distribution = distribution
        self.devices = list(devices)

    @property
    def num_replicas_in_sync(self) -> int:
        return len(self.devices)

    def scope(self):
        return self.distribution.scope()

    def __repr__(self) -> str:
        kinds = sorted({d.platform for d in self.devices})
        return f"<DataParallelStrategy {len(self.devices)} {'/'.join(kinds)} devices (keras.distribution.DataParallel)>"


# -- batches that split evenly -------------------------------------------------
def data_parallel(devices) -> Any:
    """Keras' DataParallel over ``devices``, inputs not split by Keras (kdist feeds each process
    its own rows: :func:`feeding`)."""
    import keras

    return keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)


def _pad(x, to: int):
    import numpy as np

    def pad(a):
        a = np.asarray(a)
        extra = to - a.shape[0]
        return np.concatenate([a, np.repeat(a[-1:], extra, axis=0)]) if extra > 0 else a

    return _map(pad, x)


@contextlib.contextmanager
def divisible_batches(n: int, say: Callable[[str], None] = print):
    """While open, ``keras.Model.fit/evaluate/predict`` keep every batch divisible by ``n``.

    The three method wrappers share the device count and the said-once messages
    (:class:`_Divisible`)."""
    with patched_data_methods(_Divisible(n, say).wrap):
        yield


class _Divisible:
    """Batch sizes and in-memory data cut to split evenly over ``n`` devices; each message
    said once."""

    def __init__(self, n: int, say: Callable[[str], None]):
        self.n = n
        self.once = said_once(say)

    def batch(self, b: int | None, what: str = "batch_size") -> int:
        n = self.n
        b = 32 if b is None else int(b)
        if b % n == 0:
            return b
        fixed = max(n, b // n * n)
        self.once(f"kdist: {what} {b} does not split over {n} devices; using {fixed} ({fixed // n} per device)")
        return fixed

    def trim(self, parts: dict[str, Any], what: str) -> dict[str, Any]:
        n = self.n
        rows = _rows(parts["x"])
        keep = rows // n * n
        if keep == rows:
            return parts
        if keep == 0:
            raise StrategyUnavailable(
                f"kdist: {rows} {what} samples cannot be split over {n} devices; give at least {n}"
            )
        self.once(
            f"kdist: leaving out the last {rows - keep} of {rows} {what} samples so every batch "
            f"splits evenly over {n} devices"
        )
        return {k: _map(lambda a: a[:keep], v) for k, v in parts.items()}

    def wrap(self, name: str, original: Callable) -> Callable:
        """``original`` (``fit``, ``evaluate`` or ``predict``) with its arguments made divisible."""
        signature = inspect.signature(original)

        def method(model, *args, **kwargs):
            __tracebackhide__ = True  # not in the user's traceback
            try:
                bound = signature.bind(model, *args, **kwargs)
            except TypeError:
                return original(model, *args, **kwargs)
            a = bound.arguments
            if (
                not _arrays(a.get("x"), a.get("y"), a.get("sample_weight"))
                or a.get("steps")
                or a.get("steps_per_epoch")
            ):
                return original(*bound.args, **bound.kwargs)
            if name == "predict":
                rows, padded = self._predict_args(a)
                out = original(*bound.args, **bound.kwargs)
                return _map(lambda o: o[:rows], out) if padded != rows else out
            a["batch_size"] = self.batch(a.get("batch_size"))
            if name == "fit":
                self._fit_args(a)
            else:  # evaluate
                self._trim_args(a, "evaluation")
            return original(*bound.args, **bound.kwargs)

        return method

    def _predict_args(self, a: dict[str, Any]) -> tuple[int, int]:
        """``predict``'s input padded to a multiple of ``n`` rows: (rows, padded rows)."""
        x = a.get("x")
        rows = _rows(x)
        b = self.batch(a.get("batch_size"))
        padded = math.ceil(rows / self.n) * self.n
        a["batch_size"] = b
        if padded != rows:
            a["x"] = _pad(x, padded)
        return rows, padded

    def _trim_args(self, a: dict[str, Any], what: str) -> None:
        parts = self.trim({"x": a.get("x"), "y": a.get("y"), "sample_weight": a.get("sample_weight")}, what)
        a.update({k: v for k, v in parts.items() if k in a or v is not None})

    def _fit_args(self, a: dict[str, Any]) -> None:
        """``fit``'s arguments: ``validation_split`` made explicit, then both sets trimmed."""
        x, y, sw = a.get("x"), a.get("y"), a.get("sample_weight")
        split = float(a.get("validation_split") or 0.0)
        if split and a.get("validation_data") is None:
            rows = _rows(x)
            at = int(math.floor(rows * (1.0 - split)))

            def tail(p):
                return _map(lambda v: v[at:], p)

            def head(p):
                return _map(lambda v: v[:at], p)

            a["validation_data"] = (tail(x), tail(y)) + ((tail(sw),) if sw is not None else ())
            x, y, sw = head(x), head(y), head(sw)
            a["validation_split"] = 0.0
        parts = self.trim({"x": x, "y": y, "sample_weight": sw}, "training")
        a.update({k: v for k, v in parts.items() if k in a or v is not None})
        val = a.get("validation_data")
        if isinstance(val, tuple) and _arrays(*val):
            keys = ("x", "y", "sample_weight")[: len(val)]
            fixed = self.trim(dict(zip(keys, val)), "validation")
            a["validation_data"] = tuple(fixed[k] for k in keys)
            if a.get("validation_batch_size") is not None:
                a["validation_batch_size"] = self.batch(a["validation_batch_size"], "validation_batch_size")


def _gpus_by_nvml() -> int:
    from ...hardware import detect_gpus

    return len(detect_gpus())


def plan_devices(wanted: int | None, platform: str | None):
    """The JAX devices to use (configuring host devices while JAX has not started)."""
    import jax

    if platform == "tpu":
        try:
            devices = jax.devices("tpu")
        except RuntimeError:
            raise no_tpu("jax.devices('tpu')") from None
        return devices[:wanted] if wanted else devices
    if not _gpus_by_nvml() and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        try:  # only possible before JAX's backend starts
            jax.config.update("jax_num_cpu_devices", wanted or CPU_DEFAULT_DEVICES)
        except Exception:
            pass
    devices = jax.devices()
    asked = f"--devices {wanted}"
    if wanted is None and devices[0].platform == "cpu" and len(devices) < CPU_DEFAULT_DEVICES:
        wanted = CPU_DEFAULT_DEVICES  # as without JAX: N logical CPU devices, default 2
        asked = f"mirrored (default {wanted} CPU devices)"
    if wanted and wanted > len(devices):
        kind = devices[0].platform.upper()
        hint = (
            f" Restart the kernel and run this %%kdist cell before any other JAX code "
            f"(or start it with XLA_FLAGS=--xla_force_host_platform_device_count={wanted})."
            if kind == "CPU"
            else ""
        )
        raise DevicesFixed(
            f"{asked}: JAX in this kernel has {len(devices)} {kind} "
            f"device{'s' if len(devices) != 1 else ''}, fixed when it started.{hint} "
            "The cell did not run."
        )
    return devices[:wanted] if wanted else devices


# -- which rows a JAX process feeds ------------------------------------------------
# Keras on JAX builds each global batch from every process's own rows
# (``jax.make_array_from_process_local_data``): processes on the same position of the data
# ("batch") axis must give the same rows, and each position its own contiguous part. Under
# kdist's ``DataParallel`` that is one part per process; under a ``ModelParallel`` whose model
# axis spans processes (mesh 1x2 over two processes) every process gives every row. Equal parts,
# so every process makes the same number of steps (:func:`.fit_data.shard`).
def data_position(distribution) -> tuple[int, int]:
    """``(position, positions)``: this process's part of the data and how many parts there are."""
    import jax
    import numpy as np

    mesh = distribution.device_mesh
    devices = np.asarray(mesh.backend_mesh.devices)
    axis = list(mesh.axis_names).index(distribution.batch_dim_name)
    me = jax.process_index()
    rows = sorted({index[axis] for index in np.ndindex(devices.shape) if devices[index].process_index == me})
    total = devices.shape[axis]
    if not rows or total % len(rows):  # pragma: no cover - a mesh kdist does not make
        return 0, 1
    return rows[0] // len(rows), total // len(rows)


def feeding(ours, process: int, processes: int):
    """A function giving ``(position, positions, replicated)`` for the distribution in use when
    ``fit`` is called: ``ours`` (kdist's), or one the cell set itself. A cell's own distribution
    gets ``auto_shard_dataset = False``: kdist feeds its process the data position's part, which
    Keras' auto-sharding (tf.data only) would otherwise refuse for arrays."""

    def position():
        import keras

        dist = keras.distribution.distribution() or ours
        replicated = isinstance(dist, keras.distribution.DataParallel)
        if dist is ours and replicated:
            return process, processes, True
        if dist is not ours and getattr(dist, "_is_multi_process", False):
            dist.auto_shard_dataset = False
        at, parts = data_position(dist)
        return at, parts, replicated

    return position
