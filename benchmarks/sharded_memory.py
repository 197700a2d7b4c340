"""P8: memory per process of ``--strategy sharded`` against data parallelism, same model.

One kernel (jupyter_client, isolated dirs) under ``KERAS_BACKEND=jax`` runs the same cell,
alternating, as

  A  ``%%kdist --strategy sharded --np 2 --mesh 1,2``: two JAX processes, every large weight
     split over the model axis (kdist's automatic layout), so each process holds half of it
  B  ``%%kdist --strategy multiworker --np 2`` under JAX: ``keras.distribution.DataParallel``
     over the same two processes, each holding the whole model

on fresh engines each time (``%kdist stop`` between runs: a process's peak memory is its own).
The model: 1024 inputs, three dense layers of 4608 units, 10 outputs: 47.2 M parameters,
189 MB of weights, 566 MB with Adam's two moments (the issue asks for at least 0.5 GB).
Every process reports its memory growth during the cell (its peak RSS, ``ru_maxrss``, less its
RSS when the cell began: the model, its gradients, Adam's state and XLA's buffers) and its
steps/s after the first steps. P8 = A's growth / B's growth (median of the processes' and of
the repeats; goal <= 0.6, the ideal is 0.5). Steps/s of both are printed beside it.

``python benchmarks/sharded_memory.py [--repeats 3] [--steps 20] [--units 4608] [--json FILE]``
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

LINES = {"A": "--strategy sharded --np 2 --mesh 1,2", "B": "--strategy multiworker --np 2"}
DESCRIBE = {
    "A": "%%kdist --strategy sharded --np 2 --mesh 1,2 (JAX)",
    "B": "%%kdist --strategy multiworker --np 2 (JAX, DataParallel)",
}
WARMUP = 3  # steps left out of the rate (compilation)

CELL = """
import json, resource, time
import jax, keras, numpy as np, psutil

_base = psutil.Process().memory_info().rss
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((1024,))]
                         + [keras.layers.Dense({units}, activation="relu", name=f"h{{i}}") for i in range(3)]
                         + [keras.layers.Dense(10, name="out")])
model.compile(optimizer=keras.optimizers.Adam(1e-4),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
_rng = np.random.default_rng(1)
_x = _rng.normal(size=({steps} * 64, 1024)).astype("float32")
_y = _rng.integers(0, 10, {steps} * 64)

class _Steps(keras.callbacks.Callback):
    ends = []
    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.time())

model.fit(_x, _y, batch_size=32, epochs=1, verbose=0, callbacks=[_Steps()])
_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
_ends = _Steps.ends[{warmup}:]
with open({out!r} + f"/{tag}-rank{{jax.process_index()}}.json", "w") as _f:
    json.dump({{"growth": _peak - _base, "base": _base, "params": model.count_params(),
               "steps": len(_Steps.ends),
               "rate": (len(_ends) - 1) / (_ends[-1] - _ends[0]) if len(_ends) > 1 else None}}, _f)
"""


def one_run(kernel: harness.Kernel, variant: str, tag: str, out: Path, args) -> dict:
    cell = CELL.format(units=args.units, steps=args.steps, warmup=WARMUP, out=str(out), tag=tag)
    kernel.run(f"%%kdist {LINES[variant]} --no-dashboard\n{cell}", timeout=900)
    kernel.run("%kdist stop", timeout=120)  # fresh processes for the next run: peaks are per process
    ranks = [json.loads((out / f"{tag}-rank{r}.json").read_text()) for r in range(2)]
    return {
        "growth": median([r["growth"] for r in ranks]),
        "rate": median([r["rate"] for r in ranks]),
        "params": ranks[0]["params"],
        "ranks": ranks,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (batch 32)")
    parser.add_argument("--units", type=int, default=4608, help="width of the three hidden layers")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    os.environ["KERAS_BACKEND"] = "jax"  # the kernel inherits it; multiworker follows it
    out = harness.HOME / "runs"
    out.mkdir()
    log(
        f"sharded_memory: {args.repeats} repeats x 2 runs of {args.steps} steps, "
        f"hidden width {args.units}; files in {out}"
    )
    t0 = time.time()
    kernel = harness.Kernel()
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    try:
        kernel.run("%load_ext kdist_magics")
        for i, v in harness.in_turn("AB", args.repeats):
            run = one_run(kernel, v, f"{v}{i}", out, args)
            runs[v].append(run)
            log(
                f"sharded_memory: repeat {i + 1} {v}: growth {run['growth'] / 2**20:.0f} MiB "
                f"per process, {fmt(run['rate'])} steps/s"
            )
    finally:
        left = kernel.close()
        if left:
            log(f"sharded_memory: killed processes the kernel left behind: {left}")
    growth = {v: median([r["growth"] for r in runs[v]]) for v in runs}
    rate = {v: median([r["rate"] for r in runs[v]]) for v in runs}
    params = runs["A"][0]["params"]
    results = {
        "machine": harness.machine(),
        "repeats": args.repeats,
        "steps": args.steps,
        "units": args.units,
        "params": params,
        "weights_mb": params * 4 / 1e6,
        "weights_and_adam_mb": params * 12 / 1e6,
        "seconds": round(time.time() - t0, 1),
        "growth": {v: [r["growth"] for r in runs[v]] for v in runs},
        "median_growth": growth,
        "rates": {v: [r["rate"] for r in runs[v]] for v in runs},
        "median_rate": rate,
        "goals": {"P8": {"value": growth["A"] / growth["B"], "goal": "<= 0.6"}},
    }
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


def table(res: dict) -> str:
    mib = 2**20
    lines = [
        f"sharded_memory: {res['repeats']} alternating repeats, {res['steps']} steps of batch 32; "
        f"{res['params'] / 1e6:.1f} M parameters ({res['weights_mb']:.0f} MB of weights, "
        f"{res['weights_and_adam_mb']:.0f} MB with Adam's moments)",
        f"{'run':<4} {'what':<56} {'growth MiB/process (median; each)':<36} steps/s (median; each)",
    ]
    for v in ("A", "B"):
        each = ", ".join(f"{g / mib:.0f}" for g in res["growth"][v])
        rates = ", ".join(fmt(r) for r in res["rates"][v])
        growth = f"{res['median_growth'][v] / mib:.0f} ({each})"
        lines.append(f"{v:<4} {DESCRIBE[v]:<56} {growth:<36} {fmt(res['median_rate'][v])} ({rates})")
    lines.append(f"P8 {res['goals']['P8']['value']:.3f} (goal <= 0.6): A's memory growth per process / B's")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
