"""After the cell on engines: per-run engine state undone (on engines that still answer), the
last telemetry rows drained, the strategy's ``after_cell``, and what must restart the engines
before the next run (an engine that died after the cell, ranks out of step)."""

from __future__ import annotations

from ...engine.faults import hold
from ...messages import PHASE_FINISHING, died_after, say
from . import waiting


def finish_engines(strategy, cluster, ctx, ranks: list[int], ok: bool) -> None:
    """Undo per-run engine state; after a failure, only on engines that still answer."""
    sup, strategy.supervisor = strategy.supervisor, None
    ctx.record.phase(PHASE_FINISHING)
    hold("finishing", cluster)
    if strategy.needs_restart is None and cluster.running and cluster.controller_gone():
        strategy.needs_restart = "the controller died after the previous run"  # said by results.pull
    engine_died_after(strategy, cluster, ranks, ok)
    if sup is not None:
        sup.printer.flush()
    if strategy.needs_restart is None and cluster.running:
        _end_on_engines(strategy, cluster, ranks, sup)
    if sup is not None and sup.lost_batches:
        ctx.record.note_lost_batches(sup.lost_batches)
    try:
        strategy.after_cell(cluster, ctx, ok and strategy.needs_restart is None)
    except Exception:
        # an engine killed just before (still being torn down at the look above) fails
        # the end-of-run calls with ipyparallel's own error (KeyError: its id): a death
        if not engine_died_after(strategy, cluster, ranks, ok) and ok:
            raise


def _end_on_engines(strategy, cluster, ranks: list[int], sup) -> None:
    """``engine.end`` on the run's engines; its final telemetry batch drained into the record."""
    from ...engine import engine

    try:
        ar = strategy.live_view(cluster).apply_async(engine.end, True)
        ar.wait(timeout=10)
        if ar.ready() and sup is not None:
            ar.wait_for_output(timeout=5)  # the final batch is published before idle
            sup.drain_outputs(ar, [r for r, e in zip(ranks, cluster.engines)
                                   if e.engine_id not in strategy.lost])
    except Exception:
        pass


def engine_died_after(strategy, cluster, ranks: list[int], ok: bool) -> bool:
    """An engine that died after the cell had run (else the supervisor would have said):
    the cell's work stands, the engines restart with the next cell, and a warning says so."""
    if strategy.needs_restart is not None or not cluster.running:
        return False
    deaths = {eid: how for eid, how in cluster.dead(settle=True).items()
              if eid not in strategy.lost}
    if not deaths:
        return False
    strategy.needs_restart = "an engine died after the previous run"
    if ok:
        by_engine = waiting.rank_of(cluster, ranks)
        say(died_after({by_engine.get(eid, eid): how for eid, how in deaths.items()}), warn=True)
    return True


def end_collective_cell(strategy, cluster, ctx, ok: bool, what: str, leave,
                        committed: bool = True) -> None:
    """``after_cell`` of a strategy whose ranks share collectives (``what``): after a failed
    run in which some rank neither finished nor raised (stopped, interrupted, timed out)
    they may be out of step, so an owned cluster restarts before the next run and an
    attached one (never restarted by kdist) gets a warning; otherwise ``leave`` runs on
    every engine to undo the cell's set-up. ``committed``: the engines hold the set-up."""
    if not ok and committed and strategy.needs_restart is None:
        states = {r.state for r in ctx.record.ranks.values()}
        if states - {"failed", "done"}:
            if cluster.owned:
                strategy.needs_restart = "the previous run stopped mid-way"
            else:
                say(f"the run stopped mid-way; {what} may be out of step on these "
                    f"engines. If the next cell hangs, restart the cluster's engines (kdist "
                    f"does not restart a cluster it did not start).", warn=True)
    if cluster.running and strategy.needs_restart is None:
        try:
            cluster.view().apply_async(leave).wait(timeout=10)
        except Exception:
            pass
