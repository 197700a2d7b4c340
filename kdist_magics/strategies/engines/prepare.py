"""An engine prepared for a run: thread variables, the strategy's environment, the working
folder and the rank's GPU (:func:`prepare_remote`, on the engine), asked of every engine from
the kernel (:func:`prepare_engines`). ``--push`` is :mod:`.push`.

:func:`prepare_remote` is shared by a run (:mod:`.run`, :mod:`..horovod.grow`) and ``%kdist
start`` (:mod:`.warm`, which warms engines exactly as a run prepares them), so neither imports
the other for it.
"""

from __future__ import annotations

import os
from ...errors import KDistError
from . import waiting


def prepare_remote(env, threads, local_size, cwd=None, gpu=None):  # runs on an engine
    """:func:`kdist_magics.rank.lifecycle.prepare` with this host's threads per rank; what it did."""
    from kdist_magics.rank import lifecycle

    return lifecycle.prepare(env, lifecycle.threads_per_rank(local_size, threads), cwd, gpu, local_size)


def prepare_engines(run) -> None:
    """For ``run`` (an :class:`~.run.EngineRun`): thread variables, the strategy's environment
    and each rank's GPU, on every engine before the cell (and before a framework starts there);
    too few GPUs is an error here, before any engine runs the cell."""
    from ...cluster.placement import local_ranks

    ctx, cluster, ranks = run.ctx, run.cluster, run.ranks
    threads, policy = ctx.options.threads_per_rank, ctx.options.rank_gpus
    extra = run.strategy.engine_env(cluster, ctx)
    hosts = [e.hostname for e in cluster.engines]
    ars = []
    during = "while the engines were prepared"
    # an engine that died just before: ipyparallel raises at the send once its controller
    # has noticed, and gather names it otherwise; the same words either way (a test saw both)
    with waiting.named_deaths(run, ranks, during):
        for eng, env, (local, size) in zip(cluster.engines, extra, local_ranks(hosts, ranks)):
            cwd = os.getcwd() if cluster.owned else None
            ars.append(
                cluster.client[eng.engine_id].apply_async(
                    prepare_remote, dict(env), threads, size, cwd, (local, size, policy)
                )
            )
    infos = waiting.gather(run, ars, ranks, 60, during)
    errors = [info["gpu_error"] for info in infos if info.get("gpu_error")]
    if errors:
        raise KDistError(errors[0] + ". The cell did not run.")
