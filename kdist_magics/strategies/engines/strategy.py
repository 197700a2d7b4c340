"""``EngineStrategy``: a cell on every ipyparallel engine, one engine per rank.

A cell is one :class:`~.run.EngineRun` (:mod:`.run`), built per cell and read top to
bottom there: the cluster, the ranks, the set-up, the cell watched, the engines finished and
the values back. The strategy keeps its hooks and what lasts between cells.

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
``listen_addresses()``, ``grow(cluster, ctx, final)``, ``rank_engines(cluster)``
    where ranks listen, elastic growth, and who is rank 0 after it (see each).
``_cluster(ctx)``
    the run's cluster (reused, restarted or started: :mod:`.start`); extended to re-plan one.
``bound_names`` (class attribute)
    names the strategy binds in the engine namespace (documentation/status).

State a subclass may use: ``self.cluster`` (the warm EngineCluster, or None) and
``self.run_now`` (the :class:`~.run.EngineRun` in progress, None between cells: its ``cell``,
``pushed``, ``restart`` and ``must_restart``, and the waits of :mod:`.waiting` and
:func:`.finish.end_collective_cell` are given it). ``self.needs_restart`` is why the next cell
restarts the engines: the last run's reason, or one given by :meth:`must_restart` while a
cluster is planned, outside a run.
"""

from __future__ import annotations

from typing import Any

from ...cluster.cluster import EngineCluster
from ...cluster.placement import default_np
from ...messages import ray_given_back, say
from ...rank.faults import hold
from ..base import RunContext, Strategy
from . import start, warm
from .run import EngineRun


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
        # what lasts between cells (a cell's own state is its EngineRun's)
        self.cluster: EngineCluster | None = None  # the warm cluster, or None
        self.needs_restart: str | None = None  # why the next run must restart the engines
        self.last_timing: dict[str, float] = {}  # the last run's EngineRun.timing
        self.run_now: EngineRun | None = None  # the run in progress, if any
        self.warming = None  # a %kdist start under way or done (engines/warm.Warming)

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

    def go_on_without(self, cluster: EngineCluster, ctx: RunContext, deaths: dict[int, str]) -> dict[int, int] | None:
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

    def _cluster(self, ctx: RunContext) -> EngineCluster:
        """The run's cluster: the warm one reused (restarted where it must be), or a new one,
        kept as :attr:`cluster` from before its start (a start stopped or failed is ended by
        :meth:`teardown`). A strategy extends this to re-plan a cluster."""
        cluster = start.reuse(self, ctx)
        if cluster is None:
            self.cluster = cluster = start.new_cluster(self, ctx)
            start.start_phase(cluster, ctx, cluster.start)
        self.needs_restart = None
        return cluster

    def must_restart(self, why: str) -> None:
        """Outside a run (its cluster being planned): restart the engines before the next
        cell, for the first reason given. Within one, :meth:`.run.EngineRun.must_restart`."""
        if self.needs_restart is None:
            self.needs_restart = why

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
        if cluster is not None:
            hold("stopping", cluster)
            cluster.stop()

    # -- the run ----------------------------------------------------------------------
    def run(self, cell: str, ctx: RunContext) -> Any:
        """The cell as one :class:`~.run.EngineRun`; why the engines must restart, kept for the
        next cell."""
        start.check_syntax(cell, ctx)
        self._warmed()  # engines a %kdist start is warming
        run = self.run_now = EngineRun(self, cell, ctx)
        try:
            return run.go()
        except BaseException as exc:
            if run.cluster is not None:  # a start that failed or was stopped ended its own
                self._give_back(run.cluster, exc)
            raise
        finally:
            self.run_now = None
            self.needs_restart = self.needs_restart or run.restart
            self.last_timing = run.timing

    def _give_back(self, cluster: EngineCluster, exc: BaseException) -> None:
        """After a run on ``cluster`` that did not finish (``exc``): an owned cluster that is not
        kept then (a shared Ray cluster's engines and placement group) is stopped now, and the
        user told."""
        if cluster is not self.cluster or not cluster.owned or cluster.kept_after_a_failed_run:
            return
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else getattr(exc, "status", "failed")
        self.teardown()
        self.needs_restart = None
        say(ray_given_back(status))

    # -- %kdist start ----------------------------------------------------------------
    def warm(self, ctx: RunContext) -> warm.Warming:
        """Start this strategy's engines for runs like ``ctx.spec`` in the background
        (:mod:`.warm`); a start under way finishes first."""
        self._warmed(quiet=True)
        self.warming = warm.start(self, ctx)
        return self.warming

    def _warmed(self, quiet: bool = False) -> None:
        """A ``%kdist start`` under way finished first, and what it left said (not ``quiet``)."""
        warming, self.warming = self.warming, None
        if warming is not None:
            warm.wait_for(warming, self.cluster, quiet)
