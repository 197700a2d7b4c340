"""The GPU check: kdist on a machine with an NVIDIA GPU and JAX with CUDA (no TensorFlow needed).

Not run by ``make test`` or ``make bench`` (no GPU on the CI machines); run it by hand, or on a
lent GPU machine, whenever one is at hand, and put what it prints in ``benchmarks/README.md``:

    python benchmarks/gpu_check.py            # about 3-5 minutes on one GPU

Each check runs in a fresh Python with its own IPython shell (Keras reads ``KERAS_BACKEND``
once) and prints ``PASS``/``FAIL`` with what it saw:

1. **telemetry** -- ``%%kdist --strategy mirrored`` under ``KERAS_BACKEND=jax`` trains on the
   GPU (``keras.distribution.DataParallel``, every GPU); ``last_run().samples`` holds NVML
   rows of the real GPU (``accelerator == "gpu"``, name, memory used).
2. **jax multiworker** -- ``%%kdist --strategy multiworker --np 2`` with the two JAX processes
   sharing GPU 0 (``KDist.rank_gpus = 'shared'``: ``XLA_PYTHON_CLIENT_MEM_FRACTION`` set):
   both on the GPU, identical weights, a falling loss.
3. **torch multiworker** (when PyTorch is installed) -- the same with Keras on torch: two
   ranks on one GPU (Gloo carries the collectives, as NCCL refuses two ranks on one GPU),
   identical weights.
4. **one GPU per rank** -- with ``KDist.rank_gpus = 'own'`` (the default) two ranks on one GPU
   are refused before the cell runs; with two or more GPUs each rank sees its own.
5. **sharded** -- ``%%kdist --strategy sharded --np 2 --mesh 1,2`` with the two JAX processes
   sharing GPU 0: both on the GPU, each holding half of the large kernels (the layout), the same
   falling loss on both, and each process's device memory (JAX's ``memory_stats``) printed.

6. **scale** -- ``%%kdist scale --strategy multiworker --np 2`` (Keras on torch, whose steps
   are timed live) with the two processes sharing GPU 0: the probe's table measured at 1 and
   2 ranks on the GPU, the link measured by the group's own all-reduce (``torch.distributed``:
   Gloo while the ranks share GPU 0, NCCL where each has its own), a verdict drawn; the table
   printed as it is.

Needs kdist_magics importable with its dependencies (ipyparallel, IPython, ipywidgets,
anywidget, psutil), JAX with CUDA and ``nvidia-ml-py``. Exits 0 when every check passed, 1
otherwise, 2 when there is no GPU (and says so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kernel_driver import FRESH_SHELL_PRELUDE  # noqa: E402  (the tests' fresh shell: ip, out, attempt)

PRELUDE = FRESH_SHELL_PRELUDE  # ip, out, attempt(line, cell), by_rank(name)

MODEL = """
import numpy as np, keras
rng = np.random.default_rng(0)
x = rng.normal(size=(4096, 32)).astype("float32")
y = (x[:, :8].sum(axis=1, keepdims=True) > 0).astype("float32")
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.BinaryCrossentropy(from_logits=True))
history = model.fit(x, y, batch_size=128, epochs=4, verbose=0)
kd_loss = history.history["loss"]
kd_weights = [w.tolist() for w in model.get_weights()[:2]]
"""

TELEMETRY = f"""
value, err = attempt("--strategy mirrored --no-dashboard", {MODEL!r} + "\\nimport jax\\nkd_platform = jax.devices()[0].platform")
out["err"] = repr(err) if err is not None else None
out["platform"] = ip.user_ns.get("kd_platform")
out["loss"] = ip.user_ns.get("kd_loss")
rows = [r for r in kdist_magics.last_run().samples if r.get("accelerator") == "gpu"]
out["gpu_rows"] = len(rows)
out["gpu"] = rows[-1]["gpus"][0] if rows else None
out["notes"] = sorted({{str(r.get("accelerator_note")) for r in kdist_magics.last_run().samples}})
"""

MULTIWORKER = f"""
ip.run_line_magic("config", "KDist.rank_gpus = 'shared'")
CELL = {MODEL!r} + '''
import os
kd_env = (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"))
kd_where = str(getattr(strategy, "device", "")) or __import__("jax").devices()[0].platform
'''
value, err = attempt("--strategy multiworker --np 2 --no-dashboard", CELL)
out["err"] = repr(err) if err is not None else None
if err is None:
    for name in ("kd_loss", "kd_weights", "kd_env", "kd_where"):
        out[name] = by_rank(name)
    gpu_rows = [r for r in kdist_magics.last_run().samples if r.get("accelerator") == "gpu"]
    out["gpu_rows_per_rank"] = sorted({{r.get("rank") for r in gpu_rows}} - {{None}})
ip.run_line_magic("config", "KDist.rank_gpus = 'own'")
ip.run_line_magic("kdist", "stop")
value, err = attempt("--strategy multiworker --np {{n}} --no-dashboard", "kd_seen = __import__('os').environ.get('CUDA_VISIBLE_DEVICES')")
out["own_err"] = str(err) if err is not None else None
out["own"] = by_rank("kd_seen") if err is None else None
ip.run_line_magic("kdist", "stop")
"""


#: get_weights() reads every weight whole, which JAX refuses for one spread over processes
SHARDED_MODEL = MODEL.replace("kd_weights = [w.tolist() for w in model.get_weights()[:2]]\n", "")
assert SHARDED_MODEL != MODEL

SHARDED = f"""
ip.run_line_magic("config", "KDist.rank_gpus = 'shared'")
CELL = {SHARDED_MODEL!r} + '''
import jax
kd_local = {{v.path: list(v.value.addressable_data(0).shape) for v in model.weights}}
kd_where = jax.local_devices()[0].platform
kd_mem = (jax.local_devices()[0].memory_stats() or {{}}).get("peak_bytes_in_use")
'''
value, err = attempt("--strategy sharded --np 2 --mesh 1,2 --no-dashboard", CELL)
out["err"] = repr(err) if err is not None else None
if err is None:
    eng = kdist_magics._extension._strategies["sharded"].engines
    ranks = eng.ranks(eng.cluster, None)
    for name in ("kd_loss", "kd_local", "kd_where", "kd_mem"):
        out[name] = [v for _, v in sorted(zip(ranks, eng.cluster.view().pull(name, block=True)))]
ip.run_line_magic("kdist", "stop")
"""


SCALE = f"""
ip.run_line_magic("config", "KDist.rank_gpus = 'shared'")
CELL = {MODEL!r} + "\\nkd_where = next(iter(model.parameters())).device.type"
table, err = attempt("scale --strategy multiworker --np 2 --no-dashboard", CELL)
out["err"] = repr(err) if err is not None else None
if err is None:
    out["rows"] = [[r.n, r.measured, round(r.speedup, 2), r.communication_share] for r in table.rows]
    out["bandwidth"], out["advice"], out["text"] = table.link.bandwidth, table.advice, repr(table)
    out["via"] = table.link.via
    out["kd_where"] = by_rank("kd_where")
ip.run_line_magic("kdist", "stop")
"""


def run(body: str, env: dict[str, str], timeout: float) -> dict:
    code = PRELUDE + textwrap.dedent(body) + "\nprint('RESULT ' + json.dumps(out))\n"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"err": f"exit {proc.returncode}: {proc.stderr[-1500:]}", "seconds": time.monotonic() - t0}
    result = json.loads(lines[-1][len("RESULT ") :])
    result["seconds"] = time.monotonic() - t0
    return result


def gpu_count() -> tuple[int, str]:
    if shutil.which("nvidia-smi") is None:
        return 0, "no nvidia-smi on this machine"
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    count = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    return count, "" if count else "nvidia-smi lists no GPU"


def report(name: str, ok: bool, detail: str, seconds: float) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name} ({seconds:.0f} s): {detail}", flush=True)
    return ok


def identical(weights) -> bool:
    import numpy as np

    a, b = weights
    return all(np.allclose(np.array(x), np.array(y), rtol=1e-5, atol=1e-6) for x, y in zip(a, b))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=240, help="seconds per check")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: run every check on the CPU with one pretend GPU (CUDA_VISIBLE_DEVICES=0) "
        "to check this script itself; the GPU conditions then FAIL",
    )
    args = parser.parse_args(argv)
    count, why = gpu_count()
    if args.dry_run:
        count = 1
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"  # the engines inherit it: one GPU for the placement
        print("gpu_check: dry run on the CPU, one pretend GPU", flush=True)
    elif not count:
        print(f"gpu_check: {why}; nothing to check")
        return 2
    else:
        print(
            f"gpu_check: {count} GPU(s): "
            + subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True
            )
            .stdout.strip()
            .replace("\n", "; "),
            flush=True,
        )
    results = []

    r = run(TELEMETRY, {"KERAS_BACKEND": "jax"}, args.timeout)
    gpu = r.get("gpu") or {}
    ok = (
        r.get("err") is None
        and r.get("platform") == "gpu"
        and r.get("gpu_rows", 0) > 0
        and gpu.get("mem_used_bytes", 0) > 0
        and r["loss"][-1] < r["loss"][0]
    )
    results.append(
        report(
            "telemetry + mirrored on JAX",
            ok,
            f"platform {r.get('platform')}, {r.get('gpu_rows')} NVML rows, last {gpu}, "
            f"loss {r.get('loss')}, notes {r.get('notes')}"
            if r.get("err") is None
            else r["err"],
            r["seconds"],
        )
    )

    own_n = 2
    for backend in ("jax", "torch"):
        if backend == "torch" and subprocess.run([sys.executable, "-c", "import torch"]).returncode:
            print("SKIP torch multiworker: PyTorch is not installed here", flush=True)
            continue
        r = run(MULTIWORKER.replace("{n}", str(own_n)), {"KERAS_BACKEND": backend}, args.timeout)
        if r.get("err"):
            results.append(report(f"{backend} multiworker, 2 ranks sharing GPU 0", False, r["err"], r["seconds"]))
            continue
        env0 = r["kd_env"][0]
        ok = (
            identical(r["kd_weights"])
            and r["kd_loss"][0][-1] < r["kd_loss"][0][0]
            and r["kd_env"][0] == r["kd_env"][1]
            and env0[1] == "0.45"
            and all("cuda" in w or w == "gpu" for w in r["kd_where"])
        )
        results.append(
            report(
                f"{backend} multiworker, 2 ranks sharing GPU 0",
                ok,
                f"env {r['kd_env']}, on {r['kd_where']}, identical weights "
                f"{identical(r['kd_weights'])}, losses {[l[-1] for l in r['kd_loss']]}, "
                f"NVML rows from ranks {r.get('gpu_rows_per_rank')}",
                r["seconds"],
            )
        )
        if count == 1:
            ok = r["own_err"] is not None and "which has 1 GPU" in r["own_err"]
            detail = r["own_err"] or f"ran: {r['own']}"
        else:
            ok = r["own_err"] is None and sorted(r["own"]) == ["0", "1"]
            detail = f"each rank saw {r['own']}" if r["own_err"] is None else r["own_err"]
        results.append(report(f"{backend}: one GPU per rank (rank_gpus='own')", ok, detail, 0))
    r = run(SHARDED, {"KERAS_BACKEND": "jax"}, args.timeout)
    if r.get("err"):
        results.append(report("sharded, 2 JAX processes sharing GPU 0, mesh 1x2", False, r["err"], r["seconds"]))
    else:
        halves = [local.get("sequential/dense_1/kernel") for local in r["kd_local"]]
        losses = r["kd_loss"]
        ok = (
            all(w == "gpu" for w in r["kd_where"])
            and halves == [[256, 128], [256, 128]]
            and losses[0] == losses[1]
            and losses[0][-1] < losses[0][0]
        )
        mem = ", ".join(f"{m / 2**20:.0f} MiB" if m else "not reported" for m in r["kd_mem"])
        results.append(
            report(
                "sharded, 2 JAX processes sharing GPU 0, mesh 1x2",
                ok,
                f"on {r['kd_where']}, 256x256 kernel per process {halves}, same losses "
                f"{losses[0] == losses[1]} ({losses[0][-1]:.4f}), device memory peak per "
                f"process: {mem}",
                r["seconds"],
            )
        )
    if subprocess.run([sys.executable, "-c", "import torch"]).returncode:
        print("SKIP scale: PyTorch is not installed here", flush=True)
    else:
        r = run(SCALE, {"KERAS_BACKEND": "torch"}, args.timeout)
        if r.get("err"):
            results.append(report("scale, 2 torch ranks sharing GPU 0", False, r["err"], r["seconds"]))
        else:
            print(r["text"], flush=True)
            ok = (
                [row[:2] for row in r["rows"][:2]] == [[1, True], [2, True]]
                and r["bandwidth"] > 0
                and r["via"].startswith("torch.distributed")
                and bool(r["advice"])
                and all(w == "cuda" for w in r["kd_where"])
            )
            results.append(
                report(
                    "scale, 2 torch ranks sharing GPU 0",
                    ok,
                    f"on {r['kd_where']}, measured N {[row[0] for row in r['rows'] if row[1]]}, "
                    f"speed-ups {[row[2] for row in r['rows']]}, link "
                    f"{r['bandwidth'] / 2**20:,.0f} MiB/s by {r['via']}, advice {r['advice'][:1]}",
                    r["seconds"],
                )
            )
    print(f"gpu_check: {sum(results)}/{len(results)} passed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
