"""``--strategy horovod``: the cell on N engines as Horovod ranks.

:mod:`.strategy` (``HorovodStrategy``, in the kernel), :mod:`.on_engine` (what a rank runs),
:mod:`.rendezvous` (Horovod's rendezvous in the kernel, bound to one address), :mod:`.hostnames`
(every engine resolves every other's name), :mod:`.grow` (``--max-np``: engines joining an
elastic run), :mod:`.compat_horovod` (Horovod's kept traces forgotten at each init), :mod:`.build` (``python -m
kdist_magics.strategies.horovod.build`` builds Horovod against this TensorFlow, with the
fixes in ``patches/``).
"""
