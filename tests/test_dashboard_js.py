"""The widget's axes (static/dashboard.js) follow the same rules as kdist_magics.watch.axes.

The browser tests see the charts on screen; here Node runs the module's exported helpers over a
table of ranges, and every answer must equal Python's (ticks, log choice, smoothing, labels).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from kdist_magics.watch import axes
from kdist_magics.watch.offline import STATIC

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(
    NODE is None, reason="Node.js is not installed: the module's helpers are checked in the browser tests only"
)

RANGES = [
    (0.16, 10.0),
    (0.0, 1.0),
    (-3.0, 7.5),
    (2.0, 2.0),
    (1.0, 200.0),
    (0.5, 0.9),
    (1e-6, 10.0),
    (0.0012, 0.0049),
    (123456.0, 987654.0),
    (1.0, 1.0001),
    (-0.02, -0.01),
]
POSITIVE = [r for r in RANGES if r[0] > 0]
LABELS = [0.0, 1500.0, 0.25, 2e5, 1e-4, 0.001, 12.5, -0.3, 1234.5, 3.0]
SERIES = [[10.0, 0.16], [1.0, 2.0, 3.0], [-1.0, 100.0], [0.5, 4.0, 1.0, 0.2], [5.0]]


def _js(expr: str):
    module = (STATIC / "dashboard.js").as_uri()
    script = f'import * as d from "{module}";\nconsole.log(JSON.stringify({expr}));'
    out = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout)


def test_ticks_match_python():
    got = _js(f"{json.dumps(RANGES)}.map(([a, b]) => d.linearRange(a, b))")
    want = [list(axes.linear_range(a, b)) for a, b in RANGES]
    assert got == [[a, b, list(t)] for a, b, t in want]
    for lo, hi, ticks in want:  # the axis holds every tick, and ticks are evenly spaced
        assert lo == ticks[0] and hi == ticks[-1] and 3 <= len(ticks) <= 11


def test_log_ticks_match_python_and_cover_the_data():
    got = _js(f"{json.dumps(POSITIVE)}.map(([a, b]) => d.logRange(a, b))")
    want = [list(axes.log_range(a, b)) for a, b in POSITIVE]
    assert got == [[a, b, list(t)] for a, b, t in want]
    for (lo, hi), (a, b, ticks) in zip(POSITIVE, want):
        assert a <= lo and b >= hi and ticks and all(a <= t <= b for t in ticks)


def test_log_choice_smoothing_and_labels_match_python():
    assert _js(f"{json.dumps(SERIES)}.map(v => d.wantsLog(v))") == [axes.wants_log(v) for v in SERIES]
    assert [axes.wants_log(v) for v in SERIES] == [True, False, False, True, False]
    got = _js(f"{json.dumps(SERIES)}.map(v => d.smooth(v))")
    for g, v in zip(got, SERIES):
        assert g == pytest.approx(axes.smooth(v), rel=1e-12)
    assert axes.smooth([4.0, 4.0, 4.0]) == pytest.approx([4.0, 4.0, 4.0])  # debiased from step 1
    assert _js(f"{json.dumps(LABELS)}.map(v => d.tickLabel(v))") == [axes.tick_label(v) for v in LABELS]
    assert [axes.tick_label(v) for v in (1500.0, 0.25, 2e5, 1e-4)] == ["1500", "0.25", "2e5", "1e-4"]


def test_the_title_names_the_mesh_of_a_sharded_run():
    states = [
        {"strategy": "sharded", "mesh": "1x4", "size": 4},
        {"strategy": "horovod", "size": 3, "world_size": 4},
        {"strategy": "default", "size": 1, "mesh": None},
    ]
    assert _js(f"{json.dumps(states)}.map(s => d.titleText(s))") == [
        "kdist · sharded, mesh 1x4 · 4 ranks",
        "kdist · horovod · 4 of 3 ranks",
        "kdist · default · 1 rank",
    ]


def test_rates_read_as_numbers_not_exponents():
    """The progress line said "2.906e+4 samples/s"."""
    got = _js("[29060.4, 1234.5, 12.345, 0.0123, 0, 2.5e9, null].map(v => d.fmtNum(v))")
    assert got == ["29,060", "1,235", "12.35", "0.0123", "0", "2.50e+9", "–"]
