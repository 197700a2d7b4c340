"""``--strategy sharded``: one model split over a mesh of devices (Keras on JAX).

:mod:`.strategy` (``ShardedStrategy``), :mod:`.mesh` (``--mesh D,M``), :mod:`.layout` (where
each variable lives) and :mod:`.positions` (which rows each JAX process feeds).
"""
