"""What every strategy whose cell runs on ipyparallel engines shares.

:mod:`.strategy` is ``EngineStrategy``: the hooks a strategy overrides and what lasts between
cells. A cell is one :class:`~.run.EngineRun` (:mod:`.run`), whose steps are given the run:
the cell checked and the cluster started or reused (:mod:`.start`), every engine prepared and
``--push`` sent (:mod:`.prepare`, :mod:`.push`), the cell executed and watched
(:mod:`.execute`, :mod:`.supervisor`, the ranks' output through :mod:`.printer`), the engines
finished (:mod:`.finish`) and the results gathered (:mod:`.results`); :mod:`.waiting` waits on
every engine outside the cell, naming a death; :mod:`.warm` is ``%kdist start``.
"""
