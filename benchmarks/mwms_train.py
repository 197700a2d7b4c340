"""TensorFlow's own multi-worker launch, by hand: what ``bench_multiworker.py`` runs as B.

``python mwms_train.py --launch N --steps S --out DIR --tag TAG [--started T]`` picks N free
loopback ports and starts N workers (this script with ``--index I``), each with its
``TF_CONFIG``, as TensorFlow's multi-worker guide does by hand, then waits for them: its exit
status is the first failing worker's. A worker runs ``workload.train_multiworker`` under
``tf.distribute.MultiWorkerMirroredStrategy``. The thread variables come from the environment
(the benchmark passes the ones kdist's engines had). Stock Keras 3 cannot ``fit`` under that
strategy with two workers (keras-team/keras#20585), so each worker applies kdist's fix
(``kdist_magics.strategies.multiworker.keras_mwms``), as a ``multiworker`` cell does: both sides run the same code.
"""

import argparse
import json
import os
import subprocess
import sys

from kdist_magics.cluster.network import free_ports

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def launch(args) -> int:
    ports = ",".join(map(str, free_ports(args.launch)))
    common = ["--ports", ports, "--steps", str(args.steps), "--out", args.out, "--tag", args.tag]
    if args.started is not None:
        common += ["--started", repr(args.started)]
    workers = [
        subprocess.Popen([sys.executable, os.path.abspath(__file__), "--index", str(i), *common])
        for i in range(args.launch)
    ]
    codes = [w.wait() for w in workers]
    return next((c for c in codes if c != 0), 0)


def work(args) -> None:
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in args.ports.split(",")]},
            "task": {"type": "worker", "index": args.index},
        }
    )
    import tensorflow as tf

    import workload
    from kdist_magics.strategies.multiworker import keras_mwms

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with keras_mwms.applied():
        workload.train_multiworker(strategy, args.steps, args.out, args.tag, started=args.started)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--launch", type=int, help="start this many workers and wait for them")
    parser.add_argument("--index", type=int, help="this worker's index (as started by --launch)")
    parser.add_argument("--ports", help="one loopback port per worker, comma-separated")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--started", type=float, default=None)
    args = parser.parse_args()
    if args.launch:
        sys.exit(launch(args))
    work(args)
