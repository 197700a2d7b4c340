"""Soak through a real kernel: consecutive short Horovod runs (successes, a rank raising, the Stop
button, --timeout, and faults: a rank dying, an engine killed while Horovod starts) leave the
kernel tree's process count, the kernel's fds and its RSS flat; so do multiworker runs.

Runs 30 of ``benchmarks/soak.py``'s runs for Horovod (its default is 50; ``KDIST_SOAK_RUNS``
changes the suite's): every outcome and both faults at least once, and a leak of one process or
fd per run still shows over the runs between. The benchmark keeps the long soaks. Asserts
counts only:
the outcome of every run, the process/fd drift and the RSS growth bound; never times.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("jupyter_client", reason="jupyter_client drives the kernel")
pytest.importorskip("psutil", reason="processes and fds are counted with psutil")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import soak  # noqa: E402

pytestmark = [pytest.mark.engines, pytest.mark.slow, pytest.mark.long]
RUNS = int(os.environ.get("KDIST_SOAK_RUNS", "30"))


def check(result: dict, runs: int, kinds: set[str]) -> None:
    rows, verdict = result["rows"], result["verdict"]
    assert len(rows) == runs
    assert {r["kind"] for r in rows} == kinds
    assert not verdict["unexpected"], verdict["unexpected"]  # every run ended as it should
    first, last = verdict["procs_first_last"]
    judged = runs - 5 - sum(r["kind"] in soak.FAULTS for r in rows[5:])
    assert first == last and abs(verdict["procs_slope_per_run"]) * judged < 1.0, verdict
    assert abs(verdict["fds_slope_per_run"]) * judged < verdict["bounds"]["fd_drift"], verdict
    assert verdict["rss_growth_mib"] < verdict["bounds"]["rss_growth_mib"], verdict
    assert not verdict["left_after_stop"], verdict
    assert verdict["flat"]


@pytest.mark.horovod
@pytest.mark.timeout(900)
def test_consecutive_runs_with_faults_leave_processes_fds_and_rss_flat():
    """Horovod: successes, raising ranks, Stop, timeouts, and a fault every 11th run (a rank
    dying mid-cell, an engine killed while Horovod starts): flat on the runs between."""
    pytest.importorskip(
        "horovod.tensorflow",
        reason="Horovod is not installed here (make test builds it into .venv; the Colab-pinned .venv-colab has none, as Colab has none)",
    )
    out = io.StringIO()
    result = soak.soak(runs=RUNS, warmup=5, out=out, faults=True, fault_every=11)
    sys.stderr.write(out.getvalue())  # the table, for whoever reads the log
    kinds = {"ok", "raise", "interrupt", "timeout"} | ({"die", "held"} if RUNS >= 22 else set())
    check(result, RUNS, kinds)


@pytest.mark.timeout(900)
def test_multiworker_runs_with_faults_leave_processes_fds_and_rss_flat():
    """MultiWorkerMirroredStrategy: 20 runs of successes, raising workers and the two faults
    (every 8th run)."""
    pytest.importorskip("tensorflow", reason="multiworker runs TensorFlow on the engines")
    out = io.StringIO()
    result = soak.soak(runs=20, warmup=5, out=out, strategy="multiworker", faults=True, fault_every=8)
    sys.stderr.write(out.getvalue())
    check(result, 20, {"ok", "raise", "die", "held"})


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["jax", pytest.param("torch", marks=pytest.mark.torch)])
def test_jax_and_torch_multiworker_runs_with_faults_leave_processes_fds_and_rss_flat(backend):
    """Keras on JAX / PyTorch across engines: 12 runs of successes, every process raising, and
    the two faults (runs 5 and 10: a rank dying mid-cell, an engine killed while
    jax.distributed / torch.distributed starts), each costing the next run a restart."""
    pytest.importorskip(
        backend,
        reason=f"multiworker under KERAS_BACKEND={backend} needs {backend} (.venv has both; .venv-colab has no torch)",
    )
    out = io.StringIO()
    result = soak.soak(runs=12, warmup=5, out=out, strategy=backend, faults=True, fault_every=5)
    sys.stderr.write(out.getvalue())
    check(result, 12, {"ok", "raise", "die", "held"})
