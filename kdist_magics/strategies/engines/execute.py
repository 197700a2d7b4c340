"""The cell on every engine: the run begun on each rank (telemetry and sampling on), the cell
executed everywhere at once, and a :class:`~.supervisor.RunSupervisor` made for this run
watching it (output, telemetry, a rank's error, a dead engine, the timeout, Stop)."""

from __future__ import annotations

from ...cluster.compat_ipyparallel import children
from ...rank.faults import hold
from ...messages import PHASE_CELL
from . import waiting
from .supervisor import RunSupervisor

FEED_INTERVAL = 0.5  # seconds between a rank's telemetry batches (the dashboard redraws at 2/s)


def begin_ranks(run) -> None:
    """``lifecycle.begin`` on every rank of ``run`` (an :class:`~.run.EngineRun`): telemetry,
    sampling and the run's settings on."""
    from ...rank import lifecycle

    ctx, cluster, ranks = run.ctx, run.cluster, run.ranks
    spec = ctx.spec
    with waiting.named_deaths(run, ranks, "as the run began"):
        begun = [
            cluster.client[e.engine_id].apply_async(
                lifecycle.begin,
                rank,
                spec.telemetry,
                FEED_INTERVAL,
                spec.checkpoint,
                ctx.options.freeze_gc,
                ctx.options.tf_info_logs,
                ctx.options.helper_nice,
                ctx.probe,
            )
            for e, rank in zip(cluster.engines, ranks)
        ]
        waiting.gather(run, begun, ranks, 60, "as the run began")


def execute(run):
    """Begin ``run`` on every engine, execute its cell there, and watch it; rank 0's result
    content. ``run.supervisor`` is its supervisor while the cell runs."""
    strategy, ctx, cluster, ranks = run.strategy, run.ctx, run.cluster, run.ranks
    spec, record = ctx.spec, ctx.record
    begin_ranks(run)

    def go_on(deaths):
        renumbered = strategy.go_on_without(cluster, ctx, deaths)
        if renumbered is not None:  # ranks and engines grow together (see RunSupervisor.take)
            by_rank = {rank: e.engine_id for rank, e in zip(ranks, cluster.engines)}
            run.lost |= {by_rank[r] for r in deaths}
        return renumbered

    record.phase(PHASE_CELL)
    sup = run.supervisor = RunSupervisor(
        record,
        spec.out,
        lambda busy: strategy.abort_collectives(cluster, busy),
        on_lost=go_on,
        on_grow=lambda final: strategy.grow(cluster, ctx, final),
    )
    ar = cluster.view().execute(run.cell, silent=False, block=False)
    hold("cell", cluster)
    for rank, fut in zip(ranks, children(ar)):
        sup.listen(fut, rank)
        fut.add_done_callback(lambda _f, _r=rank: sup.inbox.put((_r, "finished", None)))
    for rank in ranks:
        record.set_rank(rank, state="running")
    try:
        return sup.watch(cluster, ranks, ar, spec.timeout, ctx.options.stop_grace)
    finally:
        if sup.needs_restart:
            run.must_restart(sup.needs_restart)
