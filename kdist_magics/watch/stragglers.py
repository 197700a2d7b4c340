"""Stragglers: a rank that is clearly slower than the others, from the ranks' own step timings.

In synchronous data parallelism every rank steps at the pace of the slowest one, so step
*periods* are equal and name nobody. What differs is where the time goes: the telemetry
callback reports, per rank, the mean time inside a step (``step_time``: from the last
callback's batch begin to the first callback's batch end; the collective is in there) and the
time between steps (``gap_time``: other callbacks, Python-side input). A rank that waits for
another spends that wait inside its steps. So, per rank:

    wait = step_time - the smallest step_time of all ranks
    own  = period - wait            (period: 1 / steps_per_s)

``own`` is the time the rank would need per step alone. A rank whose ``own`` is at least
``RATIO`` times the median of the others' (and a few milliseconds more) is marked. The
estimate reads per-rank durations only (no clocks compared across hosts). It assumes the ranks
compute the same step (data parallelism), and it cannot see a rank slowed *inside* the step's
compute, since the others' wait then sits in the collective as well (the CPU figure in the note
helps there). Keras on JAX runs batch ends on a thread pool, so its rows carry no step timing
and nobody is marked.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable

#: a rank's own time per step at least this many times the others' median marks it
RATIO = 1.5
#: ... and at least this many seconds more (timer noise on tiny models)
MIN_EXCESS = 0.003
#: rows per rank needed before anyone is judged
MIN_ROWS = 3
#: the live view judges on each rank's latest rows
WINDOW = 10


@dataclass(frozen=True)
class Straggler:
    rank: int
    ratio: float  # own time per step / the others' median
    own_s: float  # this rank's own seconds per step
    others_s: float  # the others' median
    cpu_percent: float | None = None


def own_times(rows: Iterable[dict[str, Any]], window: int | None = None) -> dict[int, float]:
    """Each rank's own seconds per step, from its step rows (``kind == "step"``)."""
    return {rank: own for rank, (own, _) in timings(rows, window).items()}


def timings(rows: Iterable[dict[str, Any]], window: int | None = None) -> dict[int, tuple[float, float]]:
    """Each rank's (own seconds per step, seconds per step it waits for the others)."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("kind", "step") != "step":
            continue
        if isinstance(row.get("step_time"), (int, float)) and row.get("steps_per_s"):
            by_rank.setdefault(int(row.get("rank", 0) or 0), []).append(row)
    medians = {}
    for rank, own in by_rank.items():
        own = own[-window:] if window else own
        if len(own) >= MIN_ROWS:
            medians[rank] = (
                statistics.median(1.0 / r["steps_per_s"] for r in own),
                statistics.median(r["step_time"] for r in own),
            )
    if len(medians) < 2:
        return {}
    least = min(step for _, step in medians.values())
    return {rank: (max(period - (step - least), 1e-6), step - least) for rank, (period, step) in medians.items()}


def find(
    rows: Iterable[dict[str, Any]], cpu: dict[int, float | None] | None = None, window: int | None = None
) -> list[Straggler]:
    """The ranks clearly slower than the others (none on a balanced run)."""
    own = own_times(rows, window)
    out = []
    for rank, mine in sorted(own.items()):
        others = statistics.median(v for r, v in own.items() if r != rank)
        if mine >= RATIO * others and mine - others >= MIN_EXCESS:
            out.append(Straggler(rank, mine / others, mine, others, (cpu or {}).get(rank)))
    return out
