"""After the cell on engines: per-run engine state undone (on engines that still answer), the
last telemetry rows drained, the strategy's ``after_cell``, and what must restart the engines
before the next run (an engine that died after the cell, ranks out of step)."""

from __future__ import annotations

from ...rank.faults import hold
from ...messages import PHASE_FINISHING, died_after, say
from . import waiting


def finish_engines(run, ok: bool) -> None:
    """Undo ``run``'s per-run engine state; after a failure, only on engines that still answer."""
    cluster, ctx = run.cluster, run.ctx
    sup, run.supervisor = run.supervisor, None
    ctx.record.phase(PHASE_FINISHING)
    hold("finishing", cluster)
    if run.restart is None and cluster.running and cluster.controller_gone():
        run.must_restart("the controller died after the previous run")  # said by results.pull
    engine_died_after(run, ok)
    if sup is not None:
        sup.printer.flush()
    if run.restart is None and cluster.running:
        _end_on_engines(run, sup)
    if sup is not None and sup.lost_batches:
        ctx.record.note_lost_batches(sup.lost_batches)
    try:
        run.strategy.after_cell(cluster, ctx, ok and run.restart is None)
    except Exception:
        # an engine killed just before (still being torn down at the look above) fails
        # the end-of-run calls with ipyparallel's own error (KeyError: its id): a death
        if not engine_died_after(run, ok) and ok:
            raise


def _end_on_engines(run, sup) -> None:
    """``lifecycle.end`` on the run's engines; its final telemetry batch drained into the record."""
    from ...rank import lifecycle

    try:
        ar = run.live_view().apply_async(lifecycle.end, True)
        ar.wait(timeout=10)
        if ar.ready() and sup is not None:
            ar.wait_for_output(timeout=5)  # the final batch is published before idle
            sup.drain_outputs(ar, [r for r, e in zip(run.ranks, run.cluster.engines) if e.engine_id not in run.lost])
    except Exception:
        pass


def engine_died_after(run, ok: bool) -> bool:
    """An engine that died after the cell had run (else the supervisor would have said):
    the cell's work stands, the engines restart with the next cell, and a warning says so."""
    cluster = run.cluster
    if run.restart is not None or not cluster.running:
        return False
    deaths = {eid: how for eid, how in cluster.dead(settle=True).items() if eid not in run.lost}
    if not deaths:
        return False
    run.must_restart("an engine died after the previous run")
    if ok:
        by_engine = waiting.rank_of(cluster, run.ranks)
        say(died_after({by_engine.get(eid, eid): how for eid, how in deaths.items()}), warn=True)
    return True


def end_collective_cell(run, ok: bool, what: str, leave, committed: bool = True) -> None:
    """``after_cell`` of a strategy whose ranks share collectives (``what``), given the
    :class:`~.run.EngineRun` in progress: after a failed run in which some rank neither
    finished nor raised (stopped, interrupted, timed out) they may be out of step, so an owned
    cluster restarts before the next run and an attached one (never restarted by kdist) gets a
    warning; otherwise ``leave`` runs on every engine to undo the cell's set-up.
    ``committed``: the engines hold the set-up."""
    cluster = run.cluster
    if not ok and committed and run.restart is None:
        states = {r.state for r in run.ctx.record.ranks.values()}
        if states - {"failed", "done"}:
            if cluster.owned:
                run.must_restart("the previous run stopped mid-way")
            else:
                say(
                    f"the run stopped mid-way; {what} may be out of step on these "
                    f"engines. If the next cell hangs, restart the cluster's engines (kdist "
                    f"does not restart a cluster it did not start).",
                    warn=True,
                )
    if cluster.running and run.restart is None:
        try:
            cluster.view().apply_async(leave).wait(timeout=10)
        except Exception:
            pass
