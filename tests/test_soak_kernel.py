"""Soak through a real kernel: consecutive short Horovod runs (successes, a rank raising, the Stop
button, --timeout) leave the kernel tree's process count, the kernel's fds and its RSS flat.

Runs ``benchmarks/soak.py``'s 50 runs (about 1 s each on warm engines, ~1.5 min with the
cluster start on the shared 2-core machine, so CI can afford all of them; ``KDIST_SOAK_RUNS``
to change). Asserts counts only:
the outcome of every run, the process/fd drift and the RSS growth bound; never times.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here (make test builds it into .venv; the Colab-pinned .venv-colab has none, as Colab has none)")
pytest.importorskip("jupyter_client", reason="jupyter_client drives the kernel")
pytest.importorskip("psutil", reason="processes and fds are counted with psutil")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import soak  # noqa: E402

pytestmark = [pytest.mark.engines, pytest.mark.horovod, pytest.mark.slow]
RUNS = int(os.environ.get("KDIST_SOAK_RUNS", "50"))


@pytest.mark.timeout(900)
def test_consecutive_runs_leave_processes_fds_and_rss_flat():
    out = io.StringIO()
    result = soak.soak(runs=RUNS, warmup=5, out=out)
    sys.stderr.write(out.getvalue())  # the table, for whoever reads the log
    rows, verdict = result["rows"], result["verdict"]
    assert len(rows) == RUNS
    assert {r["kind"] for r in rows} == {"ok", "raise", "interrupt", "timeout"}
    assert not verdict["unexpected"], verdict["unexpected"]  # every run ended as it should
    first, last = verdict["procs_first_last"]
    assert first == last and abs(verdict["procs_slope_per_run"]) * (RUNS - 5) < 1.0, verdict
    assert abs(verdict["fds_slope_per_run"]) * (RUNS - 5) < verdict["bounds"]["fd_drift"], verdict
    assert verdict["rss_growth_mib"] < verdict["bounds"]["rss_growth_mib"], verdict
    assert not verdict["left_after_stop"], verdict
    assert verdict["flat"]
