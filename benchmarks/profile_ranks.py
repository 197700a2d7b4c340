"""Where a rank's time goes: a ``%%kdist`` cell's ranks (K) against the same launched by hand (S).

P1 and P7 compare the two by rate; this says why they differ. The same workload as
``bench_horovod.py`` (``bench_multiworker.py`` with ``--strategy multiworker``) runs once as a
``%%kdist`` cell in a real kernel and once by hand (``horovodrun -np 2 --gloo``; two TensorFlow
workers with ``TF_CONFIG``) with kdist's thread variables; once each run is past its warm-up,
``py-spy`` samples every rank for ``--seconds`` (active samples only, native frames left out)
and the script prints, per variant, the share of samples by where the rank was (the frames
named in ``PLACES``, matched innermost first), then the heaviest leaf frames side by side.

``python benchmarks/profile_ranks.py [--strategy horovod|multiworker] [--model cnn] [--steps 600]
[--seconds 20]``; needs
``py-spy`` (``pip install py-spy``; ``--py-spy PATH`` or on PATH) and the right to trace
processes (root, or ``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (isolates IPython/Jupyter dirs on import)
from harness import log  # noqa: E402

#: where a sample is, by the first of these (file part, label) found from the innermost frame out
PLACES = (
    ("kdist_magics/watch/", "kdist: telemetry and sampling"),
    ("kdist_magics/rank/", "kdist: the engine's feed"),
    ("kdist_magics/keras_horovod/", "kdist's Horovod binding"),
    ("horovod/", "Horovod"),
    ("ipyparallel/", "ipyparallel"),
    ("zmq/", "ZeroMQ"),
    ("tornado/", "tornado"),
    ("tensorflow/", "TensorFlow"),
    ("keras/", "Keras"),
    ("threading.py", "Python threads"),
)
#: what a rank's command line holds, per strategy and variant
RANK_MARKS = {
    "horovod": {"K": "ipyparallel.engine", "S": "hvd_train.py"},
    "multiworker": {"K": "ipyparallel.engine", "S": "mwms_train.py"},
}


def rank_pids(mark: str) -> list[int]:
    """Running processes whose command line holds ``mark`` (the ranks of one variant)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if mark in cmd and not any(w in cmd for w in ("py-spy", "horovodrun", "--launch")):
            found.append(int(entry.name))
    return found


def sample(py_spy: str, mark: str, after: float, seconds: float, out: Path, got: dict) -> None:
    """In a thread: ``after`` s on, record every rank for ``seconds``; collapsed stacks per pid."""
    time.sleep(after)
    procs = []
    for pid in rank_pids(mark):
        path = out / f"{mark.replace('/', '_')}-{pid}.txt"
        with open(path.with_suffix(".err"), "w") as err:
            procs.append(
                (
                    pid,
                    path,
                    subprocess.Popen(
                        [
                            py_spy,
                            "record",
                            "-p",
                            str(pid),
                            "-d",
                            str(int(seconds)),
                            "-r",
                            "200",
                            "-f",
                            "raw",
                            "--nonblocking",
                            "-o",
                            str(path),
                        ],
                        stdout=err,
                        stderr=subprocess.STDOUT,
                    ),
                )
            )
    for pid, path, proc in procs:
        proc.wait()
        if path.exists():
            got[pid] = path
        else:
            said = path.with_suffix(".err").read_text().strip().splitlines()
            log(f"profile_ranks: py-spy on pid {pid} wrote nothing: {said[:1]}")


def read(paths) -> collections.Counter:
    """Samples per stack over ``paths`` (py-spy's raw format: ``frame;frame;... count``)."""
    stacks: collections.Counter = collections.Counter()
    for path in paths:
        if not Path(path).exists():
            continue
        for line in Path(path).read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                stacks[stack] += int(count)
    return stacks


def place(stack: str) -> str:
    for frame in reversed(stack.split(";")):
        for part, label in PLACES:
            if part in frame:
                return label
    return "elsewhere"


def summary(stacks: collections.Counter) -> tuple[dict[str, float], dict[str, float]]:
    """(share of samples per place, share per leaf frame)."""
    total = sum(stacks.values()) or 1
    places: collections.Counter = collections.Counter()
    leaves: collections.Counter = collections.Counter()
    for stack, n in stacks.items():
        places[place(stack)] += n
        leaves[stack.split(";")[-1]] += n
    return ({k: v / total for k, v in places.most_common()}, {k: v / total for k, v in leaves.most_common(15)})


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=("horovod", "multiworker"), default="horovod")
    parser.add_argument("--model", choices=("mlp", "cnn"), default="cnn")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seconds", type=int, default=20, help="seconds sampled per run")
    parser.add_argument("--after", type=float, default=15.0, help="seconds into a run before sampling")
    parser.add_argument("--keep", help="copy py-spy's files (one per rank, raw) into this folder")
    parser.add_argument("--py-spy", default=os.environ.get("PYSPY") or shutil.which("py-spy"))
    args = parser.parse_args(argv)
    if not args.py_spy:
        parser.error("py-spy not found: pip install py-spy, or --py-spy PATH")
    os.environ["KDIST_BENCH_MODEL"] = harness.workload.MODEL = args.model
    out = harness.HOME / "runs"
    out.mkdir()
    got: dict[str, dict] = {"K": {}, "S": {}}
    kernel = harness.Kernel()
    try:
        kernel.run(harness.KERNEL_SETUP)
        warm = harness.kdist_run(kernel, 60, out, "warm-K", strategy=args.strategy)
        threads = {k: v for k, v in warm["ranks"][0]["threads"].items() if v is not None}
        by_hand = harness.horovodrun if args.strategy == "horovod" else harness.tf_workers
        for v in ("K", "S"):
            t = threading.Thread(
                target=sample, args=(args.py_spy, RANK_MARKS[args.strategy][v], args.after, args.seconds, out, got[v])
            )
            t.start()
            if v == "K":
                harness.kdist_run(kernel, args.steps, out, "K", strategy=args.strategy)
            else:
                by_hand(args.steps, out, "S", threads)
            t.join()
            log(f"profile_ranks: {v}: {len(got[v])} ranks sampled")
    finally:
        kernel.close()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        for v in ("K", "S"):
            for pid, path in got[v].items():
                shutil.copy(path, Path(args.keep) / f"{v}-{pid}.txt")
    for v in ("K", "S"):
        for pid, path in got[v].items():
            stacks = read([path])
            top = summary(stacks)[0]
            log(
                f"profile_ranks: {v} pid {pid}: {sum(stacks.values())} samples, "
                + ", ".join(f"{k} {share:.0%}" for k, share in list(top.items())[:4])
            )
    results = {v: summary(read(got[v].values())) for v in ("K", "S")}
    print(
        f"\nwhere the ranks' active samples were ({args.strategy}, {args.model}, "
        f"{args.seconds} s each; K: %%kdist, S: by hand)"
    )
    labels = list(dict.fromkeys([*results["K"][0], *results["S"][0]]))
    print(f"{'place':34s} {'K':>7s} {'S':>7s}")
    for label in labels:
        print(f"{label:34s} {results['K'][0].get(label, 0):7.1%} {results['S'][0].get(label, 0):7.1%}")
    for v in ("K", "S"):
        print(f"\nheaviest leaf frames, {v}")
        for frame, share in results[v][1].items():
            print(f"  {share:6.1%}  {frame[:110]}")
    return results


if __name__ == "__main__":
    main()
