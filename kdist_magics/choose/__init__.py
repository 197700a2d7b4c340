"""Choosing a strategy: ``--strategy auto`` and ``%kdist advise``.

:mod:`.advisor` ranks the strategies from plain facts: the hardware this kernel can use
(:mod:`.hardware`) and the largest Keras model built in the notebook (:mod:`.facts`);
:mod:`.advice_sharded` adds the rows for a model too big for one device.
"""
