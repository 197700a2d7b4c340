"""One MultiWorkerMirroredStrategy worker for tests/test_keras_mwms.py.

usage: keras_mwms_worker.py INDEX PORT0,PORT1,... FIX(0|1)

Trains a tiny Keras 3 model with ``fit`` (with validation data), then ``evaluate``
and ``predict``, under MultiWorkerMirroredStrategy on loopback; each worker seeds differently, so identical final weights show that
the strategy synchronised initial values and gradients. Prints one line
``RESULT {json}`` (loss per epoch, final weights, whether the fix was active)
or ``ERROR {json}`` (the exception's type and message).
"""

import json
import os
import sys

index, ports, fix = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3] == "1"
os.environ["TF_CONFIG"] = json.dumps(
    {
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    }
)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["KERAS_BACKEND"] = "tensorflow"
for var in ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS"):
    os.environ[var] = "1"

import contextlib  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(1)
import keras  # noqa: E402

keras.config.disable_traceback_filtering()

from kdist_magics.strategies.multiworker import keras_mwms  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(128, 4)).astype("float32")
y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32"))[:, None]
keras.utils.set_random_seed(10 + index)  # different initial weights on each worker
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")

with keras_mwms.applied() if fix else contextlib.nullcontext(False) as active:
    try:
        history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, validation_data=(x[:32], y[:32]))
        evaluated = model.evaluate(x, y, batch_size=16, verbose=0)
        predicted = model.predict(x[:40], batch_size=16, verbose=0)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        print("ERROR " + json.dumps({"type": type(exc).__name__, "message": str(exc)[:2000]}), flush=True)
        sys.exit(0)
print(
    "RESULT "
    + json.dumps(
        {
            "loss": history.history["loss"],
            "val_loss": history.history["val_loss"],
            "evaluate": float(evaluated),
            "predict_shape": list(predicted.shape),
            "weights": [w.tolist() for w in model.get_weights()],
            "fix_active": bool(active),
            "patched_after": keras_mwms.active(),
        }
    ),
    flush=True,
)
