"""Waiting on every engine outside the cell: set-up calls, ``--pull``, the run's begin.

While the cell runs, the :class:`~.supervisor.RunSupervisor` watches the engines; before
and after it, kdist waits on calls made to every engine at once. Those waits watch too: an
engine that dies or stays stopped, or the controller ending, fails the wait at once with
:class:`~kdist_magics.errors.RankDied` / :class:`~kdist_magics.errors.ControllerDied`
naming the phase, instead of leaving the kernel waiting for a reply that cannot come.

Each wait is given ``run``: the :class:`~.run.EngineRun` in progress or, while a cluster is
planned outside a run, the strategy. Of it, a wait uses ``cluster`` and ``must_restart(why)``
(a death found marks the engines for a restart before the next cell).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from ...errors import ControllerDied, KDistError, RankDied
from ...rank.faults import hold

LOOK_EVERY = 0.25  # seconds between looks at the engines' and controller's processes
#: seconds an "engine died" error from ipyparallel waits for the death to show (the
#: controller can unregister an engine a moment before its process is seen ended)
DEATH_SHOWS_WITHIN = 5.0


def engine_died(exc: BaseException) -> bool:
    """ipyparallel's own word that an engine died under a request (``EngineError``, raised
    as itself or inside a ``RemoteError``)."""
    return getattr(exc, "ename", type(exc).__name__) == "EngineError"


def _settle(errors) -> float:
    """How long to look for a death before giving up: ``DEATH_SHOWS_WITHIN`` when one of
    ``errors`` is ipyparallel's "engine died", else not at all."""
    return DEATH_SHOWS_WITHIN if any(engine_died(e) for e in errors) else 0.0


def rank_of(cluster, ranks) -> dict[int, int]:
    """``{engine_id: rank}`` from each engine's rank in ``cluster.engines`` order (or that dict)."""
    return ranks if isinstance(ranks, dict) else {e.engine_id: r for e, r in zip(cluster.engines, ranks)}


def check(run, ranks, during: str, ran: bool = False, settle: float = 0.0) -> None:
    """Raise if the controller or an engine of ``run.cluster`` in ``ranks`` is gone
    (marking the engines for a restart). ``ranks``: each engine's rank, in
    ``cluster.engines`` order, or ``{engine_id: rank}`` of the engines that matter.
    ``settle``: look again for up to that many seconds before finding nothing."""
    deadline = time.monotonic() + settle
    while True:
        _check(run, ranks, during, ran)
        if time.monotonic() >= deadline:
            return
        time.sleep(LOOK_EVERY)


def _check(run, ranks, during: str, ran: bool) -> None:
    cluster = run.cluster
    if cluster is None:
        return
    if how := cluster.controller_gone():
        run.must_restart("the controller died in the previous run")
        raise ControllerDied(how, during, ran, owned=cluster.owned)
    by_engine = rank_of(cluster, ranks)
    deaths = {eid: how for eid, how in cluster.dead().items() if eid in by_engine}
    if deaths:
        by_rank = {by_engine[eid]: how for eid, how in deaths.items()}
        run.must_restart("an engine died in the previous run")
        raise RankDied(by_rank, during, ran, owned=cluster.owned)


@contextlib.contextmanager
def named_deaths(run, ranks, during: str, ran: bool = False):
    """Around calls that reach the engines: ipyparallel's own error for an engine that is
    already gone (a ``KeyError`` for its id, once the controller has unregistered it) becomes
    that engine's death, named (:func:`check`); any other error passes unchanged."""
    try:
        yield
    except KDistError:
        raise
    except Exception as exc:
        check(run, ranks, during, ran, settle=_settle([exc]))
        raise


def wait_all(run, ars: list, ranks, timeout: float | None, during: str, ran: bool = False, every: float = 0.05) -> None:
    """Until every one of ``ars`` is ready, one has failed, or ``timeout`` s pass (None: no
    bound); the engines and the controller are looked at meanwhile (see :func:`check`)."""
    deadline = time.monotonic() + timeout if timeout is not None else float("inf")
    next_look = 0.0
    while not all(ar.ready() for ar in ars):
        if any(ar.ready() and not ar.successful() for ar in ars):
            break
        now = time.monotonic()
        if now >= deadline:
            return
        if now >= next_look:
            check(run, ranks, during, ran)
            next_look = now + LOOK_EVERY
        time.sleep(every)
    failed = [ar for ar in ars if ar.ready() and not ar.successful()]
    if failed:
        # ipyparallel reports an engine's death as its task's error: name the death instead
        check(run, ranks, during, ran, settle=_settle(_error(ar) for ar in failed))


def _error(ar) -> BaseException | None:
    """The error a ready, failed result raises."""
    try:
        ar.get(timeout=0)
    except Exception as exc:
        return exc
    return None


def gather(run, ars: list, ranks, timeout: float | None, during: str, ran: bool = False) -> list[Any]:
    """Every result of ``ars`` (a rank's error is raised as itself), watched as :func:`wait_all`
    (``during``: the words for when, "while Horovod started"; ``ran``: after the cell)."""
    wait_all(run, ars, ranks, timeout, during, ran)
    return [ar.get(timeout=0 if ar.ready() else 1) for ar in ars]


def setup_results(run, ars, ranks: list[int], what: str, reach: str, timeout: float, failed: str) -> dict[int, Any]:
    """Wait for a set-up call made on every engine at once (the ranks wait for each
    other); ``{rank: result}``. One that does not finish, or any that raise, mark the
    engines for a restart and raise :class:`KDistError` naming the ranks; an engine or the
    controller ending raises at once (:func:`check`). ``what`` is what starts
    ("jax.distributed"), ``reach`` the addresses every engine must reach, ``failed`` the
    words before the per-rank errors."""
    hold("init", run.cluster)
    wait_all(run, ars, ranks, timeout, f"while {what} started")
    results: dict[int, Any] = {}
    failures = []
    if any(ar.ready() and not ar.successful() for ar in ars):
        ars_ranks = [(ar, rank) for ar, rank in zip(ars, ranks) if ar.ready()]
    else:
        ars_ranks = list(zip(ars, ranks))
    for ar, rank in ars_ranks:
        if not ar.ready():
            run.must_restart(f"{what} did not start")
            raise KDistError(
                f"{what} did not start on rank {rank} within {timeout:g} s: can every engine reach {reach}?"
            )
        try:
            results[rank] = ar.get()
        except Exception as exc:
            failures.append(f"rank {rank}: {getattr(exc, 'ename', type(exc).__name__)}: {getattr(exc, 'evalue', exc)}")
    if failures:
        run.must_restart(f"{what} failed to start")
        waiting = [rank for ar, rank in zip(ars, ranks) if not ar.ready()]
        others = (
            f" (rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} left waiting for it)"
            if waiting
            else ""
        )
        raise KDistError(f"{failed}: " + "; ".join(failures) + others)
    return results
