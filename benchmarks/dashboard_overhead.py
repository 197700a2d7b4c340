"""P3: what telemetry + the live dashboard cost in training throughput.

A real IPython kernel (``jupyter_client``, isolated dirs, via ``harness.Kernel``)
builds one small MLP once, then runs the same ``model.fit`` as ``%%kdist`` cells,
alternating in ABBA order (so slow drift of a shared machine cancels):

  A  ``%%kdist --strategy S --no-telemetry``  (no callback, no sampler, no dashboard)
  B  ``%%kdist --strategy S``                  (callback on fit, 1 s sampler, live dashboard
                                                 sending comm messages over IOPub; each
                                                 update computes the live step split,
                                                 ``watch/split.py``, so its cost is in B)

Throughput is samples/s of the ``fit`` call, timed inside the cell. Printed: P3, the
median of the pairs' B/A ratios (the paired statistic: on a VM whose whole runs
sometimes fall ~30 % slow, in A and B alike, a ratio of the two medians swings with
how many slow runs each side drew), each pair's ratio so the noise is visible, the
ratio of the medians;
also samples per CPU-second of the kernel process (every thread: TensorFlow's,
the sampler's, the dashboard's), which other load on a shared machine disturbs
far less than wall time; the CPU that the dashboard's and the sampler's own threads
(and the IOPub thread, beyond its use in A) spent during B's fits, as a share of the
process's CPU, read from per-thread CPU clocks (a direct measure, steady from run to
run); and each piece of the overhead timed in isolation::

    P3 <ratio> (goal >= 0.99)

No front end is attached, so the kernel still serialises and sends every
widget update (the cost that matters to training); rendering happens in the
browser, off the kernel.

``python benchmarks/dashboard_overhead.py [--pairs 8] [--steps 1500] [--strategy default]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402  (isolates IPython/Jupyter dirs on import)
from harness import log, median  # noqa: E402

SETUP = """
%load_ext kdist_magics
import time, numpy as np, keras, kdist_magics
_rng = np.random.default_rng(0)
x = _rng.normal(size=({n}, 64)).astype("float32")
y = _rng.integers(0, 10, size=({n},))
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
model.fit(x[:{batch} * 4], y[:{batch} * 4], batch_size={batch}, epochs=1, verbose=0)  # compile
rates = []
"""

CELL = """%%kdist --strategy {strategy} {options}
_k0 = _kb_thread_cpu()
_t0, _c0 = time.perf_counter(), time.process_time()
model.fit(x, y, batch_size={batch}, epochs={epochs}, verbose=0)
_c1, _k1 = time.process_time(), _kb_thread_cpu()
rates.append(({tag!r}, {n} * {epochs} / (time.perf_counter() - _t0),
              {n} * {epochs} / (_c1 - _c0), _c1 - _c0,
              {{k: _k1[k] - _k0[k] for k in _k1 if k in _k0}}))
"""

# CPU of the threads that exist only for telemetry and the dashboard, and of the kernel's
# IOPub thread (which sends the dashboard's comm messages), read from each thread's own
# CPU clock (nanoseconds, unlike /proc's 10 ms ticks) at the start and end of ``fit``
THREAD_CPU = """
import threading as _kb_threading

def _kb_thread_cpu():
    out = {}
    for t in _kb_threading.enumerate():
        if t.name == "IOPub" or t.name.startswith(("kdist-dashboard", "kdist-sampler")):
            try:
                out[t.name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, AttributeError):
                pass
    return out
"""


def costs(steps_per_s: float) -> dict:
    """The pieces of the overhead, each timed in isolation (much less noisy than A/B on a
    shared machine): the callback per step (mostly the throttled path), one dashboard update
    with long curves for 2 ranks, one utilisation sample."""
    import time

    from kdist_magics.watch import sampling
    from kdist_magics.watch.dashboard import Dashboard
    from kdist_magics.watch.record import RunRecord

    from telemetry_costs import callback

    rec = RunRecord("horovod", size=2)
    cb = callback(rec)
    logs = {"loss": 0.5, "accuracy": 0.9}
    n = 20000
    t0 = time.perf_counter()
    for b in range(n):
        cb.on_train_batch_end(b, logs)
    per_step = (time.perf_counter() - t0) / n
    dash = Dashboard(rec, interval=None)
    for r in (0, 1):
        for step in range(1, 1601):
            rec.add(
                "metric",
                {
                    "rank": r,
                    "epoch": 0,
                    "step": step,
                    "time": step,
                    "kind": "step",
                    "loss": 1 / step,
                    "accuracy": 0.5,
                    "mae": 0.1,
                    "lr": 0.01,
                },
            )
    t0 = time.perf_counter()
    for _ in range(20):
        rec.add(
            "metric",
            {
                "rank": 0,
                "epoch": 0,
                "step": 1601,
                "time": 1,
                "kind": "step",
                "loss": 0.1,
                "accuracy": 0.5,
                "mae": 0.1,
                "lr": 0.01,
            },
        )
        dash.flush()  # snapshot + ipywidgets' serialisation of the state and the curves
    flush = (time.perf_counter() - t0) / 20
    sampler = sampling.Sampler(lambda k, r: None)
    t0 = time.perf_counter()
    for _ in range(50):
        sampler.sample()
    sample = (time.perf_counter() - t0) / 50
    step = 1 / steps_per_s
    flushes_per_s = 2
    overhead = per_step / step + flush * flushes_per_s + sample * 1
    return {
        "callback_us_per_step": per_step * 1e6,
        "step_us": step * 1e6,
        "flush_ms": flush * 1e3,
        "flushes_per_s": flushes_per_s,
        "sample_ms": sample * 1e3,
        "ratio": 1 / (1 + overhead),
    }


def pairs_needed(pairs: list[float]) -> dict:
    """The pairs' spread (standard deviation of the B/A ratios) and how many pairs a median
    within +-0.01 (two standard errors; the median's is ~1.25 sd / sqrt(n)) would take."""
    import math
    import statistics

    sd = statistics.stdev(pairs) if len(pairs) > 1 else float("nan")
    need = math.ceil((2 * 1.2533 * sd / 0.01) ** 2) if sd == sd else None
    return {"spread": sd, "pairs": need}


def direct_share(rates: list) -> dict:
    """Share of the kernel process's CPU during B's fits used by kdist's own threads
    (dashboard updater, sampler) and by the IOPub thread beyond what it used in A."""

    def total(tag, prefix):
        return sum(v for t, *_, threads in rates if t == tag for k, v in threads.items() if k.startswith(prefix))

    cpu_b = sum(c for t, _, _, c, _ in rates if t == "B")
    runs_a = sum(1 for t, *_ in rates if t == "A") or 1
    runs_b = sum(1 for t, *_ in rates if t == "B") or 1
    dash, sampler = total("B", "kdist-dashboard"), total("B", "kdist-sampler")
    iopub_extra = max(0.0, total("B", "IOPub") - total("A", "IOPub") * runs_b / runs_a)
    share = (dash + sampler + iopub_extra) / cpu_b if cpu_b else float("nan")
    return {
        "dashboard": dash / cpu_b,
        "sampler": sampler / cpu_b,
        "iopub_extra": iopub_extra / cpu_b,
        "share": share,
        "ratio": 1 - share,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="A/B pairs (ABBA order)")
    parser.add_argument("--steps", type=int, default=1500, help="training steps per measurement")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--strategy",
        default="default",
        choices=("default", "mirrored"),
        help="in-kernel strategy to measure (training on the kernel's main thread)",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    epochs = 2
    n = args.batch * max(1, args.steps // epochs)
    kernel = harness.Kernel()
    try:
        kernel.run(SETUP.format(n=n, batch=args.batch) + THREAD_CPU, timeout=600)
        for tag in ("A", "B"):  # warm-up, not counted: first kdist cell, first dashboard import
            kernel.run(
                CELL.format(
                    strategy=args.strategy,
                    options="--no-telemetry" if tag == "A" else "",
                    batch=args.batch,
                    epochs=epochs,
                    n=n,
                    tag="warm",
                ),
                timeout=600,
            )
        order = [tag for _, tag in harness.in_turn("AB", args.pairs)]
        for i, tag in enumerate(order):
            options = "--no-telemetry" if tag == "A" else ""
            kernel.run(
                CELL.format(strategy=args.strategy, options=options, batch=args.batch, epochs=epochs, n=n, tag=tag),
                timeout=600,
            )
            log(f"bench: {i + 1}/{len(order)} {tag} done")
            if tag == "B":  # what the dashboard had to show in that run
                summary, metrics, samples = kernel.value(
                    "[kdist_magics.last_run().summary(), len(kdist_magics.last_run().metrics), "
                    "len(kdist_magics.last_run().samples)]"
                )
        rates = kernel.value("rates")
    finally:
        left = kernel.close()
        if left:
            log(f"bench: killed leftover processes {left}")
    rates = [r for r in rates if r[0] in ("A", "B")]
    est = costs(median([r for t, r, *_ in rates if t == "A"]) / args.batch)
    a = [r for t, r, *_ in rates if t == "A"]
    b = [r for t, r, *_ in rates if t == "B"]
    a_cpu = [c for t, _, c, *_ in rates if t == "A"]
    b_cpu = [c for t, _, c, *_ in rates if t == "B"]
    direct = direct_share(rates)
    pairs = [rb / ra for ra, rb in zip(a, b)]
    cpu_pairs = [rb / ra for ra, rb in zip(a_cpu, b_cpu)]
    ratio = median(pairs)
    cpu_ratio = median(cpu_pairs)
    spread = pairs_needed(pairs)
    result = {
        "P3": ratio,
        "P3_cpu": cpu_ratio,
        "ratio_of_medians": median(b) / median(a),
        "cpu_pair_ratios": cpu_pairs,
        "A_samples_per_s": a,
        "B_samples_per_s": b,
        "A_samples_per_cpu_s": a_cpu,
        "B_samples_per_cpu_s": b_cpu,
        "pair_ratios": pairs,
        "strategy": args.strategy,
        "steps": n // args.batch * epochs,
        "batch": args.batch,
        "last_run": summary,
        "last_run_metric_rows": metrics,
        "last_run_sample_rows": samples,
        "pair_spread": spread["spread"],
        "pairs_for_1pct": spread["pairs"],
        "machine": harness.machine(),
    }
    log(f"A (no telemetry, no dashboard): median {median(a):.0f} samples/s  {[round(v) for v in a]}")
    log(f"B (telemetry + live dashboard): median {median(b):.0f} samples/s  {[round(v) for v in b]}")
    log(
        f"pair ratios B/A: {[round(p, 3) for p in pairs]} (median {ratio:.3f}; median B / "
        f"median A {median(b) / median(a):.3f}); last B run: {summary}, "
        f"{metrics} metric rows, {samples} samples"
    )
    result["estimate"] = est
    result["direct"] = direct
    log(
        f"CPU of the dashboard's and telemetry's own threads during fit (B), over the kernel "
        f"process's CPU: dashboard {direct['dashboard']:.4%}, sampler {direct['sampler']:.4%}, "
        f"IOPub thread beyond A's {direct['iopub_extra']:.4%}: {direct['share']:.3%} in all "
        f"(the callback runs on Keras's own threads: see the pieces below)"
    )
    log(
        f"costs measured in isolation: callback {est['callback_us_per_step']:.1f} us/step "
        f"(step {est['step_us']:.0f} us), dashboard update {est['flush_ms']:.2f} ms x "
        f"{est['flushes_per_s']}/s, sample {est['sample_ms']:.2f} ms x 1/s "
        f"-> estimated ratio {est['ratio']:.4f}"
    )
    log(
        f"samples per CPU-second of the kernel process (all its threads; less sensitive to "
        f"other load on a shared machine): A median {median(a_cpu):.0f}, B median "
        f"{median(b_cpu):.0f}; pair ratios {[round(p, 3) for p in cpu_pairs]}, median "
        f"{cpu_ratio:.3f}"
    )
    log(
        f"the pairs' ratios spread {spread['spread']:.3f} (sd): a median within +-0.01 would take "
        f"about {spread['pairs']} pairs on this machine, {len(pairs)} were run"
    )
    print(f"P3 {ratio:.3f} (goal >= 0.99)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
