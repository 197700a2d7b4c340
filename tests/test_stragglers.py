"""Stragglers from the ranks' step timings (fast tier: rows as the telemetry callback sends them)."""

from __future__ import annotations

import html

import pytest

from kdist_magics.watch import stragglers
from kdist_magics.watch.dashboard import Dashboard
from kdist_magics.watch.record import RunRecord


def _rows(rank: int, step_time: float, gap_time: float, n: int = 8, jitter: float = 0.0):
    period = step_time + gap_time
    return [
        {
            "rank": rank,
            "kind": "step",
            "step": 10 * (i + 1),
            "epoch": 0,
            "loss": 1.0,
            "steps_per_s": 1.0 / (period * (1 + jitter * (-1) ** i)),
            "step_time": step_time * (1 + jitter * (-1) ** i),
            "gap_time": gap_time,
        }
        for i in range(n)
    ]


def _synchronised(own: dict[int, float], compute: float = 0.004):
    """Rows of ranks in lock step: each waits inside its step for the slowest one's own time."""
    slowest = max(own.values())
    rows = []
    for rank, mine in own.items():
        gap = mine - compute  # what the rank does outside the step (callbacks, input)
        rows += _rows(rank, compute + (slowest - mine), gap)
    return rows


def test_a_balanced_run_has_no_straggler():
    rows = _synchronised({0: 0.010, 1: 0.0105, 2: 0.0098, 3: 0.0101})
    assert stragglers.find(rows) == []
    own = stragglers.own_times(rows)
    assert set(own) == {0, 1, 2, 3} and max(own.values()) / min(own.values()) < 1.1


def test_the_rank_that_makes_the_others_wait_is_marked():
    # rank 1 spends 30 ms outside each step; ranks 0 and 2 wait for it inside theirs
    rows = _synchronised({0: 0.005, 1: 0.034, 2: 0.005})
    found = stragglers.find(rows, cpu={1: 12.0})
    assert [s.rank for s in found] == [1]
    s = found[0]
    assert s.own_s == pytest.approx(0.034) and s.others_s == pytest.approx(0.005)
    assert s.ratio == pytest.approx(6.8) and s.cpu_percent == 12.0
    # the periods alone are equal: the step time is what names it
    assert len({round(1 / r["steps_per_s"], 6) for r in rows}) == 1


def test_noise_and_too_little_data_name_nobody():
    noisy = _rows(0, 0.004, 0.001, jitter=0.3) + _rows(1, 0.004, 0.0012, jitter=0.3)
    assert stragglers.find(noisy) == []
    few = _synchronised({0: 0.005, 1: 0.05})
    few = [r for r in few if r["step"] <= 10 * (stragglers.MIN_ROWS - 1)]
    assert stragglers.find(few) == []
    # Keras on JAX sends no step timing (its batch ends run on a thread pool)
    jax_rows = [{k: v for k, v in r.items() if k != "step_time"} for r in _synchronised({0: 0.005, 1: 0.05})]
    assert stragglers.find(jax_rows) == []
    # a tiny model's timer noise: 2 ms against 1 ms is below MIN_EXCESS
    assert stragglers.find(_synchronised({0: 0.001, 1: 0.002}, compute=0.0005)) == []


def test_record_summary_and_dashboard_name_the_straggler():
    rec = RunRecord("horovod", size=3)
    for row in _synchronised({0: 0.005, 1: 0.034, 2: 0.005}):
        rec.add("metric", row)
    rec.add("sample", {"rank": 1, "cpu_percent": 99.6})
    notes = rec.straggler_notes()
    assert notes == ["rank 1: steps 6.8x the others' median (34 ms vs 5 ms of its own work per step), CPU 100 %"]
    dash = Dashboard(rec, interval=None)
    state, _ = dash.snapshot()
    assert state["stragglers"] == notes
    assert [r["rank"] for r in state["ranks"] if r["straggler"]] == [1]
    assert state["ranks"][0]["own_step_s"] == pytest.approx(0.005)
    # ranks 0 and 2 wait 29 ms per step for rank 1, which waits for nobody
    assert [r["wait_step_s"] for r in state["ranks"]] == pytest.approx([0.029, 0.0, 0.029])
    rec.finish("done")
    assert notes[0] in rec.summary() and html.escape(notes[0]) in dash.html()


def test_a_balanced_record_says_nothing():
    rec = RunRecord("horovod", size=2)
    for row in _synchronised({0: 0.010, 1: 0.0102}):
        rec.add("metric", row)
    rec.finish("done")
    assert "straggler" not in rec.summary() and "steps" not in rec.summary()
    state, _ = Dashboard(rec, interval=None).snapshot()
    assert state["stragglers"] == [] and not any(r["straggler"] for r in state["ranks"])
