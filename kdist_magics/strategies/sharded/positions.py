"""Which part of in-memory arrays a JAX process feeds ``fit``/``evaluate``: its position on the
data axis of the distribution in use.

Keras on JAX builds each global batch from every process's own rows
(``jax.make_array_from_process_local_data``): processes on the same position of the data
("batch") axis must give the same rows, and each position its own contiguous part. Under kdist's
``DataParallel`` that is one part per process; under a ``ModelParallel`` whose model axis spans
processes (mesh 1x2 over two processes) every process gives every row. Equal parts, so every
process makes the same number of steps (:func:`.fit_data.shard`).
"""

from __future__ import annotations


def data_position(distribution) -> tuple[int, int]:
    """``(position, positions)``: this process's part of the data and how many parts there are."""
    import jax
    import numpy as np

    mesh = distribution.device_mesh
    devices = np.asarray(mesh.backend_mesh.devices)
    axis = list(mesh.axis_names).index(distribution.batch_dim_name)
    me = jax.process_index()
    rows = sorted({index[axis] for index in np.ndindex(devices.shape)
                   if devices[index].process_index == me})
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
