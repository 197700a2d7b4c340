"""A DistributedOptimizer's state beside Keras' tracking (:class:`_State`: the gradients
aggregated over ``backward_passes_per_step``, the allreduces' timing), and the variables and
tensors it works on."""

from __future__ import annotations

import os

import tensorflow as tf

import horovod.tensorflow as hvd_tf


def elastic() -> bool:
    """True in an elastic run (``HOROVOD_ELASTIC=1``): sizes are read by ops at run time, as
    Horovod's own collectives do, because a compiled step outlives a reset."""
    return os.environ.get("HOROVOD_ELASTIC", "0").strip() not in ("", "0")


def tf_variable(v):
    """The ``tf.Variable`` behind a Keras 3 variable (or ``v`` itself)."""
    if isinstance(v, tf.Variable):
        return v
    inner = getattr(v, "_value", None)
    if isinstance(inner, tf.Variable):
        return inner
    inner = getattr(v, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise TypeError(f"expected a Keras or TensorFlow variable, got {type(v).__name__}")


def _split(items, n):
    """``items`` in ``n`` contiguous, nearly equal chunks (no empty chunk)."""
    n = max(1, min(n, len(items)))
    q, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        stop = start + q + (1 if i < r else 0)
        out.append(items[start:stop])
        start = stop
    return out


class _Settings:
    """What DistributedOptimizer was asked for (plain object: Keras does not track it)."""

    def __init__(
        self,
        name,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        gradient_predivide_factor,
        op,
        backward_passes_per_step,
        average_aggregated_gradients,
        groups,
        process_set,
        scale_local_gradients,
    ):
        self.name = name
        self.device_dense = device_dense
        self.device_sparse = device_sparse
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.gradient_predivide_factor = gradient_predivide_factor
        self.op = op
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.average_aggregated_gradients = average_aggregated_gradients
        self.groups = groups
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients


class _State:
    """Per-optimizer runtime state, kept out of Keras' variable tracking so that the
    optimizer's ``variables`` (and so its saved state) are exactly the wrapped class's."""

    def __init__(self, settings: _Settings):
        self.s = settings
        self.local = []  # registered worker-local tf.Variables
        self.counter = None  # tf.Variable int32, backward passes since the last allreduce
        self.accumulators = None  # list of tf.Variable or None (for None gradients)
        #: the allreduce timed where it runs: its seconds summed, and how many (tf.Variables,
        #: made by the first traced step; read by kdist's telemetry: :func:`collective_timing`)
        self.collective_s = self.collectives = None

    # -- local variables -------------------------------------------------------------
    def is_local(self, var) -> bool:
        if not self.local:
            return False
        ref = tf_variable(var).ref()
        return any(ref == v.ref() for v in self.local)

    # -- the allreduce -------------------------------------------------------------
    def reduce(self, grads, variables):
        """Allreduce ``grads`` (list aligned with ``variables``; None entries stay None)."""
        s = self.s
        ps = s.process_set
        grads = list(grads)
        if s.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        todo = [i for i, (g, v) in enumerate(zip(grads, variables)) if g is not None and not self.is_local(v)]
        out = list(grads)
        # elastic: the world size changes between resets, so it is read when the step runs
        if todo and ps.included() and (elastic() or ps.size() > 1):
            if s.op == hvd_tf.Average:
                pre, post = 1.0 / s.gradient_predivide_factor, s.gradient_predivide_factor
            else:
                pre, post = 1.0, 1.0
            with tf.name_scope(s.name + "_Allreduce"):
                self.ensure_timer()
                # the clock read once this rank's gradients are ready, and again once every
                # group is reduced: the collective, with the wait for slower ranks inside it
                with tf.control_dependencies(_tensors([grads[i] for i in todo])):
                    began = tf.timestamp()
                for chunk in self._groups(todo, variables):
                    with tf.control_dependencies([began]):
                        given = [_after(grads[i]) for i in chunk]
                    reduced = hvd_tf.grouped_allreduce(
                        given,
                        device_dense=s.device_dense,
                        device_sparse=s.device_sparse,
                        compression=s.compression,
                        op=s.op,
                        prescale_factor=pre,
                        postscale_factor=post,
                        process_set=ps,
                    )
                    for i, r in zip(chunk, reduced):
                        out[i] = r
                with tf.control_dependencies(_tensors([out[i] for i in todo])):
                    took = tf.timestamp() - began
                self.collective_s.assign_add(took)
                self.collectives.assign_add(1)
        if self.local and s.scale_local_gradients:
            n = ps.size()
            for i, (g, v) in enumerate(zip(out, variables)):
                if g is not None and self.is_local(v):
                    if elastic():
                        n = tf.cast(hvd_tf.size_op(process_set_id=ps.process_set_id), g.dtype)
                    if isinstance(g, tf.IndexedSlices):
                        out[i] = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                    else:
                        out[i] = g / n
        return out

    def _groups(self, todo, variables):
        groups = self.s.groups
        if groups is None:
            return [todo]  # one fused, grouped allreduce for the whole step
        if isinstance(groups, int):
            return _split(todo, groups)
        # a list of lists of variables: those share a group; the rest go one by one
        position = {tf_variable(variables[i]).ref(): i for i in todo}
        chunks, seen = [], set()
        for group in groups:
            chunk = []
            for var in group:
                i = position.get(tf_variable(var).ref())
                if i is not None and i not in seen:
                    chunk.append(i)
                    seen.add(i)
            if chunk:
                chunks.append(sorted(chunk))
        chunks.extend([i] for i in todo if i not in seen)
        return chunks

    def ensure_timer(self):
        if self.collective_s is None:
            with tf.init_scope():  # eager variables even when first called while tracing
                self.collective_s = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="hvd_collective_seconds")
                self.collectives = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvd_collectives")

    # -- local gradient aggregation (backward_passes_per_step > 1) ---------------------
    def ensure_accumulators(self, grads, variables):
        if self.accumulators is not None:
            if len(self.accumulators) != len(variables):
                raise ValueError(
                    "DistributedOptimizer(backward_passes_per_step>1) was applied to a different "
                    f"number of variables ({len(variables)}) than before ({len(self.accumulators)})"
                )
            return
        with tf.init_scope():  # eager variables even when first called while tracing
            self.counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="hvd_aggregation_counter")
            accs = []
            for g, v in zip(grads, variables):
                if g is None:
                    accs.append(None)
                    continue
                tv = tf_variable(v)
                accs.append(
                    tf.Variable(tf.zeros(tv.shape, dtype=tv.dtype), trainable=False, name="hvd_aggregated_gradient")
                )
            self.accumulators = accs

    def dense(self, g):
        if isinstance(g, tf.IndexedSlices):
            if self.s.sparse_as_dense:
                return tf.convert_to_tensor(g)
            raise ValueError(
                "IndexedSlices are not supported when `backward_passes_per_step` > 1 and `sparse_as_dense` is False."
            )
        return g


def _tensors(grads) -> list:
    """The dense tensors of ``grads`` (an IndexedSlices' values), for control dependencies."""
    return [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]


def _after(g):
    """``g`` again, as a tensor made under the enclosing control dependencies."""
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
    return tf.identity(g)
