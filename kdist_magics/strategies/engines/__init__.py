"""What every strategy whose cell runs on ipyparallel engines shares.

:mod:`.strategy` is ``EngineStrategy``: start the cluster, prepare the ranks (:mod:`.prepare`),
run the cell on every engine and watch it (:mod:`.supervisor`, the ranks' output through
:mod:`.printer`), finish and gather the results (:mod:`.results`); :mod:`.waiting` waits on
every engine outside the cell, naming a death; :mod:`.warm` is ``%kdist start``.
"""
