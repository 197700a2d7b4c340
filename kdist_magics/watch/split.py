"""``last_run().split()`` and the dashboard's step split: each rank's mean seconds per step in
compute, communication and the rest, from the telemetry's step rows.

The telemetry times each step from its begin to its end (``step_time``: the forward and
backward pass, the gradient collective, the update) and the time between steps (``gap_time``:
input, callbacks): that is the live split every backend but JAX gives (Keras on JAX runs batch
ends late, on a thread pool, so its rows carry neither). Inside a step, the collective cannot be
told apart from compute while the run goes on; ``%kdist scale`` measures a rank's compute
alone (its 1-rank step), and with that figure the in-step time splits into compute and
communication (the rest of it: the collective and the wait for slower ranks). Without a probe
of the same strategy, ``compute_s`` and ``communication_s`` are None and ``in_step_s`` holds
both.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable

from ..messages import SPLIT_LIVE, SPLIT_PROBED, SPLIT_UNTIMED


def split(rows: Iterable[dict[str, Any]], compute: float | None = None) -> list[dict[str, Any]]:
    """One row per rank: ``rank``, ``in_step_s``, ``compute_s``, ``communication_s``,
    ``rest_s`` (means over the step rows; None where not measured), ``source``."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("kind", "step") == "step" and isinstance(row.get("step"), (int, float)):
            by_rank.setdefault(int(row.get("rank", 0) or 0), []).append(row)
    return [rank_split(rank, steps, compute) for rank, steps in sorted(by_rank.items())]


def rank_split(rank: int, steps: list[dict[str, Any]], compute: float | None) -> dict[str, Any]:
    """One rank's split from its step rows (see :func:`split`)."""
    timed = [r["step_time"] for r in steps if isinstance(r.get("step_time"), (int, float))]
    if not timed:
        return {"rank": rank, "in_step_s": None, "compute_s": None, "communication_s": None,
                "rest_s": None, "source": SPLIT_UNTIMED}
    in_step = statistics.fmean(timed)
    gaps = [r["gap_time"] for r in steps if isinstance(r.get("gap_time"), (int, float))]
    return {
        "rank": rank, "in_step_s": in_step,
        "compute_s": min(compute, in_step) if compute is not None else None,
        "communication_s": max(in_step - compute, 0.0) if compute is not None else None,
        "rest_s": statistics.fmean(gaps) if gaps else None,
        "source": SPLIT_PROBED if compute is not None else SPLIT_LIVE}
