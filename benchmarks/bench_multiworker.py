"""P7's multiworker half: ``%%kdist --strategy multiworker --np 2`` against TensorFlow's own launch.

One kernel (jupyter_client, isolated dirs) with kdist loaded keeps two engines warm; the same
training body (``workload.train_multiworker``: Horovod's MNIST CNN by default, under
MultiWorkerMirroredStrategy) runs, alternating, as

  K  a ``%%kdist --strategy multiworker --np 2`` cell (kdist's defaults: threads, dashboard,
     telemetry; the strategy built once and reused by later cells)
  Q  the same cell with ``--no-dashboard --no-telemetry`` (nothing watched): K / Q is what
     watching costs, Q / M what the engine path costs (where P7's gap is)
  M  two workers started by hand with ``TF_CONFIG`` on loopback ports (``mwms_train.py``), with
     the thread variables kdist set on its engines (read back from them)

and reports K / M steady-state steps/s (rank 0's step ends after the warm-up steps) and steps
per CPU-second of every process involved. Every rank writes the sum of its final weights: the
ranks of one run must agree (one model), else the figure is void.

``python benchmarks/bench_multiworker.py [--repeats 3] [--steps 120] [--warmup 20] [--model cnn|mlp] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402  (isolates IPython/Jupyter dirs on import)
from harness import fmt, log, median  # noqa: E402

DESCRIBE = {
    "K": "%%kdist --strategy multiworker --np 2 (defaults)",
    "Q": "the same, --no-dashboard --no-telemetry (nothing watched)",
    "M": "2 workers by hand, TF_CONFIG, kdist's thread variables",
}
QUIET = "--no-dashboard --no-telemetry"


def synced(run: dict) -> bool:
    """Whether every rank ended with the same weights (rounding aside)."""
    sums = [r["weights_sum"] for r in run["ranks"]]
    return max(sums) - min(sums) <= 1e-5 * max(1.0, abs(sums[0]))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120, help="training steps per measurement")
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the rate")
    parser.add_argument("--model", choices=("mlp", "cnn"), default="cnn")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    os.environ["KDIST_BENCH_MODEL"] = harness.workload.MODEL = args.model  # engines and workers inherit it
    out = harness.HOME / "runs"
    out.mkdir()
    log(f"bench_multiworker: {args.repeats} repeats x 2 runs of {args.steps} steps ({args.model}); files in {out}")
    t0 = time.time()
    kernel = harness.Kernel()
    runs: dict[str, list[dict]] = {"K": [], "Q": [], "M": []}
    exposed: dict[str, set[str]] = {"K": set(), "Q": set(), "M": set()}
    try:
        kernel.run(harness.KERNEL_SETUP)
        warm = harness.kdist_run(kernel, 30, out, "warm-K", strategy="multiworker")
        threads = {k: v for k, v in warm["ranks"][0]["threads"].items() if v is not None}
        harness.tf_workers(30, out, "warm-M", threads)
        log(f"bench_multiworker: warm in {time.time() - t0:.0f} s; kdist's engine threads: {threads}")
        for i, v in harness.in_turn("KQM", args.repeats):
            tag = f"{v}{i}"
            if v in "KQ":
                run = harness.kdist_run(
                    kernel, args.steps, out, tag, options=QUIET if v == "Q" else "", strategy="multiworker"
                )
            else:
                run = harness.tf_workers(args.steps, out, tag, threads)
            run["rate"] = harness.rate(run, args.warmup)
            run["cpu"] = harness.cpu_rate(run, args.warmup)
            run["synced"] = synced(run)
            exposed[v] |= set(run["exposed"])
            runs[v].append(run)
            log(
                f"bench_multiworker: repeat {i + 1} {v}: {run['rate']:.2f} steps/s, "
                f"{run['cpu']['steps_per_cpu_s']:.2f} steps/CPU-s, one model: {run['synced']}"
            )
    finally:
        left = kernel.close()
        if left:
            log(f"bench_multiworker: killed processes the kernel left behind: {left}")

    rates = {v: median([r["rate"] for r in runs[v]]) for v in runs}
    cpu = {v: median([r["cpu"]["steps_per_cpu_s"] for r in runs[v]]) for v in runs}
    results = {
        "machine": harness.machine(),
        "model": args.model,
        "repeats": args.repeats,
        "steps": args.steps,
        "warmup": args.warmup,
        "seconds": round(time.time() - t0, 1),
        "threads": threads,
        "rates": {v: [r["rate"] for r in runs[v]] for v in runs},
        "median_rate": rates,
        "cpu_rates": {v: [r["cpu"]["steps_per_cpu_s"] for r in runs[v]] for v in runs},
        "median_cpu_rate": cpu,
        "median_rank_cpu_ms_per_step": {
            v: 1000 * median([r["cpu"]["rank_cpu_per_step"] for r in runs[v]]) for v in runs
        },
        "median_side_cpu_ms_per_step": {
            v: 1000 * median([r["cpu"]["side_cpu_per_step"] for r in runs[v]]) for v in runs
        },
        "synced": {v: all(r["synced"] for r in runs[v]) for v in runs},
        "exposed": {v: sorted(e) for v, e in exposed.items()},
        "goals": {
            "P7 multiworker": {"value": rates["K"] / rates["M"], "goal": ">= 0.99"},
            "P7 multiworker per CPU-s": {"value": cpu["K"] / cpu["M"], "goal": ">= 0.99"},
        },
    }
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


def table(res: dict) -> str:
    lines = [
        f"bench_multiworker: {res['repeats']} alternating repeats, {res['steps']} steps each "
        f"(first {res['warmup']} left out), "
        + (
            f"Horovod's MNIST CNN, batch {harness.workload.CNN_BATCH}/worker"
            if res["model"] == "cnn"
            else f"3-layer MLP, batch {harness.workload.BATCH}/worker"
        ),
        f"{'run':<4} {'what':<56} {'steps/s (median; each)':<28} {'steps/CPU-s (median; each)':<28} "
        f"{'CPU ms/step ranks+beside':<25} one model",
    ]
    for v in res["rates"]:
        each = ", ".join(fmt(r) for r in res["rates"][v])
        cpus = ", ".join(fmt(r) for r in res["cpu_rates"][v])
        split = f"{fmt(res['median_rank_cpu_ms_per_step'][v])} + {fmt(res['median_side_cpu_ms_per_step'][v])}"
        lines.append(
            f"{v:<4} {DESCRIBE[v]:<56} {(fmt(res['median_rate'][v]) + ' (' + each + ')'):<28} "
            f"{(fmt(res['median_cpu_rate'][v]) + ' (' + cpus + ')'):<28} {split:<25} "
            f"{'yes' if res['synced'][v] else 'NO: the ranks ended with different weights'}"
        )
    lines.append(f"threads: {res['threads']}")
    g = res["goals"]
    lines.append(
        f"K / M: {g['P7 multiworker']['value']:.3f} steps/s, "
        f"{g['P7 multiworker per CPU-s']['value']:.3f} per CPU-second"
    )
    rates = res["median_rate"]
    if rates.get("Q"):
        lines.append(
            f"where the gap is: K / Q (the cost of watching) {rates['K'] / rates['Q']:.3f}, "
            f"Q / M (the engine path, nothing watched) {rates['Q'] / rates['M']:.3f}"
        )
    for v, e in res["exposed"].items():
        lines.append(f"listening beyond loopback, {v}: " + (", ".join(e) or "nothing"))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
