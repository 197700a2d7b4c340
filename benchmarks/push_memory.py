"""P11: ``--push`` of 1 GiB of arrays to local engines, against a pickle round trip in the kernel.

One IPython shell in this process (kdist loaded, isolated dirs) with warm engines
(``--strategy multiworker`` under ``KERAS_BACKEND=jax``), a dict of two float32 arrays of
``--mib``/2 MiB each in the notebook, measured side by side in one run:

  A   a ``%%kdist ... --push data`` cell that only reads ``data`` (the first push), less a plain
      cell's time on the same engines (the cell's own cost without a push)
  B   ``pickle.loads(pickle.dumps(data, protocol=5))`` in the kernel (what one transfer costs)
  mem the kernel's and engines' memory after A's cell less before it, shared pages counted
      once (the sum of their PSS)
  2nd the same cell again, ``data`` unchanged, less the cell without ``--push`` (data bound)
  4v2 the push alone with ``--np 4`` against ``--np 2``: the run's set-up phase (engines
      prepared, ``--push`` sent; warm JAX engines do little else there) with the push less
      without it; beside it A's cell less the same cell without ``--push`` reading the bound
      data, which also holds each engine's first read of the mapped pages (page faults)

P11 = A / B (goal <= 1.5; ``--push`` was ~10x before shared memory), with the memory growth
(goal <= 1.3 GiB for 1 GiB), the second push (goal < 0.1 s) and 4v2 (goal <= 1, no slower)
printed beside it. Medians of ``--repeats``.

``python benchmarks/push_memory.py [--mib 1024] [--repeats 3] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402,F401  (isolates IPython/Jupyter dirs on import)
from harness import log, median  # noqa: E402

READ = "kd_n = float(sum(v.sum() for v in data.values()))  # every page read once"
PLAIN = "kd_n = 0"


def timed(ip, line: str, cell: str) -> float:
    t0 = time.perf_counter()
    ip.run_cell_magic("kdist", line, cell)
    return time.perf_counter() - t0


def setup_s() -> float:
    """The last run's set-up phase (the engines prepared, ``--push`` sent, the framework's
    set-up: on warm JAX engines, nearly nothing but the push), from its record."""
    import kdist_magics

    phase = next(p for p in kdist_magics.last_run().phases if p["name"].startswith("setting up"))
    return phase["ended"] - phase["started"]


def host_memory() -> int:
    """The kernel's and its engines' memory, each shared page counted once (the sum of their
    proportional set sizes, PSS: a page mapped by n of them counts 1/n in each)."""
    import psutil

    import kdist_magics

    cluster = kdist_magics._extension._strategies["multiworker"].cluster
    total = 0
    for pid in [os.getpid(), *(e.pid for e in cluster.engines)]:
        total += psutil.Process(pid).memory_full_info().pss
    return total


def measure(ip, np_: int, repeats: int, mib: int) -> dict:
    import numpy as np

    line = f"--strategy multiworker --np {np_} --no-dashboard"
    rows = {"A": [], "B": [], "mem": [], "push": [], "phase": [], "second": []}
    for r in range(repeats):
        rng = np.random.default_rng(r)
        half = mib * 2 ** 20 // 8  # float32 elements in half of it
        ip.user_ns["data"] = {"x": rng.random(half, dtype=np.float32),
                              "y": rng.random(half, dtype=np.float32)}
        plain = median([timed(ip, line, PLAIN) for _ in range(3)])  # warm engines, no push
        t0 = time.perf_counter()
        pickle.loads(pickle.dumps(ip.user_ns["data"], protocol=5))
        rows["B"].append(time.perf_counter() - t0)
        before = host_memory()
        cell = timed(ip, f"{line} --push data", READ)
        pushing = setup_s()
        rows["mem"].append((host_memory() - before) / 2 ** 30)
        read = median([timed(ip, line, READ) for _ in range(2)])  # data bound, nothing pushed
        rows["phase"].append(pushing - setup_s())  # the push itself: set-up with it less without
        rows["A"].append(cell - plain)
        rows["push"].append(cell - read)  # the push alone
        rows["second"].append(timed(ip, f"{line} --push data", READ) - read)
        log(f"push_memory: np {np_} repeat {r}: A {rows['A'][-1]:.2f} s, B {rows['B'][-1]:.2f} s, "
            f"+{rows['mem'][-1]:.2f} GiB, second {rows['second'][-1]:.3f} s")
        ip.user_ns.pop("data")
        ip.run_line_magic("kdist", "stop")  # the engines' copies go with them
    return {k: median(v) for k, v in rows.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    os.environ["KERAS_BACKEND"] = "jax"
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kdist_magics")
    two = measure(ip, 2, args.repeats, args.mib)
    four = measure(ip, 4, args.repeats, args.mib)
    p11 = two["A"] / two["B"]
    print(f"P11 {p11:.2f} (goal <= 1.5): --push of {args.mib} MiB to 2 local engines "
          f"{two['A']:.2f} s against a pickle round trip {two['B']:.2f} s")
    print(f"P11 memory +{two['mem']:.2f} GiB on the host (goal <= {1.3 * args.mib / 1024:.2f}); "
          f"second push of the unchanged data {two['second']:.3f} s (goal < 0.1); "
          f"4 engines / 2 (the push alone): {four['phase'] / two['phase']:.2f} (goal <= 1; "
          f"{two['phase']:.2f} s and {four['phase']:.2f} s of set-up); the push cell less the "
          f"same cell reading data already bound, which adds each engine's first read of the "
          f"mapped pages: {four['push'] / two['push']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"two": two, "four": four,
                                               "goals": {"P11": {"value": p11}}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
