"""``--strategy sharded``: one model split over a mesh of devices (Keras on JAX).

:mod:`.strategy` (``ShardedStrategy``), :mod:`.mesh` (``--mesh D,M``), :mod:`.layout` (where
each variable lives) and :mod:`.outside` (a model built outside the mesh); which rows each JAX
process feeds is JAX's seam's (:func:`..frameworks.on_jax.feeding`).
"""
