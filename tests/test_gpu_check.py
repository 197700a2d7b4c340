"""``benchmarks/gpu_check.py`` keeps working where no GPU is: its dry run does every check on the
CPU with one pretend GPU, so the script itself (its cells, its reading of the results) is
exercised here; what only a GPU shows stays for a machine that has one."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.gpucheck
@pytest.mark.long  # JAX and torch (~2 min): in the long tier's session, beside the Colab part
@pytest.mark.timeout(900)
def test_gpu_check_runs_through_on_the_cpu():
    pytest.importorskip("jax", reason="the GPU check is Keras on JAX (make test installs it)")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=800)
    out = proc.stdout
    assert "dry run on the CPU" in out, out + proc.stderr[-2000:]
    # the telemetry check saw the CPU (no NVML rows), so it fails: the GPU condition is real
    assert re.search(
        r"^FAIL telemetry \+ mirrored on JAX .*platform cpu, 0 NVML rows.*notes \['CPU only'\]", out, re.M
    ), out
    backends = ["jax"] + (["torch"] if importlib.util.find_spec("torch") else [])
    for backend in backends:
        line = next(l for l in out.splitlines() if l.startswith(("PASS", "FAIL")) and f"{backend} multiworker" in l)
        # placement shared the pretend GPU with a memory fraction each; the weights agree
        assert "env [['0', '0.45'], ['0', '0.45']]" in line and "identical weights True" in line, line
        assert re.search(rf"^PASS {backend}: one GPU per rank .*2 ranks on .*which has 1 GPU", out, re.M), out
    # sharded: the processes hold half of each big kernel and agree; on the CPU, so it fails
    line = next(l for l in out.splitlines() if l.startswith(("PASS", "FAIL")) and "sharded" in l)
    assert line.startswith("FAIL sharded") and "on ['cpu', 'cpu']" in line, line
    assert "kernel per process [[256, 128], [256, 128]], same losses True" in line, line
    if "torch" in backends:  # the probe: measured at 1 and 2 ranks, on the CPU here, so it fails
        line = next(l for l in out.splitlines() if l.startswith(("PASS", "FAIL")) and "scale" in l)
        assert line.startswith("FAIL scale") and "on ['cpu', 'cpu'], measured N [1, 2]" in line, line
        assert "MiB/s by torch.distributed's all-reduce, gloo" in line, line  # the group's own collective
        assert "kdist scale: multiworker, per-rank batch 64" in out, out
    checks = 2 + 2 * len(backends) + ("torch" in backends)
    assert out.splitlines()[-1] == f"gpu_check: {len(backends)}/{checks} passed", out
    assert proc.returncode == 1
