"""``EngineRun``: one cell on the engines, from its cluster to its value, as one object.

A run is built per cell by :meth:`EngineStrategy.run <.strategy.EngineStrategy.run>` and read
top to bottom in :meth:`EngineRun.go`. It owns what lives as long as the cell: the cluster it
runs on, each engine's rank, the :class:`~.supervisor.RunSupervisor` watching the cell, the
engines an elastic run went on without, and why the engines must restart before the next cell
(:attr:`EngineRun.restart`), which the strategy takes back at the end. The steps are small
collaborators given the run: :mod:`.prepare` and :mod:`.push` (set-up), :mod:`.execute` (the
cell, watched), :mod:`.finish` (the engines finished) and :mod:`.results` (``--pull`` and the
cell's value); :mod:`.waiting` waits on every engine outside the cell, naming a death.

The strategy keeps its hooks (``ranks``, ``before_cell``, ``after_cell``, ...) and what lasts
between cells: the warm cluster and the reason to restart it.
"""

from __future__ import annotations

import time
from typing import Any

from ...rank.faults import hold
from ...rank.values import pushable
from ...errors import RankDied, RankFailed
from ...messages import phase_setup, push_report, say
from ..base import RunContext
from . import execute, finish, hints, prepare, push, results, waiting


class EngineRun:
    """One cell of ``strategy`` (an :class:`~.strategy.EngineStrategy`) on its engines."""

    def __init__(self, strategy, cell: str, ctx: RunContext):
        self.strategy = strategy
        self.cell = cell
        self.ctx = ctx
        self.pushed: dict[str, Any] = {}  # the cell's --push values
        self.cluster = None  # the cluster the cell runs on (the strategy's warm one)
        self.ranks: list[int] = []  # each engine's rank, in cluster.engines order
        self.supervisor = None  # the RunSupervisor while the cell runs
        self.lost: set[int] = set()  # engine ids an elastic run went on without
        self.restart: str | None = None  # why the next cell must restart the engines
        self.timing: dict[str, float] = {}  # seconds to get the cluster and to set up

    def must_restart(self, why: str) -> None:
        """The engines restart before the next cell, for the first reason given."""
        if self.restart is None:
            self.restart = why

    # -- the path, top to bottom --------------------------------------------------------
    def go(self) -> Any:
        """Cluster, ranks, set-up, the cell watched, the engines finished, the values back."""
        strategy, ctx = self.strategy, self.ctx
        if ctx.spec.push:
            self.pushed = pushable(ctx.shell.user_ns, ctx.spec.push)
        t0 = time.monotonic()
        self.cluster = cluster = strategy._cluster(ctx)
        t_cluster = time.monotonic()
        self.ranks = strategy.ranks(cluster, ctx)
        by_rank = dict(zip(self.ranks, cluster.engines))
        for rank, eng in by_rank.items():
            ctx.record.set_rank(rank, state="starting", host=eng.hostname, node=cluster.node_of(eng), pid=eng.pid)
        ctx.record.phase(phase_setup(strategy.setup_words))
        ok, now = False, None
        try:
            self.set_up()
            self.timing = {"cluster_s": t_cluster - t0, "setup_s": time.monotonic() - t_cluster}
            value_ar = execute.execute(self)
            ok = True
            now = strategy.rank_engines(cluster)
        except RankDied as exc:  # before or after the cell (the supervisor marks its own)
            for rank, how in exc.deaths.items():
                ctx.record.set_rank(rank, state="failed", error=f"process {how}")
            raise
        except RankFailed as exc:  # a name the notebook has and --push did not send, say
            exc.hint = hints.missing_push(exc.failures, ctx.shell.user_ns, ctx.spec.push)
            raise
        finally:
            finish.finish_engines(self, ok)
            self._restart_after_growth()
        hold("pull", cluster)
        return results.pull(self, now or by_rank, value_ar)

    def set_up(self) -> None:
        """Every engine prepared, ``--push`` sent, the strategy's own set-up; a death named."""
        strategy, ctx, cluster = self.strategy, self.ctx, self.cluster
        with waiting.named_deaths(self, self.ranks, f"while setting up {strategy.setup_words}"):
            hold("setup", cluster, addresses=strategy.listen_addresses())
            prepare.prepare_engines(self)
            if self.pushed:
                ctx.record.pushed = push.push_values(self)
                ctx.record.phase_detail(push_report(ctx.record.pushed))
                if ctx.spec.out == "all":
                    say(push_report(ctx.record.pushed))
            strategy.before_cell(cluster, ctx, self.ranks)

    # -- what the steps ask of the run -----------------------------------------------------
    def live_view(self):
        """The engines of this run still in it (all, unless an elastic run lost some)."""
        cluster = self.cluster
        return cluster.view([e.engine_id for e in cluster.engines if e.engine_id not in self.lost])

    def _restart_after_growth(self) -> None:
        """An elastic run that lost or took in engines: the next run restarts them."""
        if self.lost:
            self.must_restart("ranks were lost in the previous run")
        elif len(self.cluster.engines) != self.cluster.n:  # an elastic run took in engines
            self.must_restart("the previous run took in engines")
