"""The one training body every benchmark runs, under kdist and under horovodrun alike.

A 3-layer MLP on synthetic data (fixed seeds), Horovod data parallel: the
optimizer is ``hvd.DistributedOptimizer``, rank 0's initial weights are
broadcast, each rank trains on its own shard. A callback records the wall-clock
time (``time.time()``, comparable across processes on one host) at the end of
every training step; :func:`train` writes them, with the thread settings the
rank actually ran with, to ``<out_dir>/<tag>-rank<r>.json``.

Both sides import this module: the ``%%kdist`` cell (``sys.path`` gets this
folder) and ``hvd_train.py`` (the script horovodrun starts), so A and B measure
the same code the same way. :func:`train_multiworker` is the same training under
MultiWorkerMirroredStrategy (``bench_multiworker.py``: a ``multiworker`` cell against
``mwms_train.py`` workers started by hand with ``TF_CONFIG``).
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
    model, optimizer, loss = _model(size)
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer), loss=loss)
    data = _data(rank, _batch())
    return _fit(
        model, data, steps, out_dir, tag, started, rank, size, [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    )


def train_multiworker(strategy, steps: int, out_dir: str, tag: str, started: float | None = None) -> dict:
    """The same training under TensorFlow's MultiWorkerMirroredStrategy (one replica per worker):
    the same model, per-worker batch and data order per rank as :func:`train`; the strategy
    averages the gradients (P7's multiworker half)."""
    import keras
    import tensorflow as tf

    rank, size = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
    keras.utils.set_random_seed(SEED)  # the strategy syncs initial weights anyway
    with strategy.scope():
        model, optimizer, loss = _model(size)
        model.compile(optimizer=optimizer, loss=loss)
    options = tf.data.Options()  # each worker its own data, as each Horovod rank has its shard
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = _data(rank, _batch() * size).with_options(options)  # global batch: the per-worker one each
    return _fit(model, data, steps, out_dir, tag, started, rank, size, [])


def _batch() -> int:
    return CNN_BATCH if MODEL == "cnn" else BATCH


def _model(size: int):
    """The model (uncompiled), its optimizer (learning rate scaled by ``size``) and loss."""
    import keras

    if MODEL == "cnn":  # Horovod's tensorflow2_keras_mnist.py (Keras 3 spelling)
        model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                keras.layers.Conv2D(32, [3, 3], activation="relu"),
                keras.layers.Conv2D(64, [3, 3], activation="relu"),
                keras.layers.MaxPooling2D(pool_size=(2, 2)),
                keras.layers.Dropout(0.25),
                keras.layers.Flatten(),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dropout(0.5),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        return (model, keras.optimizers.Adam(0.001 * size), keras.losses.SparseCategoricalCrossentropy())
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    return (model, keras.optimizers.SGD(0.01 * size), keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _data(rank: int, batch: int):
    """This rank's own data (its shard or its order), ``batch`` samples a step, repeated."""
    import numpy as np
    import tensorflow as tf

    if MODEL == "cnn":  # scikit-learn's digits, upsampled to MNIST's 28x28
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.pad(np.kron(digits.images, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))
        order = np.random.default_rng(SEED + rank).permutation(len(images))  # each rank its order
        x = (images[order] / 16.0).astype(np.float32)[..., None]
        y = digits.target[order].astype(np.int64)
        return (
            tf.data.Dataset.from_tensor_slices((x, y))
            .repeat()
            .batch(batch, drop_remainder=True)
            .take(DATA_BATCHES)
            .cache()
            .repeat()
        )
    rng = np.random.default_rng(SEED + rank)  # each rank its own shard
    n = DATA_BATCHES * batch
    x = rng.standard_normal((n, FEATURES), dtype=np.float32)
    w = np.random.default_rng(SEED).standard_normal((FEATURES, CLASSES)).astype(np.float32)
    y = np.argmax(x @ w, axis=1).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).cache().repeat()


def _fit(model, data, steps: int, out_dir: str, tag: str, started, rank: int, size: int, callbacks: list) -> dict:
    import keras

    ends: list[float] = []
    cpu: list[float] = []  # this process's CPU seconds (all threads) at each step end

    class StepTimes(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.time())
            cpu.append(time.process_time())

    t_fit = time.time()
    history = model.fit(
        data, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False, callbacks=[*callbacks, StepTimes()]
    )
    result = {
        "tag": tag,
        "rank": rank,
        "size": size,
        "pid": os.getpid(),
        "steps": len(ends),
        "started": started,
        "fit_called": t_fit,
        "step_ends": ends,
        "step_cpu": cpu,
        "loss": float(history.history["loss"][-1]),
        # equal on every rank when the ranks trained one model (Horovod or the strategy synced them)
        "weights_sum": float(sum(float(abs(w).sum()) for w in model.get_weights())),
        # what TensorFlow read when it started in this process (tf.config was not used)
        "threads": {v: os.environ.get(v) for v in THREAD_VARS},
    }
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{tag}-rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return result
