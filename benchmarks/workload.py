"""The one training body every benchmark runs, under kdist and under horovodrun alike.

A 3-layer MLP on synthetic data (fixed seeds), Horovod data parallel: the
optimizer is ``hvd.DistributedOptimizer``, rank 0's initial weights are
broadcast, each rank trains on its own shard. A callback records the wall-clock
time (``time.time()``, comparable across processes on one host) at the end of
every training step; :func:`train` writes them, with the thread settings the
rank actually ran with, to ``<out_dir>/<tag>-rank<r>.json``.

Both sides import this module: the ``%%kdist`` cell (``sys.path`` gets this
folder) and ``hvd_train.py`` (the script horovodrun starts), so A and B measure
the same code the same way.
"""

from __future__ import annotations

import json
import os
import time

SEED = 1234
FEATURES = 256
HIDDEN = int(os.environ.get("KDIST_BENCH_HIDDEN", 512))  # gpu_p1_p3.py makes it wider
CLASSES = 10
BATCH = int(os.environ.get("KDIST_BENCH_BATCH", 256))  # samples per rank per step
THREAD_VARS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")
DATA_BATCHES = 32  # distinct batches per rank, repeated for as many steps as asked
#: "mlp" (P1-P5) or "cnn": Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py model on
#: scikit-learn's digits upsampled to 28x28 (P7: a workload a user would run)
MODEL = os.environ.get("KDIST_BENCH_MODEL", "mlp")
CNN_BATCH = 128  # the example's batch size


def step_rate(times: list[float], warmup: int) -> float:
    """Steady-state steps/s: steps after the first ``warmup`` over the time they took."""
    times = list(times)
    if len(times) < warmup + 2:
        raise ValueError(f"{len(times)} step times, need more than {warmup + 1}")
    return (len(times) - 1 - warmup) / (times[-1] - times[warmup])


def train(hvd, steps: int, out_dir: str, tag: str, started: float | None = None) -> dict:
    """Train ``steps`` steps on this rank; write and return its timing record.

    ``hvd``: an initialised Keras-3 Horovod binding (``kdist_magics.keras_horovod``).
    ``started``: a reference time of the caller's own (kept in the record as is).
    """
    import keras
    import tensorflow as tf

    rank, size = hvd.rank(), hvd.size()
    if os.environ.get("KDIST_BENCH_GPU") == "1":  # gpu_p1_p3.py: one GPU per local rank
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            try:
                tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
                tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
            except RuntimeError:  # a warm engine: TF started already, pinned by the first cell
                pass
    keras.utils.set_random_seed(SEED)  # same initial weights everywhere; broadcast makes sure
    if MODEL == "cnn":
        model, data = _mnist_cnn(hvd, rank, size)
    else:
        model, data = _mlp(hvd, rank, size)
    return _fit(hvd, model, data, steps, out_dir, tag, started, rank)


def _mnist_cnn(hvd, rank: int, size: int):
    """The model and optimizer of Horovod's tensorflow2_keras_mnist.py (Keras 3 spelling)."""
    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.pad(np.kron(digits.images, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))
    order = np.random.default_rng(SEED + rank).permutation(len(images))  # each rank its order
    x = (images[order] / 16.0).astype(np.float32)[..., None]
    y = digits.target[order].astype(np.int64)
    data = (tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(CNN_BATCH, drop_remainder=True)
            .take(DATA_BATCHES).cache().repeat())
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, [3, 3], activation="relu"),
        keras.layers.Conv2D(64, [3, 3], activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Dropout(0.25),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * size)),
                  loss=keras.losses.SparseCategoricalCrossentropy())
    return model, data


def _mlp(hvd, rank: int, size: int):
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(SEED + rank)  # each rank its own shard
    n = DATA_BATCHES * BATCH
    x = rng.standard_normal((n, FEATURES), dtype=np.float32)
    w = np.random.default_rng(SEED).standard_normal((FEATURES, CLASSES)).astype(np.float32)
    y = np.argmax(x @ w, axis=1).astype(np.int32)
    data = (tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
            .cache().repeat())

    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * size)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, data


def _fit(hvd, model, data, steps: int, out_dir: str, tag: str, started, rank: int) -> dict:
    import keras

    size = hvd.size()

    ends: list[float] = []
    cpu: list[float] = []  # this process's CPU seconds (all threads) at each step end

    class StepTimes(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.time())
            cpu.append(time.process_time())

    t_fit = time.time()
    history = model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), StepTimes()])
    result = {
        "tag": tag, "rank": rank, "size": size, "pid": os.getpid(), "steps": len(ends),
        "started": started, "fit_called": t_fit, "step_ends": ends,
        "step_cpu": cpu,
        "loss": float(history.history["loss"][-1]),
        # what TensorFlow read when it started in this process (tf.config was not used)
        "threads": {v: os.environ.get(v) for v in THREAD_VARS},
    }
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{tag}-rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return result
