"""P6: a fresh kernel's first ``%%kdist --strategy horovod --np 2`` cell against horovodrun's
whole job, the same training (``workload.train``, ``--steps`` steps).

Per repeat, in a rotating order:

  C  a fresh kernel (jupyter_client, as a notebook starts one), ``%load_ext kdist_magics``,
     then the cell: cell submit -> the cell's end (engines start, TensorFlow imports,
     Horovod initialises, the cell trains)
  W  the same kernel set-up, then ``%kdist start --strategy horovod --np 2`` and a pause of
     ``--think`` seconds (the user writing the first cell), then the cell: submit -> end
  H  ``horovodrun -np 2 --gloo`` on the same training as a script: launch -> exit

P6 = median C / median H (goal <= 0.8); W / H shows what ``%kdist start`` leaves of it.
The page cache is warm for all three (a warm-up of each first). Kernels are shut down and
their processes ended by pid after each run.

``python benchmarks/cold_start.py [--repeats 3] [--steps 60] [--think 15] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402  (isolates IPython/Jupyter dirs on import)
from harness import fmt, log, median  # noqa: E402


def kernel_run(out: Path, tag: str, steps: int, think: float | None) -> float:
    """A fresh kernel's first cell, seconds from submit to its end (after %kdist start and
    ``think`` seconds when ``think`` is not None)."""
    kernel = harness.Kernel()
    try:
        kernel.run("%load_ext kdist_magics")
        if think is not None:
            kernel.run("%kdist start --strategy horovod --np 2")
            time.sleep(think)
        cell = kernel.run(harness.kdist_cell(steps, out, tag, "--no-dashboard"))
        return cell["done"] - cell["submitted"]
    finally:
        left = kernel.close()
        if left:
            log(f"cold_start: ended processes the kernel left: {left}")


def horovodrun_run(out: Path, tag: str, steps: int) -> float:
    from kdist_magics.rank.lifecycle import thread_env, threads_per_rank

    started = time.time()  # the thread variables kdist's 2 engines get on this machine
    harness.horovodrun(steps, out, tag, thread_env(threads_per_rank(2), 2))
    return time.time() - started


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument(
        "--think", type=float, default=15.0, help="seconds between %%kdist start and the first cell (W)"
    )
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    out = harness.HOME / "runs"
    out.mkdir()
    t0 = time.time()
    kernel_run(out, "warm-C", 10, None)  # page cache, not measured
    horovodrun_run(out, "warm-H", 10)
    times: dict[str, list[float]] = {"C": [], "W": [], "H": []}
    for i, v in harness.in_turn("CWH", args.repeats):
        tag = f"{v}{i}"
        if v == "H":
            times[v].append(horovodrun_run(out, tag, args.steps))
        else:
            times[v].append(kernel_run(out, tag, args.steps, args.think if v == "W" else None))
            log(f"cold_start: repeat {i + 1} {v}: {times[v][-1]:.2f} s")
    med = {v: median(t) for v, t in times.items()}
    result = {
        "machine": harness.machine(),
        "repeats": args.repeats,
        "steps": args.steps,
        "think": args.think,
        "times": times,
        "median": med,
        "P6": med["C"] / med["H"],
        "with_start": med["W"] / med["H"],
        "seconds": round(time.time() - t0, 1),
    }
    print(f"cold_start: {args.repeats} rotating repeats, {args.steps} training steps")
    for v, what in (
        ("C", "fresh kernel, first %%kdist cell: submit -> end"),
        ("W", f"the same after %kdist start and {args.think:g} s"),
        ("H", "horovodrun -np 2 --gloo, the whole job"),
    ):
        print(f"{v}  {what:<52} {fmt(med[v])} s ({', '.join(fmt(t) for t in times[v])})")
    print(f"P6 C / H = {result['P6']:.3f}; with %kdist start W / H = {result['with_start']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
