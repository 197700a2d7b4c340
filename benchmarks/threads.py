"""Thread placement, measured: the P1 workload under horovodrun over thread settings.

For N ranks on C cores (the affinity mask), every combination of

  TF_NUM_INTRAOP_THREADS  1, C // N, C     (per rank; duplicates dropped)
  TF_NUM_INTEROP_THREADS  1, 2, unset      (unset: TensorFlow's own choice)
  OMP_NUM_THREADS         1, unset

and kdist's own setting where it is none of these (one rank: OMP C), runs ``workload.train``
under ``horovodrun -np N --gloo`` (the same launcher as P1's B), ``--repeats`` times in a
rotating order, and prints steady-state steps/s per setting, best
first, as ratios to the best measured in the same run. kdist's engine defaults
(``kdist_magics.rank.lifecycle.thread_env``) are marked; ``--json FILE`` keeps everything.

``python benchmarks/threads.py [--np 2] [--repeats 2] [--steps 200] [--warmup 40] [--only L;L] [--json F]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402  (isolates IPython/Jupyter dirs on import)
from harness import fmt, log, median  # noqa: E402

UNSET = "unset"


def settings(cores: int, np: int) -> list[dict[str, str]]:
    intra = sorted({1, max(1, cores // np), cores})
    out = []
    for a, b, c in itertools.product(intra, ("1", "2", UNSET), ("1", UNSET)):
        env = {"TF_NUM_INTRAOP_THREADS": str(a)}
        if b != UNSET:
            env["TF_NUM_INTEROP_THREADS"] = b
        if c != UNSET:
            env["OMP_NUM_THREADS"] = c
        out.append(env)
    return out


def label(env: dict[str, str]) -> str:
    return (
        f"intra {env.get('TF_NUM_INTRAOP_THREADS', UNSET)}, "
        f"inter {env.get('TF_NUM_INTEROP_THREADS', UNSET)}, "
        f"omp {env.get('OMP_NUM_THREADS', UNSET)}"
    )


def main(argv=None) -> dict:
    from kdist_magics.rank.lifecycle import thread_env, threads_per_rank

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument(
        "--only",
        help="settings to run, as the table labels them, ';'-separated "
        "(e.g. 'intra 1, inter 1, omp unset;intra 1, inter 1, omp 1')",
    )
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    candidates = settings(cores, args.np)
    kdist = thread_env(threads_per_rank(args.np), args.np)
    if label(kdist) not in map(label, candidates):  # e.g. OMP C/N with one rank on C cores
        candidates.append(kdist)
    if args.only:
        wanted = [w.strip() for w in args.only.split(";")]
        candidates = [e for e in candidates if label(e) in wanted]
    out = harness.HOME / "runs"
    out.mkdir()
    log(
        f"threads: {len(candidates)} settings x {args.repeats} repeats, {args.np} ranks on "
        f"{cores} cores, {args.steps} steps each"
    )
    harness.horovodrun(40, out, "warm", candidates[0], np=args.np)  # page cache, not measured
    rates: dict[str, list[float]] = {label(e): [] for e in candidates}
    t0 = time.time()
    for i in range(args.repeats):
        shift = (i * len(candidates)) // max(1, args.repeats)
        for env in candidates[shift:] + candidates[:shift]:
            run = harness.horovodrun(
                args.steps,
                out,
                f"{i}-{len(rates[label(env)])}-" + label(env).replace(", ", "_").replace(" ", ""),
                env,
                np=args.np,
            )
            rates[label(env)].append(harness.rate(run, args.warmup))
            log(f"threads: {label(env)}: {rates[label(env)][-1]:.2f} steps/s")
    med = {k: median(v) for k, v in rates.items()}
    best = max(med.values())
    ranked = sorted(med, key=lambda k: -med[k])
    print(
        f"threads: {args.np} ranks on {cores} cores, horovodrun -np {args.np} --gloo, "
        f"{args.repeats} rotating repeats of {args.steps} steps ({time.time() - t0:.0f} s)"
    )
    print(f"{'setting':<36} {'steps/s (median; each)':<28} {'/ best':>7}")
    for k in ranked:
        mark = "  <- kdist's default" if k == label(kdist) else ""
        each = ", ".join(fmt(r) for r in rates[k])
        print(f"{k:<36} {(fmt(med[k]) + ' (' + each + ')'):<28} {med[k] / best:>7.3f}{mark}")
    result = {
        "machine": harness.machine(),
        "np": args.np,
        "cores": cores,
        "rates": rates,
        "median": med,
        "best": ranked[0],
        "kdist_default": label(kdist),
        "kdist_vs_best": med.get(label(kdist), float("nan")) / best,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
