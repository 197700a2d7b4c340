"""Running a cell on every ipyparallel engine, one engine per rank.

:class:`EngineStrategy` does everything that does not depend on the
distribution library: keeps a warm :class:`~kdist_magics.cluster.cluster.EngineCluster`
(restarted when N changes or an engine died), checks the cell's syntax once in
the kernel, sets thread variables, ``--push``, runs the cell with live output
(rank 0's, every rank's prefixed ``[rank N]``, or none), moves telemetry rows
into the RunRecord while the cell runs, supervises (a rank raising, a rank
dying, ``--timeout``, the Stop button), ``--pull`` and the last expression's
value from rank 0.

Hooks for subclasses (Horovod here; MultiWorkerMirroredStrategy later, with
``TF_CONFIG`` per engine):

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
``bound_names`` (class attribute)
    names the strategy binds in the engine namespace (documentation/status).

State a subclass may use: ``self.cluster`` (the warm EngineCluster, or None),
``self.needs_restart`` (set it to a reason and the next run restarts the
engines first), ``_cluster(ctx)`` (may be extended to re-plan a cluster).

While the cell runs, a :class:`~.supervisor.RunSupervisor` made for the run watches it
(output, telemetry, a rank's error, a dead engine, the timeout, Stop); ``self.supervisor``
is that run's, and None between runs.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ...cluster.cluster import EngineCluster
from ...cluster.compat_ipyparallel import children
from ...errors import CellFailed, KDistError, RankDied
from ...engine.faults import hold
from ...cluster.namespace import wanted
from ...messages import (PHASE_CELL, PHASE_FINISHING, died_after, phase_engines, phase_setup,
                        registered, say)
from ...cluster.placement import default_np
from ...engine.values import pushable
from ..base import RunContext, Strategy
from .prepare import prepare_remote as _prepare_remote  # (its old name here, for callers)
from . import results, waiting
from .supervisor import RunSupervisor

FEED_INTERVAL = 0.5  # seconds between a rank's telemetry batches (the dashboard redraws at 2/s)


class EngineStrategy(Strategy):
    """Base class of strategies whose cell runs on ipyparallel engines (see module doc)."""

    name = "engines"
    #: what the set-up phase is called on the dashboard ("setting up Horovod ...")
    setup_words = "the ranks"
    bound_names: tuple[str, ...] = ()
    #: --pull and the cell's value run on every rank, not rank 0 alone (see _from_rank0)
    collective_values = False
    #: what ``%kdist start`` imports on the engines (strategies/engines/warm.py)
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
        self.warming = None  # a %kdist start under way or done (strategies/warm.Warming)

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

    # -- for subclasses whose set-up runs on every engine at once ----------------
    def _setup_results(self, ars, ranks: list[int], what: str, reach: str, timeout: float,
                       failed: str) -> dict[int, Any]:
        """``{rank: result}`` of set-up calls made on every engine at once (see
        :func:`.waiting.setup_results`)."""
        return waiting.setup_results(self, ars, ranks, what, reach, timeout, failed)

    def _end_collective_cell(self, cluster: EngineCluster, ctx: RunContext, ok: bool, what: str,
                             leave, committed: bool = True) -> None:
        """``after_cell`` of a strategy whose ranks share collectives (``what``): after a failed
        run in which some rank neither finished nor raised (stopped, interrupted, timed out)
        they may be out of step, so an owned cluster restarts before the next run and an
        attached one (never restarted by kdist) gets a warning; otherwise ``leave`` runs on
        every engine to undo the cell's set-up. ``committed``: the engines hold the set-up."""
        if not ok and committed and self.needs_restart is None:
            states = {r.state for r in ctx.record.ranks.values()}
            if states - {"failed", "done"}:
                if cluster.owned:
                    self.needs_restart = "the previous run stopped mid-way"
                else:
                    say(f"the run stopped mid-way; {what} may be out of step on these "
                          f"engines. If the next cell hangs, restart the cluster's engines (kdist "
                        f"does not restart a cluster it did not start).", warn=True)
        if cluster.running and self.needs_restart is None:
            try:
                cluster.view().apply_async(leave).wait(timeout=10)
            except Exception:
                pass

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
        give_up = getattr(self.cluster, "give_up", None)
        if give_up is not None:
            give_up()  # a start waiting in a queue (%kdist start's thread) ends now
        if self.warming is not None:
            self.warming.wait(120)  # a %kdist start under way finishes first
            self.warming = None
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            hold("stopping", cluster)
            cluster.stop()

    # -- the run ---------------------------------------------------------------
    def run(self, cell: str, ctx: RunContext) -> Any:
        from .warm import wait_for

        spec, record = ctx.spec, ctx.record
        self._check_syntax(cell, ctx)
        wait_for(self, ctx)  # engines a %kdist start is warming
        self.cell = cell
        pushed = self.pushed = pushable(ctx.shell.user_ns, ctx.spec.push) if spec.push else {}
        t0 = time.monotonic()
        cluster = self._cluster(ctx)
        t_cluster = time.monotonic()
        ranks = self.ranks(cluster, ctx)
        by_rank = dict(zip(ranks, cluster.engines))
        for rank, eng in by_rank.items():
            record.set_rank(rank, state="starting", host=eng.hostname, pid=eng.pid)
        record.phase(phase_setup(self.setup_words))
        ok = False
        self.lost = set()
        now = None
        try:
            with waiting.named_deaths(self, ranks, f"while setting up {self.setup_words}"):
                hold("setup", cluster, addresses=self.listen_addresses())
                self._prepare(cluster, ctx, ranks)
                if pushed:
                    waiting.gather(self, [cluster.view().push(pushed, block=False)], ranks, 600,
                                   "while --push sent its values")
                self.before_cell(cluster, ctx, ranks)
            t_ready = time.monotonic()
            self.last_timing = {"cluster_s": t_cluster - t0, "setup_s": t_ready - t_cluster}
            value_ar = self._execute(cell, cluster, ctx, ranks)
            ok = True
            now = self.rank_engines(cluster)
        except RankDied as exc:  # before or after the cell (the supervisor marks its own)
            for rank, how in exc.deaths.items():
                record.set_rank(rank, state="failed", error=f"process {how}")
            raise
        finally:
            self._finish_engines(cluster, ctx, ranks, ok)
            if self.lost:
                self.needs_restart = self.needs_restart or "ranks were lost in the previous run"
            elif len(cluster.engines) != cluster.n:  # an elastic run took in engines
                self.needs_restart = self.needs_restart or "the previous run took in engines"
        if now:  # an elastic run that lost or took in ranks: who is rank 0 now
            by_rank = now
        hold("pull", cluster)
        return results.pull(self, cluster, ctx, by_rank, value_ar)

    # -- steps -----------------------------------------------------------------
    def _check_syntax(self, cell: str, ctx: RunContext) -> None:
        """Compile once in the kernel: a syntax error is shown once and no engine runs."""
        shell = ctx.shell
        try:
            source = shell.transform_cell(cell) if shell is not None else cell
            compile(source, "<kdist cell>", "exec")
        except (SyntaxError, ValueError) as exc:
            if shell is not None:
                shell.showsyntaxerror()
            raise CellFailed(exc) from exc

    def _cluster(self, ctx: RunContext) -> EngineCluster:
        spec = ctx.spec
        n = self.size(spec)
        news = (lambda text: None) if ctx.quiet else say  # %kdist start's thread prints nothing
        key = (n, spec.cluster_id, spec.profile, spec.slurm)
        cluster = self.cluster
        if cluster is not None and cluster.running:
            current = (cluster.n, cluster.cluster_id if cluster.attached else None, cluster.profile,
                       getattr(cluster, "options", None))
            if current != key:
                news(f"{n} ranks requested; restarting the engines (had {cluster.n})")
                self.teardown()
                cluster = None
            elif why := self.needs_restart or cluster.why_restart():
                news(f"restarting the engines ({why})")
                if cluster.owned:
                    self._start(cluster, ctx, cluster.restart)
                else:
                    cluster.stop()
                    self._start(cluster, ctx, cluster.start)
        if (cluster is None or not cluster.running) and spec.slurm is not None:
            from ...cluster.slurm_engines import submit

            cluster = self.cluster = submit(n, ctx, news)
            self._start(cluster, ctx, cluster.start)
        elif cluster is None or not cluster.running:
            address = ctx.options.bind_address if spec.attach else "127.0.0.1"
            cluster = EngineCluster(n, cluster_id=spec.cluster_id, profile=spec.profile, ip=address,
                                    controller_nice=ctx.options.helper_nice,
                                    private=not spec.attach and wanted(ctx.options.private_network),
                                    preload=self.warm_modules if ctx.options.preload else (),
                                    threads=ctx.options.threads_per_rank or 0)
            if not spec.attach:
                news(f"starting {n} engines on this machine (loopback only)...")
            self.cluster = cluster
            self._start(cluster, ctx, cluster.start)
        self.needs_restart = None
        return cluster

    @staticmethod
    def _start(cluster: EngineCluster, ctx: RunContext, start) -> None:
        """``start()`` the cluster as the run's first phase, counting the engines as they come."""
        record, n = ctx.record, cluster.n
        record.phase(phase_engines(n))
        cluster.on_registered = lambda k: record.phase_detail(registered(k, n))
        cluster.on_phase, cluster.on_detail = record.phase, record.phase_detail
        try:
            start()
        finally:
            cluster.on_registered = cluster.on_phase = cluster.on_detail = None

    def _prepare(self, cluster: EngineCluster, ctx: RunContext, ranks: list[int]) -> None:
        """Thread variables, the strategy's environment and each rank's GPU, on every engine
        before the cell (and before a framework starts there); too few GPUs is an error here,
        before any engine runs the cell."""
        from ...cluster.placement import local_ranks

        threads, policy = ctx.options.threads_per_rank, ctx.options.rank_gpus
        extra = self.engine_env(cluster, ctx)
        hosts = [e.hostname for e in cluster.engines]
        ars = []
        during = "while the engines were prepared"
        # an engine that died just before: ipyparallel raises at the send once its controller
        # has noticed, and gather names it otherwise; the same words either way (a test saw both)
        with waiting.named_deaths(self, ranks, during):
            for eng, env, (local, size) in zip(cluster.engines, extra, local_ranks(hosts, ranks)):
                cwd = os.getcwd() if cluster.owned else None
                ars.append(cluster.client[eng.engine_id].apply_async(
                    _prepare_remote, dict(env), threads, size, cwd, (local, size, policy)))
        infos = waiting.gather(self, ars, ranks, 60, during)
        errors = [info["gpu_error"] for info in infos if info.get("gpu_error")]
        if errors:
            raise KDistError(errors[0] + ". The cell did not run.")

    def _finish_engines(self, cluster, ctx, ranks, ok) -> None:
        """Undo per-run engine state; after a failure, only on engines that still answer."""
        from ...engine import engine

        sup, self.supervisor = self.supervisor, None
        ctx.record.phase(PHASE_FINISHING)
        hold("finishing", cluster)
        if self.needs_restart is None and cluster.running and cluster.controller_gone():
            self.needs_restart = "the controller died after the previous run"  # said by results.pull
        self._died_after(cluster, ranks, ok)
        if sup is not None:
            sup.printer.flush()
        if self.needs_restart is None and cluster.running:
            try:
                ar = self.live_view(cluster).apply_async(engine.end, True)
                ar.wait(timeout=10)
                if ar.ready() and sup is not None:
                    ar.wait_for_output(timeout=5)  # the final batch is published before idle
                    sup.drain_outputs(ar, [r for r, e in zip(ranks, cluster.engines)
                                           if e.engine_id not in self.lost])
            except Exception:
                pass
        if sup is not None and sup.lost_batches:
            ctx.record.note_lost_batches(sup.lost_batches)
        try:
            self.after_cell(cluster, ctx, ok and self.needs_restart is None)
        except Exception:
            # an engine killed just before (still being torn down at the look above) fails
            # the end-of-run calls with ipyparallel's own error (KeyError: its id): a death
            if not self._died_after(cluster, ranks, ok) and ok:
                raise

    def _died_after(self, cluster, ranks, ok) -> bool:
        """An engine that died after the cell had run (else the supervisor would have said):
        the cell's work stands, the engines restart with the next cell, and a warning says so."""
        if self.needs_restart is not None or not cluster.running:
            return False
        deaths = {eid: how for eid, how in cluster.dead(settle=True).items() if eid not in self.lost}
        if not deaths:
            return False
        self.needs_restart = "an engine died after the previous run"
        if ok:
            by_engine = waiting.rank_of(cluster, ranks)
            say(died_after({by_engine.get(eid, eid): how for eid, how in deaths.items()}), warn=True)
        return True

    # -- execute and supervise -------------------------------------------------
    def _execute(self, cell: str, cluster: EngineCluster, ctx: RunContext, ranks: list[int]):
        """Begin the run on every engine, execute the cell there, and watch it with a
        :class:`~.supervisor.RunSupervisor` made for this run; rank 0's result content."""
        from ...engine import engine

        spec, record = ctx.spec, ctx.record
        with waiting.named_deaths(self, ranks, "as the run began"):
            begun = [cluster.client[e.engine_id].apply_async(
                engine.begin, rank, spec.telemetry, FEED_INTERVAL, spec.checkpoint,
                ctx.options.freeze_gc, ctx.options.tf_info_logs, ctx.options.helper_nice)
                for e, rank in zip(cluster.engines, ranks)]
            waiting.gather(self, begun, ranks, 60, "as the run began")
        def go_on(deaths):
            renumbered = self.go_on_without(cluster, ctx, deaths)
            if renumbered is not None:  # ranks and engines grow together (see RunSupervisor.take)
                by_rank = {rank: e.engine_id for rank, e in zip(ranks, cluster.engines)}
                self.lost |= {by_rank[r] for r in deaths}
            return renumbered

        record.phase(PHASE_CELL)
        sup = self.supervisor = RunSupervisor(record, spec.out,
                                              lambda busy: self.abort_collectives(cluster, busy),
                                              on_lost=go_on,
                                              on_grow=lambda final: self.grow(cluster, ctx, final))
        ar = cluster.view().execute(cell, silent=False, block=False)
        hold("cell", cluster)
        for rank, fut in zip(ranks, children(ar)):
            sup.listen(fut, rank)
            fut.add_done_callback(lambda _f, _r=rank: sup.inbox.put((_r, "finished", None)))
        for rank in ranks:
            record.set_rank(rank, state="running")
        try:
            return sup.watch(cluster, ranks, ar, spec.timeout, ctx.options.stop_grace)
        finally:
            self.needs_restart = self.needs_restart or sup.needs_restart
