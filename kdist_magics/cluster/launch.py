"""How an owned cluster's processes are launched: the controller's heartbeat, the launchers'
configuration (every process through :mod:`.follow`), and the test suite's account of clusters
started. Shared by the local cluster and the launchers' clusters (Slurm's, Ray's)."""

from __future__ import annotations

import os

#: an owned controller's heartbeat: ipyparallel counts an engine registered at the first beat
#: after its heart answered one, so its default of a beat every 3 s made every cold start wait
#: 3-6 s for nothing (the engines were up). A beat every 0.25 s, and the same 30 s of silence
#: (120 beats) as the default before an engine is dropped: kdist itself tells a dead or frozen
#: engine from its process, not from the heartbeat.
HEARTBEAT_MS, HEARTBEAT_MISSES = 250, 120


def start_failed(cluster, exc: Exception, where: str):
    """A launcher's cluster whose start failed: stop what started; its words (a ClusterError
    already says why), naming ``where`` the engines were to start."""
    from ..errors import ClusterError

    cluster.stop()
    if isinstance(exc, ClusterError):
        return exc
    return ClusterError(f"could not start {cluster.n} engines {where}: {type(exc).__name__}: {exc}")


def heartbeat_args() -> list[str]:
    return [f"--HeartMonitor.period={HEARTBEAT_MS}", f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}"]


def config(
    controller_nice: int = 0, netns: int | None = None, preload: tuple[str, ...] = (), threads: int = 0, ranks: int = 1
):
    """Launcher configuration: an owned cluster's controller and engines start through
    :mod:`kdist_magics.cluster.follow`, so they (and their nannies and schedulers) end with this
    kernel from their first instant, even while they are still starting; the engines inside
    the namespaces of holder ``netns`` when given (:mod:`.namespace`), importing ``preload``
    as they start (``threads`` per rank, 0: the run's rule; ``ranks`` engines on this host)."""
    from traitlets.config import Config

    from .follow import command

    config = Config()
    config.LocalControllerLauncher.controller_cmd = command("ipyparallel.controller", nice=controller_nice)
    engine = command("ipyparallel.engine", netns=netns, preload=preload, threads=threads, ranks=ranks)
    config.LocalEngineLauncher.engine_cmd = engine
    config.LocalEngineSetLauncher.engine_cmd = engine
    return config


def log_start(cluster) -> None:
    """One JSON line per cluster started, where ``KDIST_CLUSTER_LOG`` names a file: the test
    suite counts the clusters it starts this way (``tests/account.py``). Nothing otherwise."""
    path = os.environ.get("KDIST_CLUSTER_LOG")
    if not path:
        return
    import json

    row = {
        "owned": cluster.owned,
        "n": cluster.n,
        "pid": os.getpid(),
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
    }
    try:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    except OSError:
        pass  # an account of clusters never fails a run
