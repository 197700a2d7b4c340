"""What horovodrun starts on every rank: the shared training body (``workload.train``).

``python hvd_train.py --steps N --out DIR --tag TAG [--started T]``; ``--started`` is
the launcher's ``time.time()`` just before it started horovodrun (kept in the record).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workload  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--started", type=float, default=None)
    args = parser.parse_args()

    import kdist_magics.keras_horovod as hvd  # the Keras-3 binding kdist binds as `hvd`

    hvd.init()
    try:
        workload.train(hvd, args.steps, args.out, args.tag, started=args.started)
    finally:
        hvd.shutdown()
