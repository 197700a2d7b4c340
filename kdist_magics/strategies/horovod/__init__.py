"""``--strategy horovod``: the cell on N engines as Horovod ranks.

:mod:`.strategy` (``HorovodStrategy``, in the kernel), :mod:`.on_engine` (what a rank runs),
:mod:`.grow` (``--max-np``: engines joining an elastic run), :mod:`.build` (``python -m
kdist_magics.strategies.horovod.build`` builds Horovod against this TensorFlow, with the
fixes in ``patches/``).
"""
