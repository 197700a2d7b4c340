"""P1 and P3 on a machine with GPUs (not run by ``make bench``; run it by hand there).

Same method as ``bench_horovod.py`` (one real kernel, alternating runs, medians),
with each rank pinned to GPU ``local_rank`` (``KDIST_BENCH_GPU=1`` makes
``workload.train`` call ``tf.config.set_visible_devices`` with memory growth) and
a larger batch and width, so the GPU, not Python, sets the pace:

  P1 (GPU)  ``%%kdist --strategy horovod --np G`` / ``horovodrun -np G --gloo``, same threads
  P3 (GPU)  ``%%kdist`` with the dashboard / ``--no-dashboard`` (horovod strategy), and
            ``dashboard_overhead.py --strategy default`` (training in the kernel, on one GPU)

G = GPUs visible (at most 8). Needs the GPU build of TensorFlow and Horovod built
against it (``scripts/setup.sh`` installs ``tensorflow`` when ``nvidia-smi`` works).
Gloo carries the allreduce (this set-up builds Horovod without NCCL), so P1 compares
launchers, not the fastest GPU collective.

Without a GPU it says so and exits 0:  ``python benchmarks/gpu_p1_p3.py [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
PY = sys.executable


def gpus_visible() -> tuple[int, str]:
    """(GPUs TensorFlow sees, why not when 0) -- asked in a subprocess, nothing imported here."""
    if shutil.which("nvidia-smi") is None:
        return 0, "no nvidia-smi on this machine"
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    count = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    if listed.returncode != 0 or count == 0:
        return 0, "nvidia-smi lists no GPU"
    probe = subprocess.run(
        [PY, "-c", "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    try:
        seen = int(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0, f"TensorFlow could not be asked: {probe.stderr.strip()[-300:]}"
    if seen == 0:
        return 0, (
            f"nvidia-smi lists {count} GPU(s) but this TensorFlow sees none "
            "(a CPU build? run scripts/setup.sh on this machine)"
        )
    return seen, ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=4096, help="samples per rank per step")
    parser.add_argument("--hidden", type=int, default=4096, help="width of the two hidden layers")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    count, why = gpus_visible()
    if count == 0:
        print(f"gpu_p1_p3: skipped: {why}. This benchmark needs GPUs.")
        return 0
    np_ = min(count, 8)
    os.environ.update(KDIST_BENCH_GPU="1", KDIST_BENCH_BATCH=str(args.batch), KDIST_BENCH_HIDDEN=str(args.hidden))
    tmp = Path(tempfile.mkdtemp(prefix="kdist-bench-gpu-"))
    hvd = subprocess.run(
        [
            PY,
            str(BENCH / "bench_horovod.py"),
            "--np",
            str(np_),
            "--variants",
            "K,D,S",
            "--repeats",
            str(args.repeats),
            "--steps",
            str(args.steps),
            "--json",
            str(tmp / "horovod.json"),
        ]
    )
    dash = subprocess.run(
        [PY, str(BENCH / "dashboard_overhead.py"), "--strategy", "default", "--json", str(tmp / "dashboard.json")]
    )
    results = {"gpus": count, "np": np_}
    print()
    if hvd.returncode == 0:
        res = json.loads((tmp / "horovod.json").read_text())
        results["horovod"] = res
        r = res["median_rate"]
        print(f"P1 (GPU, np {np_}) {r['K'] / r['S']:.3f} (goal >= 0.99)")
        print(f"P3 (GPU, horovod) {r['K'] / r['D']:.3f} (goal >= 0.99)")
    else:
        print("P1 (GPU) not measured: bench_horovod.py failed (see above)")
    if dash.returncode == 0:
        res = json.loads((tmp / "dashboard.json").read_text())
        results["dashboard"] = res
        print(f"P3 (GPU, in-kernel default) {res['P3']:.3f} (goal >= 0.99)")
    else:
        print("P3 (GPU, in-kernel) not measured: dashboard_overhead.py failed (see above)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if hvd.returncode == 0 and dash.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
