"""``last_run().split()`` and the dashboard's step split: each rank's mean seconds per step in
compute, communication, the wait for slower ranks and the rest, from the telemetry's step rows.

The telemetry times each step from its begin to its end (``step_time``: the forward and
backward pass, the gradient collective, the update) and the time between steps (``gap_time``:
input, callbacks): that is the live split every backend but JAX gives (Keras on JAX runs batch
ends late, on a thread pool, so its rows carry neither).

Where the collective is timed where it runs (kdist's Horovod binding times its all-reduce on
every rank: ``collective_time``), the split is measured: a rank's collective is the
communication plus its wait for the slowest rank to arrive, and the rank that arrives last waits
for no one, so communication is the least any rank spent in the collective, each rank's wait the
rest of its own, and its compute the step less its collective (``source``: :data:`SPLIT_TIMED`).

Elsewhere the collective cannot be told apart from compute while the run goes on; ``%kdist
scale`` measures a rank's compute alone (its 1-rank step), and with that figure the in-step time
splits into compute and communication (the rest of it: the collective and the wait for slower
ranks, inferred). Without either, ``compute_s`` and ``communication_s`` are None and
``in_step_s`` holds both.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable

from ..messages import SPLIT_LIVE, SPLIT_PROBED, SPLIT_TIMED, SPLIT_UNTIMED


def split(rows: Iterable[dict[str, Any]], compute: float | None = None) -> list[dict[str, Any]]:
    """One row per rank: ``rank``, ``in_step_s``, ``compute_s``, ``communication_s``,
    ``wait_s``, ``rest_s`` (means over the step rows; None where not measured), ``source``."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("kind", "step") == "step" and isinstance(row.get("step"), (int, float)):
            by_rank.setdefault(int(row.get("rank", 0) or 0), []).append(row)
    out = [rank_split(rank, steps, compute) for rank, steps in sorted(by_rank.items())]
    timed = [r for r in out if r["collective_s"] is not None and r["in_step_s"] is not None]
    if len(out) > 1 and len(timed) == len(out):
        least = min(r["collective_s"] for r in timed)  # the last to arrive waited for no one
        for r in timed:
            r.update(
                compute_s=max(r["in_step_s"] - r["collective_s"], 0.0),
                communication_s=least,
                wait_s=r["collective_s"] - least,
                source=SPLIT_TIMED,
            )
    for r in out:
        del r["collective_s"]
    return out


def rank_split(rank: int, steps: list[dict[str, Any]], compute: float | None) -> dict[str, Any]:
    """One rank's split from its step rows (see :func:`split`)."""
    timed = [r["step_time"] for r in steps if isinstance(r.get("step_time"), (int, float))]
    reduced = [r["collective_time"] for r in steps if isinstance(r.get("collective_time"), (int, float))]
    collective = statistics.fmean(reduced) if reduced else None
    if not timed:
        return {
            "rank": rank,
            "in_step_s": None,
            "compute_s": None,
            "communication_s": None,
            "wait_s": None,
            "rest_s": None,
            "source": SPLIT_UNTIMED,
            "collective_s": collective,
        }
    in_step = statistics.fmean(timed)
    gaps = [r["gap_time"] for r in steps if isinstance(r.get("gap_time"), (int, float))]
    return {
        "rank": rank,
        "in_step_s": in_step,
        "compute_s": min(compute, in_step) if compute is not None else None,
        "communication_s": max(in_step - compute, 0.0) if compute is not None else None,
        "wait_s": None,
        "rest_s": statistics.fmean(gaps) if gaps else None,
        "source": SPLIT_PROBED if compute is not None else SPLIT_LIVE,
        "collective_s": collective,
    }
