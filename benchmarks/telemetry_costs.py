"""What each source of telemetry costs, timed alone: the table behind P3.

In one process with TensorFlow and Keras loaded (as a rank or the kernel has them), each piece
that runs beside training is called many times and timed:

* the sampler's reads, once a sample (every ``SAMPLE_INTERVAL`` s): CPU percent, resident
  size, the proportional set size (a walk of every mapping, read every ``PSS_EVERY`` s), the
  TPU probe (libtpu's SDK, JAX's and TensorFlow's; each returns at once where its runtime is
  not up), NVML where a GPU is; and one whole ``Sampler.sample()``
* the per-batch callback on the training thread (``on_train_batch_begin`` and ``_end`` of
  kdist's fit callback, which also times the step for the live split), at the step rate of
  P3's MLP (measured here with the same model)
* one dashboard update with two ranks' long curves (twice a second while rows come)

Printed: a table (source, us per call, calls per second, share of one core) and the sum, which
is what watching costs a run in CPU; ``--json FILE`` writes it.

``python benchmarks/telemetry_costs.py [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402,F401  (isolates IPython/Jupyter dirs on import)


def timed(call, n: int) -> float:
    """Seconds per call of ``call``, over ``n`` calls after one untimed."""
    call()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - t0) / n


def mlp_step_s() -> float:
    """Seconds per training step of P3's MLP (batch 64) in this process, without telemetry."""
    import numpy as np
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * 400, 64)).astype("float32")
    y = rng.integers(0, 10, size=(64 * 400,))
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:256], y[:256], batch_size=64, verbose=0)
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=64, verbose=0)
    return (time.perf_counter() - t0) / 400


def callback(record):
    """kdist's fit callback for ``record``, begun on a tiny model, ready to time a batch's end
    (dashboard_overhead.py times it too)."""
    import keras

    from kdist_magics.watch import telemetry

    cb = telemetry.make_callback(record.add, rank=0, batch_size=64)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    cb.set_model(model)
    cb.set_params({"epochs": 1, "steps": 10**9})
    cb.on_train_begin()
    return cb


def rows(step_s: float) -> list[dict]:
    import psutil

    from kdist_magics.watch import sampling, tpu_probe
    from kdist_magics.watch.dashboard import Dashboard
    from kdist_magics.watch.record import RunRecord

    proc = psutil.Process(os.getpid())
    per_sample = 1 / sampling.SAMPLE_INTERVAL
    out = [
        ("CPU percent (psutil)", timed(lambda: proc.cpu_percent(None), 200), per_sample),
        ("resident size (psutil)", timed(proc.memory_info, 200), per_sample),
        ("proportional set size (smaps)", timed(proc.memory_full_info, 20), 1 / sampling.PSS_EVERY),
        ("TPU: libtpu's SDK", timed(tpu_probe.libtpu_probe, 200), per_sample),
        ("TPU: JAX memory_stats()", timed(tpu_probe._jax_tpu_probe, 200), per_sample),
        ("TPU: TensorFlow", timed(tpu_probe._tensorflow_tpu_probe, 200), per_sample),
    ]
    sampler = sampling.Sampler(lambda k, r: None)
    out.append(("one whole sample (the above, NVML where a GPU is)", timed(sampler.sample, 50), per_sample))
    cb = callback(RunRecord("default", size=1))
    logs, step = {"loss": 0.5, "accuracy": 0.9}, [0]

    def batch():
        cb.on_train_batch_begin(step[0], logs)
        cb.on_train_batch_end(step[0], logs)
        step[0] += 1

    out.append(("per-batch callback (training thread)", timed(batch, 20000), 1 / step_s))
    two = RunRecord("horovod", size=2)
    dash = Dashboard(two, interval=None)
    for r in (0, 1):
        for s in range(1, 1601):
            two.add(
                "metric",
                {
                    "rank": r,
                    "epoch": 0,
                    "step": s,
                    "time": s,
                    "kind": "step",
                    "loss": 1 / s,
                    "accuracy": 0.5,
                    "mae": 0.1,
                    "lr": 0.01,
                },
            )

    def update():
        two.add(
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
        dash.flush()

    out.append(("dashboard update (2 ranks, long curves)", timed(update, 20), 2.0))
    sampler.stop(final=False)
    return [{"source": name, "us_per_call": s * 1e6, "calls_per_s": rate, "share": s * rate} for name, s, rate in out]


def table(result: dict) -> str:
    lines = [
        f"telemetry_costs: each source timed alone (P3's MLP step here: {result['step_s'] * 1e3:.2f} ms)",
        f"{'source':<52} {'us/call':>10} {'calls/s':>9} {'share of a core':>16}",
    ]
    for r in result["rows"]:
        lines.append(f"{r['source']:<52} {r['us_per_call']:>10.1f} {r['calls_per_s']:>9.2f} {r['share']:>15.3%}")
    lines.append(
        f"{'in all (a whole sample, the PSS read, callback, dashboard)':<52} {'':>10} {'':>9} {result['total']:>15.3%}"
    )
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow  # noqa: F401  (loaded, as in a rank: its mappings make the PSS read dear)

    step_s = mlp_step_s()
    measured = rows(step_s)
    whole = [r for r in measured if r["source"].startswith(("one whole", "proportional", "per-batch", "dashboard"))]
    result = {"step_s": step_s, "rows": measured, "total": sum(r["share"] for r in whole)}
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
