"""Soak: many consecutive short ``%%kdist --np 2`` engine runs through a real kernel.

The runs mix successes, a rank raising, the Stop button (kernel interrupt) and ``--timeout``
overruns, on one warm cluster (``--strategy horovod``, the default; ``multiworker`` (TensorFlow),
``jax`` and ``torch`` (multiworker under that Keras backend) have successes and raising runs: a
worker stopped mid-collective costs them an engine restart). With
``--faults`` a fault comes every 15th run (``--fault-every``), in turn: a rank dying mid-cell, and an engine
SIGKILLed while the framework starts (held there by :mod:`kdist_magics.rank.faults`); the counts
are judged on the other runs. After every run the script samples, by pid: the number of
processes in the kernel's tree (kernel, controller, engines, nannies), the kernel's open file
descriptors (psutil ``num_fds``), the kernel's RSS and ``--push``'s shared-memory names of the
kernel still in ``/dev/shm`` (the JAX successes push 4 MiB). It prints a table and a verdict:

* processes and fds: least-squares slope over the runs after warm-up, times the number of
  those runs, must stay below 1 process / ``--fd-bound`` fds (a leak of one per run would be
  ~N); the last sample must equal the first after warm-up for processes.
* RSS: the median of the last 10 samples minus the median of the first 10 after warm-up must be
  below ``--rss-bound-mib`` MiB.
* ``/dev/shm``: no name of the kernel's left after any run.

Usage: ``python benchmarks/soak.py [--runs 50] [--warmup 5] [--strategy S] [--faults] [--json out.json]``. Exit status 0
when flat, 1 when not. Times are reported, never judged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kernel_driver import PRELUDE, Kernel, isolated_env, kernel_helpers, push_names, wait_gone  # noqa: E402

HVD = "%%kdist --strategy horovod --np 2 --no-dashboard"
MW = "%%kdist --strategy multiworker --np 2 --no-dashboard"
CELLS = {
    "horovod": {
        "ok": f"{HVD}\nimport tensorflow as tf, horovod.tensorflow as hcore\n"
        "kd_sum = float(hcore.allreduce(tf.ones(2), op=hcore.Sum)[0])\nkd_sum",
        "raise": f"{HVD}\nimport time\nif hvd.rank() == 1:\n    raise ValueError('soak: rank 1 fails')\ntime.sleep(60)",
        "interrupt": f"{HVD}\nimport time\nprint('kd-go', flush=True)\ntime.sleep(60)",
        "timeout": f"{HVD} --timeout 2\nimport time\ntime.sleep(60 if hvd.rank() == 0 else 0)",
        "die": f"{HVD}\nimport os, time\nif hvd.rank() == 1:\n    os._exit(3)\ntime.sleep(60)",
        "held": f"{HVD}\nhvd.size()",
    },
    "multiworker": {  # a rank stopped mid-collective costs a restart here: every rank raises
        "ok": f"{MW}\nimport tensorflow as tf\n"
        "kd_sum = float(strategy.reduce('SUM', strategy.run(lambda: tf.ones(())), axis=None))\nkd_sum",
        "raise": f"{MW}\nraise ValueError('soak: every worker fails')",
        "die": f"{MW}\nimport os, time\nif strategy.cluster_resolver.task_id == 1:\n    os._exit(3)\ntime.sleep(60)",
        "held": f"{MW}\nstrategy.num_replicas_in_sync",
    },
    # Keras on JAX / PyTorch across engines (multiworker with the kernel's KERAS_BACKEND set)
    "jax": {  # its successes --push 4 MiB (shared memory; sent again after each restart)
        "ok": f"{MW} --push kd_big\nimport jax.numpy as jnp\nfrom jax.experimental import multihost_utils\n"
        "kd_sum = float(multihost_utils.process_allgather(jnp.ones(())).sum())\nkd_sum",
        "raise": f"{MW}\nraise ValueError('soak: every process fails')",
        "die": f"{MW}\nimport jax, os, time\nif jax.process_index() == 1:\n    os._exit(3)\ntime.sleep(60)",
        "held": f"{MW}\nimport jax\njax.process_count()",
    },
    "torch": {
        "ok": f"{MW}\nimport torch, torch.distributed as dist\nkd_t = torch.ones(1)\ndist.all_reduce(kd_t)\n"
        "kd_sum = float(kd_t[0])\nkd_sum",
        "raise": f"{MW}\nraise ValueError('soak: every process fails')",
        "die": f"{MW}\nimport os, time, torch.distributed as dist\nif dist.get_rank() == 1:\n    os._exit(3)\n"
        "time.sleep(60)",
        "held": f"{MW}\nimport torch.distributed as dist\ndist.get_world_size()",
    },
}
#: the kernel's Keras backend per soak strategy (multiworker follows it)
BACKENDS = {"horovod": "tensorflow", "multiworker": "tensorflow", "jax": "jax", "torch": "torch"}
EXPECT = {
    "ok": None,
    "raise": "RankFailed",
    "interrupt": "Interrupted",
    "timeout": "RunTimedOut",
    "die": "RankDied",
    "held": "RankDied",
}
#: faults mixed in with --faults: a rank dying mid-cell, an engine killed while the framework
#: starts (held there by kdist's phase barrier); each costs the next run an engine restart
FAULTS = ("die", "held")


def plan(
    runs: int, kinds=("ok", "raise", "interrupt", "timeout"), faults: bool = False, fault_every: int = 15
) -> list[str]:
    """A fixed mix: mostly successes, a rank error every 4th, an interrupt every 5th, a timeout
    every 12th (each where the strategy has it); with ``faults``, a fault every ``fault_every``th
    run, the kinds of :data:`FAULTS` in turn."""
    out = []
    for i in range(1, runs + 1):
        if faults and i % fault_every == 0:
            out.append(FAULTS[(i // fault_every - 1) % len(FAULTS)])
        elif i % 12 == 0 and "timeout" in kinds:
            out.append("timeout")
        elif i % 5 == 0 and "interrupt" in kinds:
            out.append("interrupt")
        elif i % 4 == 0:
            out.append("raise")
        else:
            out.append("ok")
    return out


def sample(k: Kernel) -> dict:
    import psutil

    proc = psutil.Process(k.pid)
    return {
        "procs": len(k.tree()),
        "fds": proc.num_fds(),
        "rss_mib": proc.memory_info().rss / 2**20,
        "shm": len(push_names(k.pid)),
    }  # --push's names left: none


def slope(ys: list[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, statistics.fmean(ys)
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


def run_one(k: Kernel, kind: str, cells: dict | None = None, holds=None) -> tuple[str, float]:
    """Run one cell of ``kind``; returns (outcome, seconds). Outcome is the error name or 'ok'.
    ``held``: rank 1's engine is SIGKILLed while kdist holds the run at ``init`` (``holds``:
    ``tests/fault_matrix.Holds``)."""
    import os
    import signal
    import threading

    cells = cells or CELLS["horovod"]
    asked = {}
    if kind == "held":
        holds.arm("init")

        def harm():
            try:
                facts = holds.wait("init", 120)
                os.kill(facts["engines"][-1], signal.SIGKILL)
            finally:
                holds.release("init")

        threading.Thread(target=harm, daemon=True).start()

    def on_message(msg, res):
        if (
            kind == "interrupt"
            and "at" not in asked
            and msg["header"]["msg_type"] == "stream"
            and "kd-go" in msg["content"]["text"]
        ):
            asked["at"] = time.monotonic()
            k.interrupt()

    res = k.execute(cells[kind], timeout=300, on_message=on_message)
    outcome = res.errors[0]["ename"] if res.errors else ("ok" if res.ok else res.status)
    return outcome, res.seconds


def soak(
    runs: int = 50,
    warmup: int = 5,
    fd_bound: float = 5.0,
    rss_bound_mib: float = 64.0,
    out=sys.stdout,
    strategy: str = "horovod",
    faults: bool = False,
    fault_every: int = 15,
) -> dict:
    """The soak (module doc) for ``strategy``; with ``faults`` the fault runs are mixed in,
    and the counts are judged on the other runs (a fault run's sample lacks the engine that
    died; the next run has a full set again)."""
    from fault_matrix import Holds

    cells = CELLS[strategy]
    home = Path(tempfile.mkdtemp(prefix="kdist-soak-"))
    holds = Holds(home / "holds")
    k = Kernel(cwd=ROOT, env=isolated_env(home, KDIST_HOLD_DIR=str(holds.dir), KERAS_BACKEND=BACKENDS[strategy]))
    rows = []
    try:
        k.check("import kdist_magics")
        if strategy in PRELUDE:
            k.check(PRELUDE[strategy])
        t0 = time.monotonic()
        k.check(cells["ok"], timeout=300)  # start the warm cluster (not counted)
        start_s = time.monotonic() - t0
        for i, kind in enumerate(plan(runs, tuple(cells), faults, fault_every), 1):
            outcome, seconds = run_one(k, kind, cells, holds)
            row = {
                "run": i,
                "kind": kind,
                "outcome": outcome,
                "seconds": round(seconds, 2),
                "expected": outcome == (EXPECT[kind] or "ok"),
                **sample(k),
            }
            rows.append(row)
            print(
                f"{i:>4} {kind:<9} {outcome:<17} {seconds:7.2f} s  procs {row['procs']:>3}  "
                f"fds {row['fds']:>4}  rss {row['rss_mib']:8.1f} MiB",
                file=out,
                flush=True,
            )
        pids = k.children()  # recorded before the stop: afterwards they are no longer below the kernel
        pids = set(pids) - kernel_helpers(pids)  # Python's resource tracker ends with the kernel
        k.check("%kdist stop")
        left, linger = wait_gone(pids, 120)
    finally:
        k.shutdown()
        wait_gone(k.seen_pids, 60)
        k.cleanup()
    after = [r for r in (rows[warmup:] if len(rows) > warmup else rows) if r["kind"] not in FAULTS]
    n = len(after)
    procs = [r["procs"] for r in after]
    fds = [r["fds"] for r in after]
    rss = [r["rss_mib"] for r in after]
    tail = min(10, max(1, n // 2))
    verdict = {
        "runs": len(rows),
        "warmup": warmup,
        "cluster_start_s": round(start_s, 1),
        "unexpected": [r for r in rows if not r["expected"]],
        "procs_slope_per_run": slope(procs),
        "procs_first_last": (procs[0], procs[-1]),
        "fds_slope_per_run": slope(fds),
        "fds_min_max": (min(fds), max(fds)),
        "rss_growth_mib": statistics.median(rss[-tail:]) - statistics.median(rss[:tail]),
        "seconds_by_kind": {
            kind: round(statistics.median([r["seconds"] for r in rows if r["kind"] == kind]), 2)
            for kind in sorted({r["kind"] for r in rows})
        },
        "left_after_stop": left,
        "stop_linger_s": round(linger, 1),
        "shm_names_left": max(r["shm"] for r in rows) if rows else 0,
        "bounds": {"procs_drift": 1.0, "fd_drift": fd_bound, "rss_growth_mib": rss_bound_mib},
    }
    verdict["flat"] = (
        abs(verdict["procs_slope_per_run"]) * n < 1.0
        and procs[0] == procs[-1]
        and abs(verdict["fds_slope_per_run"]) * n < fd_bound
        and verdict["rss_growth_mib"] < rss_bound_mib
        and not verdict["unexpected"]
        and not left
        and not verdict["shm_names_left"]
    )
    print(f"\nafter {warmup} warm-up runs, over {n} runs:", file=out)
    print(f"  processes: slope {verdict['procs_slope_per_run']:+.4f}/run, first {procs[0]}, last {procs[-1]}", file=out)
    print(f"  kernel fds: slope {verdict['fds_slope_per_run']:+.4f}/run, range {min(fds)}..{max(fds)}", file=out)
    print(f"  kernel RSS: growth {verdict['rss_growth_mib']:+.1f} MiB (median of last {tail} - first {tail})", file=out)
    print(f"  median seconds per run: {verdict['seconds_by_kind']}; cluster start {start_s:.1f} s", file=out)
    print(f"  /dev/shm names of --push left after a run: at most {verdict['shm_names_left']}", file=out)
    print(
        f"  unexpected outcomes: {len(verdict['unexpected'])}; left after %kdist stop: {left} (waited {linger:.1f} s)",
        file=out,
    )
    print(
        f"verdict: {'FLAT' if verdict['flat'] else 'NOT FLAT'} (bounds: drift < 1 process, "
        f"< {fd_bound:g} fds over the runs, RSS growth < {rss_bound_mib:g} MiB)",
        file=out,
    )
    return {"rows": rows, "verdict": verdict}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--fd-bound", type=float, default=5.0)
    ap.add_argument("--rss-bound-mib", type=float, default=64.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--strategy", choices=sorted(CELLS), default="horovod")
    ap.add_argument("--faults", action="store_true", help="mix in faults (see the module doc)")
    ap.add_argument("--fault-every", type=int, default=15)
    args = ap.parse_args(argv)
    result = soak(
        args.runs,
        args.warmup,
        args.fd_bound,
        args.rss_bound_mib,
        strategy=args.strategy,
        faults=args.faults,
        fault_every=args.fault_every,
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["verdict"]["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
