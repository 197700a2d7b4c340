"""The link timed through the cell's own collective, on every rank at the end of a probed
``fit`` while that collective is up (:func:`kdist_magics.watch.step_probe.cells_own_link` calls
them in turn): Horovod's all-reduce (:func:`horovod_link`), ``torch.distributed``'s on the torch
processes' group (:func:`torch_link`: Gloo, or NCCL on GPUs), a sum across the processes
``jax.distributed`` joined, compiled by XLA (:func:`jax_link`: what Keras on JAX's data
parallelism all-reduces with) and the fitted model's own ``MultiWorkerMirroredStrategy``'s
(:func:`tf_link`: its collective ops). Each returns None where its collective is not up, and
every rank takes the same sizes (:func:`_timed_link`); the kernel reads the figures with
:func:`.link.from_ranks`.
"""

from __future__ import annotations

import statistics
from typing import Any

from .link import HOROVOD, JAX, TF, TINY, TORCH, _grown


def _timed_link(sum_ones, agree, n: int, nbytes: int, repeats: int) -> dict[str, Any]:
    """The link timed through a framework's all-reduce, on every rank alike: ``sum_ones(size)``
    all-reduces (sums) ``size`` bytes of ones and returns the result; ``agree(big, tiny)``
    returns every rank's maximum of the two. :data:`TINY` bytes, then ``nbytes`` (4 MiB at
    least, more while they take under :data:`BIG_OVER_TINY` times the tiny one, as the ring is
    timed); every rank takes the same sizes since all agree on each figure."""
    import time

    import numpy as np

    right = True

    def timed(size: int) -> list[float]:
        nonlocal right
        seconds = []
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            summed = sum_ones(max(size // 4, n))
            seconds.append(time.perf_counter() - start)
            right = right and bool(np.all(np.asarray(summed) == n))
        return seconds[1:]

    tiny_s = min(timed(TINY))
    big, tiny, nbytes = _grown(lambda size: agree(statistics.median(timed(size)), tiny_s), nbytes)
    return {"big_s": big, "tiny_s": tiny, "nbytes": nbytes, "right": right}


def horovod_link(nbytes: int, repeats: int = 3) -> dict[str, Any] | None:
    """On every rank of a horovod cell, at the end of a probed ``fit`` (Horovod is up then; it
    ends with the cell): the link timed through Horovod's all-reduce (:func:`_timed_link`).
    None where Horovod is not up with 2 ranks or more."""
    import itertools
    import sys

    core = sys.modules.get("horovod.tensorflow")
    if core is None or not core.is_initialized() or core.size() < 2:
        return None
    import tensorflow as tf

    n, names = core.size(), itertools.count()

    def sum_ones(count: int):
        return core.allreduce(tf.ones([count], tf.float32), op=core.Sum, name=f"kdist_link_{next(names)}").numpy()

    def agree(big: float, tiny: float) -> tuple[float, float]:
        both = core.allreduce(
            tf.constant([big, tiny], tf.float64), op=core.Max, name=f"kdist_link_{next(names)}"
        ).numpy()
        return float(both[0]), float(both[1])

    return {**_timed_link(sum_ones, agree, n, nbytes, repeats), "via": HOROVOD}


def torch_link(nbytes: int, repeats: int = 3) -> dict[str, Any] | None:
    """On every rank of a cell whose torch process group is up (multiworker with Keras on
    PyTorch), at the end of a probed ``fit``: the link timed through ``torch.distributed``'s
    all-reduce on the group's own backend (Gloo on the CPU, NCCL on GPUs), with tensors on the
    device that backend reduces (:func:`_timed_link`). None where no group of 2 ranks or more is
    up."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    import torch

    n, backend = dist.get_world_size(), str(dist.get_backend())
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def sum_ones(count: int):
        data = torch.ones(count, dtype=torch.float32, device=device)
        dist.all_reduce(data, op=dist.ReduceOp.SUM)
        return data.cpu().numpy()  # waits for the collective (NCCL's runs on a stream)

    def agree(big: float, tiny: float) -> tuple[float, float]:
        both = torch.tensor([big, tiny], dtype=torch.float64, device=device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        big, tiny = both.cpu().tolist()
        return float(big), float(tiny)

    return {**_timed_link(sum_ones, agree, n, nbytes, repeats), "via": TORCH.format(backend=backend)}


def jax_link(nbytes: int, repeats: int = 3) -> dict[str, Any] | None:
    """On every process of a cell that ``jax.distributed`` joins (multiworker with Keras on JAX,
    sharded across engines), at the end of a probed ``fit``: the link timed through a sum across
    the processes that XLA compiles to its all-reduce, one device per process (its first), as
    Keras' data parallelism reduces gradients (:func:`_timed_link`). None where JAX has not
    joined 2 processes or more (JAX's backends are not started here for the asking)."""
    import sys

    jax = sys.modules.get("jax")
    if jax is None or not _jax_joined(sys.modules):
        return None
    if jax.process_count() < 2:
        return None
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    firsts: dict[int, Any] = {}
    for device in jax.devices():
        firsts.setdefault(device.process_index, device)
    devices = [firsts[p] for p in sorted(firsts)]
    mine, n = firsts[jax.process_index()], len(devices)
    mesh = Mesh(np.array(devices), ("kdist_link",))
    across = NamedSharding(mesh, PartitionSpec("kdist_link"))
    everywhere = NamedSharding(mesh, PartitionSpec())  # the result on every process
    total = jax.jit(lambda x: x.sum(axis=0), out_shardings=everywhere)
    most = jax.jit(lambda x: x.max(axis=0), out_shardings=everywhere)

    def reduced(reduce, row: "np.ndarray"):
        local = jax.device_put(row[None, :], mine)
        out = reduce(jax.make_array_from_single_device_arrays((n, row.size), across, [local]))
        return np.asarray(out.addressable_shards[0].data)  # waits for the collective

    def sum_ones(count: int):
        return reduced(total, np.ones(count, np.float32))

    def agree(big: float, tiny: float) -> tuple[float, float]:
        both = reduced(most, np.array([big, tiny], np.float32))
        return float(both[0]), float(both[1])

    return {**_timed_link(sum_ones, agree, n, nbytes, repeats), "via": JAX.format(platform=mine.platform)}


def tf_link(nbytes: int, repeats: int = 3, model=None) -> dict[str, Any] | None:
    """On every worker of a multiworker cell on TensorFlow, at the end of a probed ``fit``: the
    link timed through ``model``'s own ``MultiWorkerMirroredStrategy`` (a sum across its
    replicas, compiled as a ``tf.function``, as Keras reduces the gradients; its collective ops)
    (:func:`_timed_link`). None where the model has no such strategy of 2 replicas or more."""
    import sys

    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    strategy = getattr(model, "distribute_strategy", None)  # Keras' TensorFlow trainer's
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    n = strategy.num_replicas_in_sync
    if n < 2:
        return None

    sum_op = tf.distribute.ReduceOp.SUM  # (no MAX: every replica's figures summed side by side)

    @tf.function(reduce_retracing=True)
    def total(x):
        return strategy.reduce(sum_op, strategy.run(tf.identity, args=(x,)), axis=None)

    @tf.function
    def side_by_side(x):
        def placed(x):
            mine = tf.distribute.get_replica_context().replica_id_in_sync_group
            return tf.scatter_nd([[mine]], x[None], [n, 2])

        return strategy.reduce(sum_op, strategy.run(placed, args=(x,)), axis=None)

    def sum_ones(count: int):
        return total(tf.ones([count], tf.float32)).numpy()

    def agree(big: float, tiny: float) -> tuple[float, float]:
        most = side_by_side(tf.constant([big, tiny], tf.float32)).numpy().max(axis=0)
        return float(most[0]), float(most[1])

    return {**_timed_link(sum_ones, agree, n, nbytes, repeats), "via": TF}


def _jax_joined(modules) -> bool:
    """``jax.distributed.initialize`` has run in this process (its client is up)."""
    state = getattr(modules.get("jax._src.distributed"), "global_state", None)
    return getattr(state, "client", None) is not None
