"""``make bench``'s last lines: each goal with the figure last recorded beside it, and
"REGRESSED" where that one met the goal and this one does not (fast tier)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import run_all  # noqa: E402


def test_a_goal_met_before_and_missed_now_says_regressed():
    recorded = {
        "P1": {"value": 1.02, "date": "5 Dec 2026"},
        "P8": {"value": 0.7, "date": "1 Dec"},
        "P11": {"value": 0.8, "date": "5 Dec 2026"},
    }
    values = {key: None for key in run_all.GOALS}
    values.update({"P1": 0.95, "P8": 0.65, "P11": 0.9, "P7 multiworker": 0.98})
    lines = {
        line.split(" (")[0].rsplit(" ", 1)[0] if "not measured" not in line else line.split(" not")[0]: line
        for line in run_all.judged(values, recorded)
    }
    assert lines["P1"] == "P1 0.950 (goal >= 0.99; recorded 1.020 on 5 Dec 2026) REGRESSED: met before"
    assert lines["P8"].endswith(" not met") and "REGRESSED" not in lines["P8"]  # missed before too
    assert lines["P11"] == "P11 0.900 (goal <= 1.5; recorded 0.800 on 5 Dec 2026)"
    assert lines["P7 multiworker"] == "P7 multiworker 0.980 (goal >= 0.97)"  # nothing recorded
    assert lines["P2"] == "P2 not measured (goal <= 0.1)"


def test_every_recorded_figure_is_a_goal_and_dated():
    recorded = json.loads((BENCH / "recorded.json").read_text())
    assert set(recorded) <= set(run_all.GOALS)
    assert all(isinstance(r["value"], float | int) and r["date"] for r in recorded.values())
