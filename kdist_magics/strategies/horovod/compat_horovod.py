"""Workarounds for Horovod 0.28.1's TensorFlow API (the release ``build`` makes), run on a rank.

Horovod wraps some collectives in a ``tf.function`` it keeps for the life of the process
(``horovod.tensorflow.util._cache``): ``functions._make_broadcast_group_fn`` and
``_make_inplace_broadcast_group_fn`` (``broadcast_variables``, which the
``BroadcastGlobalVariablesCallback`` calls) and ``_make_cached_allreduce_grads_fn``
(``DistributedGradientTape``). TensorFlow reuses a trace for variables of the same shapes and
dtypes, and the collectives inside are named after the variables the trace was made with;
Horovod matches the ranks' collectives by name. So an engine that broadcast another model of
the same shape before (``sequential_1/dense/kernel``) broadcasts a new one under the old
names, a fresh engine under the new (``sequential/dense/kernel``), and both wait for ever: seen
on a cluster the user started, a cell at ``--np 1`` then at ``--np 2`` (kdist's own engines
restart when ``--np`` changes), and in ``%kdist scale`` on such a cluster. No upstream issue
found (7 Dec 2026); Horovod's own tests run one model per process.
"""

from __future__ import annotations


def _cached() -> list:
    """Horovod's process-long caches of traced collectives (those present in this release)."""
    import horovod.tensorflow as core
    from horovod.tensorflow import functions

    makers = (
        getattr(functions, "_make_broadcast_group_fn", None),
        getattr(functions, "_make_inplace_broadcast_group_fn", None),
        getattr(core, "_make_cached_allreduce_grads_fn", None),
    )
    return [
        cell.cell_contents
        for maker in makers
        for cell in getattr(maker, "__closure__", None) or ()
        if isinstance(cell.cell_contents, dict)
    ]


def fresh_traces() -> int:
    """Forget every traced collective Horovod kept (at each ``hvd.init``): a run's first
    broadcast traces anew, named after its own variables, on every rank alike. How many
    traces were forgotten."""
    forgotten = 0
    for cache in _cached():
        forgotten += len(cache)
        cache.clear()
    return forgotten
