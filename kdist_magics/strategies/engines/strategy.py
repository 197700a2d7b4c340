"""``EngineStrategy``: a cell on every ipyparallel engine, one engine per rank.

What does not depend on the distribution library is done for every engine strategy, as steps
(each a module of this folder): the cell checked once and the cluster started or reused
(:mod:`.start`), every engine prepared and ``--push`` sent (:mod:`.prepare`), the
strategy's set-up (``before_cell``), the cell executed and watched (:mod:`.execute`), the
engines finished (:mod:`.finish`), ``--pull`` and the cell's value (:mod:`.results`).

Hooks a strategy overrides (Horovod, MultiWorkerMirroredStrategy with ``TF_CONFIG`` per
engine, JAX and torch process groups):

``ranks(cluster, ctx) -> list[int]``
    rank of each engine, in ``cluster.engines`` order (default: engine order).
``engine_env(cluster, ctx) -> list[dict]``
    extra environment variables per engine, set with the thread variables
    before the cell (and before TF is first imported on a fresh engine).
``before_cell(cluster, ctx, ranks)``
    set up the distribution library on the engines (rendezvous, init, binding
    names such as ``hvd`` or ``strategy``); raise to abort the run.
``after_cell(cluster, ctx, ok)``
    undo ``before_cell`` (always called; ``ok`` False after a failure, when
    some engines may be gone).
``abort_collectives(cluster, ranks)``
    when a run is being stopped (a rank raised, timeout, interrupt): make ranks
    blocked inside collectives return, so they need not be killed.
``go_on_without(cluster, ctx, deaths) -> {rank: new rank} | None``
    an engine died (``deaths``: ``{rank: how}``): an elastic strategy re-forms the job
    with the ranks left and returns their new ranks; None (the default) stops the run.
``listen_addresses()``, ``grow(cluster, ctx, final)``, ``rank_engines(cluster)``, ``live_view(cluster)``
    where ranks listen, elastic growth, and who is rank 0 after it (see each).
``_cluster(ctx)``
    the run's cluster (:func:`.start.cluster_for`); extended to re-plan a cluster.
``bound_names`` (class attribute)
    names the strategy binds in the engine namespace (documentation/status).

State a subclass may use: ``self.cluster`` (the warm EngineCluster, or None),
``self.needs_restart`` (set it to a reason and the next run restarts the engines first),
``self.supervisor`` (the :class:`~.supervisor.RunSupervisor` of the run in progress, None
between runs).
"""

from __future__ import annotations

import time
from typing import Any

from ...cluster.cluster import EngineCluster
from ...cluster.placement import default_np
from ...engine.faults import hold
from ...engine.values import pushable
from ...errors import RankDied, RankFailed
from ...messages import phase_setup, push_report, say
from ..base import RunContext, Strategy
from . import execute, finish, hints, prepare, push, results, start, waiting
from .supervisor import RunSupervisor


class EngineStrategy(Strategy):
    """Base class of strategies whose cell runs on ipyparallel engines (see module doc)."""

    name = "engines"
    #: what the set-up phase is called on the dashboard ("setting up Horovod ...")
    setup_words = "the ranks"
    bound_names: tuple[str, ...] = ()
    #: --pull and the cell's value run on every rank, not rank 0 alone (see results.pull)
    collective_values = False
    #: what ``%kdist start`` imports on the engines (engines/warm.py)
    warm_modules: tuple[str, ...] = ()
    #: which of messages.EXPOSED this strategy's ranks leave open on a shared host
    exposure: str | None = None

    def __init__(self):
        self.cluster: EngineCluster | None = None
        self.needs_restart: str | None = None  # why the next run must restart the engines
        self.last_timing: dict[str, float] = {}
        self.supervisor: RunSupervisor | None = None  # the run in progress, if any
        self.lost: set[int] = set()  # engine ids an elastic run went on without (this run)
        self.cell: str | None = None  # the cell of the run in progress
        self.pushed: dict[str, Any] = {}  # its --push values
        self.warming = None  # a %kdist start under way or done (engines/warm.Warming)
        self.shared_prints: dict[str, str] = {}  # --push values the engines hold (engines/push.py)

    # -- hooks ---------------------------------------------------------------
    def ranks(self, cluster: EngineCluster, ctx: RunContext) -> list[int]:
        return list(range(len(cluster.engines)))

    def engine_env(self, cluster: EngineCluster, ctx: RunContext) -> list[dict[str, str]]:
        return [{} for _ in cluster.engines]

    def before_cell(self, cluster: EngineCluster, ctx: RunContext, ranks: list[int]) -> None:
        pass

    def after_cell(self, cluster: EngineCluster, ctx: RunContext, ok: bool) -> None:
        pass

    def abort_collectives(self, cluster: EngineCluster, ranks: list[int]) -> None:
        """Make ranks blocked in the library's collectives return (called when stopping a run).

        Signals cannot reach a rank waiting inside a C++ collective; a library that can end
        its collectives from outside (Horovod: a coordinated shutdown) does it here so the
        engines stay warm. Default: nothing (stuck ranks are killed after ``stop_grace``).
        """

    def go_on_without(self, cluster: EngineCluster, ctx: RunContext,
                      deaths: dict[int, str]) -> dict[int, int] | None:
        return None

    def listen_addresses(self) -> list[str]:
        """``host:port`` the ranks are to listen on, in rank order, where kdist chose them before
        the set-up (multiworker's TF_CONFIG, JAX's coordinator on rank 0); empty where the
        library picks its own or the listening socket is open before its port is told
        (Horovod's rendezvous in the kernel, torch's store on rank 0)."""
        return []

    def grow(self, cluster: EngineCluster, ctx: RunContext, final: bool) -> list:
        """Engines that begin the cell now, joining the run: ``[(rank, EngineInfo, future)]``
        (an elastic Horovod run under ``--max-np``; none by default). ``final``: the run's
        ranks are done; let any joining engine go."""
        return []

    def rank_engines(self, cluster: EngineCluster) -> dict | None:
        """``{rank: EngineInfo}`` after a run whose ranks changed (elastic); None: as started."""
        return None

    def live_view(self, cluster: EngineCluster):
        """The engines of this run still in it (all, unless an elastic run lost some)."""
        return cluster.view([e.engine_id for e in cluster.engines if e.engine_id not in self.lost])

    def _cluster(self, ctx: RunContext) -> EngineCluster:
        return start.cluster_for(self, ctx)

    # -- for subclasses whose set-up runs on every engine at once ----------------
    def _setup_results(self, ars, ranks: list[int], what: str, reach: str, timeout: float,
                       failed: str) -> dict[int, Any]:
        """``{rank: result}`` of set-up calls made on every engine at once (see
        :func:`.waiting.setup_results`)."""
        return waiting.setup_results(self, ars, ranks, what, reach, timeout, failed)

    def _end_collective_cell(self, cluster: EngineCluster, ctx: RunContext, ok: bool, what: str,
                             leave, committed: bool = True) -> None:
        """``after_cell`` of a strategy whose ranks share collectives (see
        :func:`.finish.end_collective_cell`)."""
        finish.end_collective_cell(self, cluster, ctx, ok, what, leave, committed)

    # -- Strategy API --------------------------------------------------------
    def size(self, spec) -> int:
        return spec.np or default_np()

    def status(self) -> dict[str, Any]:
        facts = self.cluster.status() if self.cluster is not None else {"engines": "not started"}
        if self.warming is not None:
            facts["start"] = self.warming.describe()
        if self.needs_restart:
            facts["restart"] = self.needs_restart
        return facts

    def teardown(self) -> None:
        if self.cluster is not None:
            self.cluster.give_up()  # a start waiting in a queue (%kdist start's thread) ends now
        if self.warming is not None:
            self.warming.wait(120)  # a %kdist start under way finishes first
            self.warming = None
        cluster, self.cluster = self.cluster, None
        self.shared_prints = {}  # new engines hold nothing
        if cluster is not None:
            hold("stopping", cluster)
            cluster.stop()

    # -- the run, as steps ---------------------------------------------------------
    def run(self, cell: str, ctx: RunContext) -> Any:
        from .warm import wait_for

        start.check_syntax(cell, ctx)
        wait_for(self, ctx)  # engines a %kdist start is warming
        self.cell = cell
        self.pushed = pushable(ctx.shell.user_ns, ctx.spec.push) if ctx.spec.push else {}
        t0 = time.monotonic()
        cluster = self._cluster(ctx)
        t_cluster = time.monotonic()
        ranks = self.ranks(cluster, ctx)
        by_rank = dict(zip(ranks, cluster.engines))
        for rank, eng in by_rank.items():
            ctx.record.set_rank(rank, state="starting", host=eng.hostname, node=cluster.node_of(eng),
                                pid=eng.pid)
        ctx.record.phase(phase_setup(self.setup_words))
        ok, now, self.lost = False, None, set()
        try:
            self._set_up(cluster, ctx, ranks)
            self.last_timing = {"cluster_s": t_cluster - t0, "setup_s": time.monotonic() - t_cluster}
            value_ar = execute.execute(self, cell, cluster, ctx, ranks)
            ok = True
            now = self.rank_engines(cluster)
        except RankDied as exc:  # before or after the cell (the supervisor marks its own)
            for rank, how in exc.deaths.items():
                ctx.record.set_rank(rank, state="failed", error=f"process {how}")
            raise
        except RankFailed as exc:  # a name the notebook has and --push did not send, say
            exc.hint = hints.missing_push(exc.failures, ctx.shell.user_ns, ctx.spec.push)
            raise
        finally:
            finish.finish_engines(self, cluster, ctx, ranks, ok)
            self._restart_after_growth(cluster)
        hold("pull", cluster)
        return results.pull(self, cluster, ctx, now or by_rank, value_ar)

    def _set_up(self, cluster: EngineCluster, ctx: RunContext, ranks: list[int]) -> None:
        """Every engine prepared, ``--push`` sent, the strategy's own set-up; a death named."""
        with waiting.named_deaths(self, ranks, f"while setting up {self.setup_words}"):
            hold("setup", cluster, addresses=self.listen_addresses())
            prepare.prepare_engines(self, cluster, ctx, ranks)
            if self.pushed:
                ctx.record.pushed = push.push_values(self, cluster, self.pushed, ranks)
                ctx.record.phase_detail(push_report(ctx.record.pushed))
                if ctx.spec.out == "all":
                    say(push_report(ctx.record.pushed))
            self.before_cell(cluster, ctx, ranks)

    def _restart_after_growth(self, cluster: EngineCluster) -> None:
        """An elastic run that lost or took in engines: the next run restarts them."""
        if self.lost:
            self.needs_restart = self.needs_restart or "ranks were lost in the previous run"
        elif len(cluster.engines) != cluster.n:  # an elastic run took in engines
            self.needs_restart = self.needs_restart or "the previous run took in engines"
