"""The run's first step on engines: the cell checked once in the kernel, then a warm cluster
reused, restarted (N changed, an engine died, the strategy asked) or started (on this machine,
in a Slurm job, on a Ray cluster, or attached to a user's cluster)."""

from __future__ import annotations

from ...cluster import launchers
from ...cluster.cluster import EngineCluster
from ...cluster.namespace import wanted
from ...errors import CellFailed
from ...messages import phase_engines, ranks_changed, registered, restarting_engines, say
from ..base import RunContext


def check_syntax(cell: str, ctx: RunContext) -> None:
    """Compile once in the kernel: a syntax error is shown once and no engine runs."""
    shell = ctx.shell
    try:
        source = shell.transform_cell(cell) if shell is not None else cell
        compile(source, "<kdist cell>", "exec")
    except (SyntaxError, ValueError) as exc:
        if shell is not None:
            shell.showsyntaxerror()
        raise CellFailed(exc) from exc


def new_cluster(strategy, ctx: RunContext) -> EngineCluster:
    """A cluster for ``strategy``'s runs like ``ctx.spec``, not yet started: a Slurm job's, on a
    Ray cluster, attached to a user's, or on this machine."""
    spec = ctx.spec
    n = strategy.size(spec)
    news = _news(ctx)
    if spec.launcher != launchers.LOCAL:  # Slurm's, Ray's, or another package's
        return launchers.submitter(spec.launcher)(n, ctx, news)
    address = ctx.options.bind_address if spec.attach else "127.0.0.1"
    cluster = EngineCluster(
        n,
        cluster_id=spec.cluster_id,
        profile=spec.profile,
        ip=address,
        controller_nice=ctx.options.helper_nice,
        private=not spec.attach and wanted(ctx.options.private_network),
        preload=strategy.warm_modules if ctx.options.preload else (),
        threads=ctx.options.threads_per_rank or 0,
    )
    if not spec.attach:
        news(f"starting {n} engine{'s' if n != 1 else ''} on this machine (loopback only)...")
    return cluster


def reuse(strategy, ctx: RunContext) -> EngineCluster | None:
    """``strategy``'s warm cluster, restarted if it must be (``strategy.needs_restart``, an
    engine died); None where there is none or it was stopped (another N or place)."""
    spec, cluster = ctx.spec, strategy.cluster
    if cluster is None or not cluster.running:
        return None
    n, news = strategy.size(spec), _news(ctx)
    key = (n, spec.cluster_id, spec.profile, spec.launcher, spec.slurm or spec.ray)
    current = (
        cluster.n,
        cluster.cluster_id if cluster.attached else None,
        cluster.profile,
        cluster.launcher,
        cluster.options,
    )
    if current != key:
        news(ranks_changed(n, cluster.n, cluster.attached))
        strategy.teardown()
        return None
    if why := strategy.needs_restart or cluster.why_restart():
        news(restarting_engines(why))
        if cluster.owned:
            start_phase(cluster, ctx, cluster.restart)
        else:
            cluster.stop()
            start_phase(cluster, ctx, cluster.start)
    return cluster


def _news(ctx: RunContext):
    """Where progress lines go: said, or nowhere (%kdist start's thread prints nothing)."""
    return (lambda text: None) if ctx.quiet else say


def start_phase(cluster: EngineCluster, ctx: RunContext, start) -> None:
    """``start()`` the cluster as the run's first phase, counting the engines as they come."""
    record, n = ctx.record, cluster.n
    record.phase(phase_engines(n))
    cluster.on_registered = lambda k: record.phase_detail(registered(k, n))
    cluster.on_phase, cluster.on_detail = record.phase, record.phase_detail
    try:
        start()
    finally:
        cluster.on_registered = cluster.on_phase = cluster.on_detail = None
