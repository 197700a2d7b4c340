"""How fast kdist notices and cleans up each failure, through a real kernel (reported, never judged).

For ``%%kdist --strategy horovod --np 2`` on one warm cluster, repeated ``--repeat`` times:

* raise:     rank 1 raises while rank 0 sleeps -> seconds from the raise (rank 1's clock) to
             the notebook receiving the error, and to the kernel being idle again;
* die:       rank 1 ``os._exit(3)`` while rank 0 sleeps -> seconds from the exit to the error,
             and how long the next cell takes (it restarts the engines);
* timeout:   ``--timeout 3`` with rank 0 sleeping -> seconds past the 3 s (from the cell's start
             on rank 0) until the error;
* interrupt: ``km.interrupt_kernel()`` while both ranks sleep -> seconds from the interrupt to
             the error and to idle;
* stop:      ``%kdist stop`` -> seconds until every process of the cluster is gone;
* kill:      (once, last) SIGKILL the kernel -> seconds until its controller, engines and
             nannies are gone (the engines watch the kernel's pid).

Engine-side moments are ``time.time()`` written by the ranks to a file (same host, same clock).
Usage: ``python benchmarks/failure_times.py [--repeat 3] [--json out.json]``.

``--matrix`` instead runs the fault matrix once (``tests/fault_matrix.py``: every fault
at every phase kdist's phase barrier can hold, for horovod, multiworker and its JAX and
PyTorch forms (``--strategies``), and the kernel killed or restarted) and prints each case's outcome, seconds from the fault to it, whether the
next cell worked and what was left, then the same as a Markdown table for docs/guide/troubleshooting.md.
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

from kernel_driver import Kernel, isolated_env, wait_gone  # noqa: E402

HVD = "%%kdist --strategy horovod --np 2 --no-dashboard"


def stamp(path: Path) -> str:
    return f"open({str(path)!r}, 'w').write(repr(__import__('time').time()))"


def error_at(res) -> float | None:
    for m in res.messages:
        if m["header"]["msg_type"] == "error":
            return m["received"]
    return None


def idle_at(res) -> float:
    return res.messages[-1]["received"]


def read(path: Path) -> float:
    return float(path.read_text())


def measure(k: Kernel, tmp: Path, case: str) -> dict:
    mark = tmp / f"{case}-{time.monotonic_ns()}.t"
    if case == "raise":
        res = k.execute(
            f"{HVD}\nimport time\nif hvd.rank() == 1:\n    {stamp(mark)}\n"
            "    raise ValueError('measured')\ntime.sleep(120)",
            timeout=300,
        )
        t = read(mark)
        return {"error": res.errors[0]["ename"], "to_error_s": error_at(res) - t, "to_idle_s": idle_at(res) - t}
    if case == "die":
        res = k.execute(
            f"{HVD}\nimport os, time\nif hvd.rank() == 1:\n    {stamp(mark)}\n    os._exit(3)\ntime.sleep(120)",
            timeout=300,
        )
        t = read(mark)
        t_next = time.time()
        k.check(f"{HVD}\nhvd.size()", timeout=300)
        return {
            "error": res.errors[0]["ename"],
            "to_error_s": error_at(res) - t,
            "to_idle_s": idle_at(res) - t,
            "next_cell_with_restart_s": time.time() - t_next,
            "message": res.errors[0]["evalue"][:40],
        }
    if case == "timeout":
        res = k.execute(
            f"{HVD} --timeout 3\nimport time\nif hvd.rank() == 0:\n    {stamp(mark)}\n    time.sleep(120)", timeout=300
        )
        t = read(mark) + 3.0
        return {
            "error": res.errors[0]["ename"],
            "overrun_to_error_s": error_at(res) - t,
            "overrun_to_idle_s": idle_at(res) - t,
        }
    if case == "interrupt":
        asked = {}

        def on_message(msg, res):
            if "at" not in asked and msg["header"]["msg_type"] == "stream" and "kd-go" in msg["content"]["text"]:
                asked["at"] = time.time()
                k.interrupt()

        res = k.execute(
            f"{HVD}\nimport time\nprint('kd-go', flush=True)\ntime.sleep(120)", timeout=300, on_message=on_message
        )
        t = asked["at"]
        return {"error": res.errors[0]["ename"], "to_error_s": error_at(res) - t, "to_idle_s": idle_at(res) - t}
    if case == "stop":
        pids = k.children()
        t = time.monotonic()
        k.check("%kdist stop")
        reply_s = time.monotonic() - t
        left, _ = wait_gone(pids, 120, every=0.05)
        gone_s = time.monotonic() - t
        k.check(f"{HVD}\nhvd.size()", timeout=300)  # engines again for the next case
        return {"error": None, "stop_reply_s": reply_s, "all_gone_s": gone_s, "left": left}
    raise ValueError(case)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="raise,die,timeout,interrupt,stop,kill")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--matrix", action="store_true", help="the fault matrix instead (see above)")
    ap.add_argument(
        "--strategies",
        default="horovod,multiworker,jax,torch",
        help="--matrix: which strategies (tests/fault_matrix.py's keys)",
    )
    args = ap.parse_args(argv)
    if args.matrix:
        return matrix(args.strategies.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="kdist-failure-times-"))
    k = Kernel(cwd=ROOT, env=isolated_env())
    results: dict[str, list[dict]] = {}
    try:
        k.check("import kdist_magics")
        t0 = time.monotonic()
        k.check(f"{HVD}\nimport tensorflow\nhvd.size()", timeout=300)
        print(f"cluster start + first cell: {time.monotonic() - t0:.1f} s", flush=True)
        for case in args.cases.split(","):
            if case == "kill":
                continue  # below, once: it ends the kernel
            for i in range(args.repeat):
                row = measure(k, tmp, case)
                results.setdefault(case, []).append(row)
                print(
                    f"{case:<9} #{i + 1}: "
                    + ", ".join(
                        f"{key} {value:.2f}" if isinstance(value, float) else f"{key} {value}"
                        for key, value in row.items()
                    ),
                    flush=True,
                )
        if "kill" in args.cases.split(","):
            pids = k.children()
            t = time.monotonic()
            k.kill()
            left, _ = wait_gone(pids, 120, every=0.05)
            row = {"error": None, "all_gone_s": time.monotonic() - t, "left": left}
            results["kill"] = [row]
            print(f"kill      #1: all_gone_s {row['all_gone_s']:.2f}, left {left}", flush=True)
    finally:
        k.shutdown()
        wait_gone(k.seen_pids, 60)
        k.cleanup()
    print("\nmedian [min..max] seconds over", args.repeat, "runs (2-core shared machine; not asserted)")
    summary = {}
    for case, rows in results.items():
        for key in rows[0]:
            values = [r[key] for r in rows if isinstance(r.get(key), float)]
            if values:
                summary[f"{case}.{key}"] = (statistics.median(values), min(values), max(values))
                print(f"  {case:<9} {key:<26} {statistics.median(values):6.2f} [{min(values):.2f}..{max(values):.2f}]")
        errors = sorted({str(r.get("error")) for r in rows})
        print(f"  {case:<9} {'error shown':<26} {', '.join(errors)}")
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "summary": summary}, indent=1))
    return 0


def matrix(strategies: list[str]) -> int:
    import fault_matrix as fm

    rows = []
    for strategy in strategies:
        for out, expected in fm.run_strategy(strategy, fm.EXPECTED[strategy], fm.scratch()):
            rows.append((out, expected))
            print(out.row(), flush=True)
    for case in [c for c in fm.KERNEL_CASES if c[0] in strategies]:
        out, k = fm.run_case(*case, fm.scratch())
        rows.append((out, None))
        print(out.row(), flush=True)
        if k is not None:
            k.shutdown()
            k.cleanup()
    print("\n| strategy | phase | fault | outcome | seconds from the fault | next cell | left |")
    print("|---|---|---|---|---|---|---|")
    for out, expected in rows:
        what = (
            "the kernel went; its processes followed"
            if out.fault in fm.KERNEL_FAULTS
            else "carried on"
            if out.ok
            else f"`{(out.error or '?')[:90]}`"
        )
        took = (
            f"all gone in {out.gone_s:.1f}"
            if out.gone_s is not None
            else f"{out.to_outcome_s:.1f}"
            if out.to_outcome_s is not None
            else "-"
        )
        oks = [e == "ok" for e in (expected if isinstance(expected, list) else [expected])]
        agrees = "" if expected is None or out.ok in oks else " (not as tested!)"
        print(
            f"| {out.strategy} | {out.phase} | {out.fault} | {what}{agrees} | {took} | "
            f"{'works' if out.next_ok else '-' if out.next_ok is None else 'FAILS'} | {len(out.left)} |"
        )
    return 0 if all(not o.left and o.next_ok is not False for o, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
