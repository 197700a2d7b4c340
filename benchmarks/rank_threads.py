"""Diagnostic (not part of ``make bench``): where the ranks' CPU goes, kdist against horovodrun.

Runs the shared workload once as ``%%kdist --strategy horovod --np 2`` (in a real
kernel, isolated dirs, engines warm) and once under ``horovodrun -np 2 --gloo`` with
the same thread variables, and samples every thread of both ranks (``/proc`` CPU
times) over a steady-state window. Threads are named by the OS (``comm``: TensorFlow
and Horovod name theirs) and, for Python threads on the engines, by
``threading.enumerate()``. Prints, per run, CPU per step by thread, so a difference
in the ranks' CPU per step between the two launchers shows where it comes from.

``python benchmarks/rank_threads.py [--steps 600] [--window 5] [--options "--no-telemetry"]``
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402  (isolates IPython/Jupyter dirs on import)

NAMES_CELL = """%%kdist --strategy horovod --np 2 --no-dashboard
import json as _j, threading as _t
with open({path!r} + f"/names-{{hvd.rank()}}.json", "w") as _f:
    _j.dump({{str(t.native_id): t.name for t in _t.enumerate()}}, _f)
"""


def _threads(pid: int) -> dict[int, tuple[str, float]]:
    import psutil

    out = {}
    try:
        for t in psutil.Process(pid).threads():
            try:
                comm = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
            except OSError:
                comm = "?"
            out[t.id] = (comm, t.user_time + t.system_time)
    except psutil.Error:
        pass
    return out


def _sampled(root_pid: int, delay: float, window: float, found: list) -> threading.Thread:
    """In the background: after ``delay`` s, every thread of the ranks below ``root_pid``."""
    import psutil

    def ranks():
        procs = psutil.Process(root_pid).children(recursive=True)
        return [
            p.pid
            for p in procs
            if any("ipengine" in a or "ipyparallel.engine" in a or "hvd_train" in a for a in p.cmdline())
        ]

    def sample():
        time.sleep(delay)
        pids = ranks()
        first = {pid: _threads(pid) for pid in pids}
        t0 = time.time()
        time.sleep(window)
        last = {pid: _threads(pid) for pid in pids}
        found.append((first, last, t0, time.time()))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    return thread


def _report(label: str, found: list, run: dict, names: dict[int, dict[str, str]]) -> dict:
    first, last, t0, t1 = found[0]
    ends = run["ranks"][0]["step_ends"]
    steps = sum(1 for e in ends if t0 <= e <= t1) or 1
    by_name: dict[str, float] = collections.Counter()
    for pid, threads in last.items():
        for tid, (comm, cpu) in threads.items():
            used = cpu - first.get(pid, {}).get(tid, (comm, 0.0))[1]
            name = names.get(pid, {}).get(str(tid)) or comm
            if name == "MainThread" or tid == pid:
                name = "main thread"
            by_name[name] += used
    total = sum(by_name.values())
    print(
        f"{label}: {steps} steps in a {t1 - t0:.1f} s window, both ranks' CPU per step {total / steps * 1000:.2f} ms:"
    )
    for name, used in sorted(by_name.items(), key=lambda kv: -kv[1]):
        if used / steps >= 0.00001:
            print(f"  {used / steps * 1000:7.3f} ms/step  {name}")
    return {"steps": steps, "ms_per_step": {k: v / steps * 1000 for k, v in by_name.items()}}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--window", type=float, default=5.0, help="seconds sampled")
    parser.add_argument("--options", default="", help="extra %%kdist options, e.g. --no-telemetry")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    out = harness.HOME / "runs"
    out.mkdir()
    kernel = harness.Kernel()
    results = {}
    try:
        kernel.run(harness.KERNEL_SETUP)
        warm = harness.kdist_run(kernel, 40, out, "warm")
        threads = {k: v for k, v in warm["ranks"][0]["threads"].items() if v is not None}
        harness.horovodrun(40, out, "warm-S", threads)
        kernel.run(NAMES_CELL.format(path=str(out)))
        pids = [r["pid"] for r in warm["ranks"]]
        names = {pid: json.loads((out / f"names-{r}.json").read_text()) for r, pid in enumerate(pids)}
        found: list = []
        sampler = _sampled(kernel.pid, 4.0, args.window, found)
        run = harness.kdist_run(kernel, args.steps, out, "K", args.options)
        sampler.join()
        results["kdist"] = _report(f"%%kdist {args.options or '(defaults)'}", found, run, names)
        found = []
        holder: dict = {}
        # horovodrun's ranks: sample from its process, found once it has started
        import psutil

        def start_sampler():
            me = psutil.Process()
            deadline = time.time() + 60
            while time.time() < deadline:
                kids = [p for p in me.children() if "horovodrun_lo" in " ".join(p.cmdline())]
                if kids:
                    holder["thread"] = _sampled(kids[0].pid, 8.0, args.window, found)
                    return
                time.sleep(0.05)

        starter = threading.Thread(target=start_sampler, daemon=True)
        starter.start()
        run = harness.horovodrun(args.steps, out, "S", threads)
        starter.join()
        holder["thread"].join()
        results["horovodrun"] = _report("horovodrun, same threads", found, run, {})
    finally:
        kernel.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
