"""Diagnostic (not part of ``make bench``): which kernel threads use CPU while a horovod cell trains.

Starts a real kernel (isolated dirs), warms a 2-engine cluster, runs the shared
workload as ``%%kdist --strategy horovod --np 2`` and samples the kernel's threads
(``/proc`` per-thread CPU times, named through ``threading.enumerate()`` in the
kernel) over a steady-state window. This is where P1's "CPU beside the ranks" goes.

``python benchmarks/kernel_threads.py [--steps 500] [--window 6]``
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402  (isolates IPython/Jupyter dirs on import)

NAMES = "{str(t.native_id): t.name for t in __import__('threading').enumerate()}"


def main(argv=None) -> None:
    import psutil

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--window", type=float, default=6.0, help="seconds sampled")
    parser.add_argument("--options", default="", help="extra %%kdist options, e.g. --no-dashboard")
    args = parser.parse_args(argv)
    out = harness.HOME / "runs"
    out.mkdir()
    kernel = harness.Kernel()
    try:
        kernel.run(harness.KERNEL_SETUP)
        harness.kdist_run(kernel, 40, out, "warm")
        names = kernel.value(NAMES)
        proc = psutil.Process(kernel.pid)
        found: list = []

        def sample():
            time.sleep(4)  # past start-up and the first steps
            first = {t.id: t.user_time + t.system_time for t in proc.threads()}
            time.sleep(args.window)
            last = {t.id: t.user_time + t.system_time for t in proc.threads()}
            found.append((first, last))

        sampler = threading.Thread(target=sample)
        sampler.start()
        run = harness.kdist_run(kernel, args.steps, out, "K", args.options)
        sampler.join()
        names.update(kernel.value(NAMES))
    finally:
        kernel.close()
    first, last = found[0]
    rate = run["ranks"][0]["step_ends"]
    print(
        f"kernel threads over {args.window:.0f} s of steady training "
        f"({len(rate)} steps in {rate[-1] - rate[0]:.1f} s), cores' worth of CPU:"
    )
    total = 0.0
    for tid, cpu in sorted(last.items(), key=lambda kv: -(kv[1] - first.get(kv[0], 0.0))):
        cores = (cpu - first.get(tid, 0.0)) / args.window
        total += cores
        if cores >= 0.0005:
            print(f"  {cores:.4f}  {names.get(str(tid), '(not a Python thread, or ended)')} [tid {tid}]")
    print(f"  {total:.4f}  total")


if __name__ == "__main__":
    main()
