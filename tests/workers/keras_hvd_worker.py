"""One Horovod rank for tests/test_keras_horovod.py.

Usage: python keras_hvd_worker.py SCENARIO OUTDIR
The HOROVOD_* / Gloo variables come from kdist_magics.strategies.horovod.rendezvous.Rendezvous.env(i).
Each rank writes OUTDIR/<scenario>-rank<R>.npz (arrays) and .json (scalars, lists);
the test process compares the ranks.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def save(outdir, scenario, rank, arrays, info):
    np.savez(os.path.join(outdir, f"{scenario}-rank{rank}.npz"), **arrays)
    with open(os.path.join(outdir, f"{scenario}-rank{rank}.json"), "w") as f:
        json.dump(info, f)


def rank_data(rank, n=128, seed=0):
    """A small regression problem; every rank gets different samples."""
    rng = np.random.default_rng(1000 + rank)
    x = rng.normal(size=(n, 8)).astype("float32")
    w = np.random.default_rng(seed).normal(size=(8, 1)).astype("float32")
    y = (x @ w + 0.1 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def build_model(keras, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])


def weights_dict(model, prefix="w"):
    return {f"{prefix}{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}


def scenario_train(outdir):
    """The binding with fit(): different initial weights and data per rank,
    BroadcastGlobalVariablesCallback + MetricAverageCallback + LearningRateWarmupCallback."""
    import kdist_magics.keras_horovod as hvd
    import keras
    from kdist_magics.keras_horovod import _optimizer as hvd_optimizer

    hvd.init()
    hvd.init()  # a second init (kdist already initialised Horovod on an engine) is harmless
    rank, size = hvd.rank(), hvd.size()
    x, y = rank_data(rank)
    model = build_model(keras, seed=rank)  # deliberately different per rank
    initial = weights_dict(model, "init")
    base_lr = 0.05
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(base_lr, momentum=0.5))
    model.compile(optimizer=opt, loss="mse", metrics=["mae"])

    record = {"lr_at_batch": [], "raw_logs": [], "avg_logs": []}
    after_broadcast = {}

    class Before(keras.callbacks.Callback):  # sees each rank's own metrics
        def on_epoch_end(self, epoch, logs=None):
            record["raw_logs"].append({k: float(v) for k, v in logs.items()})

    class After(keras.callbacks.Callback):  # sees what later callbacks see
        def on_train_batch_begin(self, batch, logs=None):
            if not after_broadcast:
                after_broadcast.update(weights_dict(self.model, "bcast"))
            record["lr_at_batch"].append(float(np.asarray(self.model.optimizer.learning_rate)))
            if rank == 1:  # rank 1 starts each step 30 ms late: rank 0 waits in the all-reduce
                import time

                time.sleep(0.03)

        def on_epoch_end(self, epoch, logs=None):
            record["avg_logs"].append({k: float(v) for k, v in logs.items()})

    steps, epochs, warmup = 4, 3, 2
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        Before(),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=base_lr, warmup_epochs=warmup),
        After(),
    ]
    history = model.fit(x, y, batch_size=len(x) // steps, epochs=epochs, shuffle=False, callbacks=callbacks, verbose=0)
    record.update(
        rank=rank,
        size=size,
        steps=steps,
        epochs=epochs,
        warmup=warmup,
        base_lr=base_lr,
        history={k: [float(v) for v in vs] for k, vs in history.history.items()},
        iterations=int(np.asarray(opt.iterations)),
        collective=hvd_optimizer.collective_timing(opt),
        opt_class=type(opt).__name__,
        is_sgd=isinstance(opt, keras.optimizers.SGD),
    )
    save(outdir, "train", rank, {**initial, **after_broadcast, **weights_dict(model), "x": x}, record)


def scenario_stock(outdir):
    """Horovod's own horovod.tensorflow.keras.DistributedOptimizer under Keras 3:
    same start, different data. Its ranks are expected to drift apart."""
    import horovod.tensorflow.keras as stock
    import keras

    assert "kdist_magics" not in stock.__name__, stock.__name__
    stock.init()
    rank = stock.rank()
    x, y = rank_data(rank)
    model = build_model(keras, seed=0)  # identical start on every rank
    initial = weights_dict(model, "init")
    opt = stock.DistributedOptimizer(keras.optimizers.SGD(0.05))
    model.compile(optimizer=opt, loss="mse")
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    save(
        outdir,
        "stock",
        rank,
        {**initial, **weights_dict(model)},
        {"rank": rank, "module": stock.__name__, "loss": [float(v) for v in history.history["loss"]]},
    )


def scenario_aggregate(outdir):
    """backward_passes_per_step=2: (a) the exact Horovod update, checked against each
    rank's own gradients; (b) with fp16 compression and no averaging, ranks stay equal."""
    import kdist_magics.keras_horovod as hvd
    import keras
    import tensorflow as tf

    hvd.init()
    rank = hvd.rank()
    x, y = rank_data(rank, n=64)
    model = build_model(keras, seed=0)
    w0 = weights_dict(model, "w0_")
    lr = 0.1
    loss_fn = keras.losses.MeanSquaredError()

    # Each rank's gradient on its two batches, at w0 (no update happens in between).
    per_batch = []
    for b in range(2):
        xb, yb = x[b * 32 : (b + 1) * 32], y[b * 32 : (b + 1) * 32]
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        per_batch.append([g.numpy() for g in tape.gradient(loss, model.trainable_variables)])
    local = [a + b for a, b in zip(*per_batch)]

    # One step (batch 0) from w0 with other options; the test recomputes each update.
    variants = {}
    # op=Sum with explicit groups (list of lists of variables)
    m = build_model(keras, seed=0)
    tv = m.trainable_variables
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr), op=hvd.Sum, groups=[[tv[0], tv[2]], [tv[1]]])
    m.compile(optimizer=opt, loss="mse")
    m.fit(x[:32], y[:32], batch_size=32, epochs=1, shuffle=False, verbose=0)
    variants["sum"] = m
    # Average with gradient_predivide_factor and an integer number of groups
    m = build_model(keras, seed=0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr), gradient_predivide_factor=2.0, groups=2)
    m.compile(optimizer=opt, loss="mse")
    m.fit(x[:32], y[:32], batch_size=32, epochs=1, shuffle=False, verbose=0)
    variants["predivide"] = m
    # A worker-local variable (the last bias): not allreduced, scaled by 1/size
    m = build_model(keras, seed=0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr))
    opt.register_local_var(m.trainable_variables[-1])
    m.compile(optimizer=opt, loss="mse")
    m.fit(x[:32], y[:32], batch_size=32, epochs=1, shuffle=False, verbose=0)
    variants["local"] = m
    # Custom training loops: apply_gradients eagerly, and inside a tf.function
    for name, wrap in (("eager", lambda f: f), ("tffunc", tf.function)):
        m = build_model(keras, seed=0)
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr))

        def step(xb, yb, m=m, opt=opt):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, m(xb, training=True))
            opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))

        wrap(step)(tf.constant(x[:32]), tf.constant(y[:32]))
        variants[name] = m

    opt = hvd.DistributedOptimizer(
        keras.optimizers.SGD(lr), backward_passes_per_step=2, average_aggregated_gradients=True
    )
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    after_two = weights_dict(model, "w2_")
    iterations_two = int(np.asarray(opt.iterations))
    # One more backward pass: accumulated only, weights unchanged.
    model.fit(x[:32], y[:32], batch_size=32, epochs=1, shuffle=False, verbose=0)
    after_three = weights_dict(model, "w3_")

    # Sparse gradients (an Embedding gives tf.IndexedSlices): allgathered by default;
    # densified with sparse_as_dense (required with backward_passes_per_step > 1).
    ids = np.random.default_rng(rank).integers(0, 20, size=(64, 4))
    target = np.random.default_rng(50 + rank).normal(size=(64, 1)).astype("float32")

    def embedding_model():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [
                keras.Input((4,), dtype="int32"),
                keras.layers.Embedding(20, 3),
                keras.layers.Flatten(),
                keras.layers.Dense(1),
            ]
        )

    probe = embedding_model()
    with tf.GradientTape() as tape:
        loss = loss_fn(target[:8], probe(ids[:8]))
    sparse_grad = isinstance(tape.gradient(loss, probe.trainable_variables)[0], tf.IndexedSlices)
    for name, kwargs in (("sparse", {}), ("sparsedense", {"sparse_as_dense": True, "backward_passes_per_step": 2})):
        m = embedding_model()
        m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr), **kwargs), loss="mse")
        m.fit(ids, target, batch_size=16, epochs=1, shuffle=False, verbose=0)
        variants[name] = m

    # (b) fp16 compression, no averaging of aggregated gradients, several syncs.
    model_b = build_model(keras, seed=0)
    opt_b = hvd.DistributedOptimizer(
        keras.optimizers.Adam(0.01), backward_passes_per_step=2, compression=hvd.Compression.fp16
    )
    model_b.compile(optimizer=opt_b, loss="mse")
    hist = model_b.fit(x, y, batch_size=8, epochs=3, shuffle=True, verbose=0)
    save(
        outdir,
        "aggregate",
        rank,
        {
            **w0,
            **after_two,
            **after_three,
            **weights_dict(model_b, "b_"),
            **{f"g{i}": g for i, g in enumerate(local)},
            **{f"first{i}": g for i, g in enumerate(per_batch[0])},
            **weights_dict(probe, "probe"),
            **{k: v for name, mv in variants.items() for k, v in weights_dict(mv, name).items()},
        },
        {
            "rank": rank,
            "size": hvd.size(),
            "lr": lr,
            "iterations_two": iterations_two,
            "sparse_grad": sparse_grad,
            "iterations_b": int(np.asarray(opt_b.iterations)),
            "loss_b": [float(v) for v in hist.history["loss"]],
        },
    )


def scenario_frozen(outdir):
    """BroadcastGlobalVariablesCallback from root rank 1 on a model with no trainable variable
    (every layer frozen, BatchNorm statistics included), once without and once with a local
    variable: Horovod broadcasts every variable, trainable or not."""
    import kdist_magics.keras_horovod as hvd
    import keras

    hvd.init()
    rank = hvd.rank()
    x, y = rank_data(rank)
    arrays, info = {}, {"rank": rank}
    for case in ("all", "local"):
        keras.utils.set_random_seed(100 * rank + (case == "local"))
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(4), keras.layers.BatchNormalization(), keras.layers.Dense(1)]
        )
        model.layers[1].moving_mean.assign(np.full((4,), float(rank + 1), "float32"))
        for layer in model.layers:
            layer.trainable = False
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
        info[f"{case}_trainable"] = len(model.trainable_variables)
        local = [model.layers[0].kernel] if case == "local" else None
        arrays.update(weights_dict(model, f"{case}_init"))
        model.fit(
            x,
            y,
            batch_size=32,
            epochs=1,
            verbose=0,
            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(1, local_variables=local)],
        )
        arrays.update(weights_dict(model, f"{case}_after"))
    save(outdir, "frozen", rank, arrays, info)


def scenario_partial(outdir):
    """PartialDistributedOptimizer reached three ways (the binding, and horovod.keras /
    horovod.tensorflow.keras once installed): one fit step from the same weights on each
    rank's own batch; the test recomputes every update from the gradients saved here."""
    import kdist_magics.keras_horovod as binding
    import keras
    import tensorflow as tf

    binding.install()
    import horovod.keras as hk
    import horovod.tensorflow.keras as htk

    binding.init()
    rank = binding.rank()
    x, y = rank_data(rank, n=32)
    lr = 0.1
    model = build_model(keras, seed=0)
    arrays = weights_dict(model, "w0_")
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, model(x, training=True))
    for i, g in enumerate(tape.gradient(loss, model.trainable_variables)):
        arrays[f"g{i}"] = g.numpy()
    cases = {
        "binding": (binding, {}),
        "keras": (hk, {}),
        "tfkeras": (htk, {}),
        "unscaled": (binding, {"scale_local_gradients": False}),
        "nolocal": (binding, None),
    }
    info = {"rank": rank, "size": binding.size(), "lr": lr, "modules": [hk.__name__, htk.__name__]}
    for name, (module, extra) in cases.items():
        m = build_model(keras, seed=0)
        if extra is None:
            opt = module.PartialDistributedOptimizer(keras.optimizers.SGD(lr))
        else:  # the last Dense layer (kernel and bias) is local
            opt = module.PartialDistributedOptimizer(keras.optimizers.SGD(lr), local_layers=[m.layers[-1]], **extra)
        info[f"{name}_class"] = type(opt).__name__
        m.compile(optimizer=opt, loss="mse")
        m.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        arrays.update(weights_dict(m, f"{name}_"))
    try:
        binding.PartialDistributedOptimizer(keras.optimizers.SGD(lr), local_layers=["dense"])
    except ValueError as exc:
        info["bad_layers"] = str(exc)
    save(outdir, "partial", rank, arrays, info)


def scenario_shrink(outdir):
    """hvd.elastic on 3 ranks: rank 1 kills itself after batch 2 of epoch 1 (its commit
    done); the others restore that commit, re-form as 2 ranks and finish the 3 epochs."""
    import kdist_magics.keras_horovod as hvd
    import keras

    hvd.init()
    first = hvd.rank()
    x, y = rank_data(first, n=64)
    model = build_model(keras, seed=first)  # different on purpose: sync makes them rank 0's
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    resets, commits = [], []
    state.register_reset_callbacks(
        [
            lambda: resets.append(
                {
                    "size": hvd.size(),
                    "rank": hvd.rank(),
                    "epoch": state.epoch,
                    "batch": state.batch,
                    "weights": [w.tolist() for w in model.get_weights()],
                }
            )
        ]
    )

    class Committed(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if (state.epoch, batch) == (1, 2):
                commits.append([w.tolist() for w in model.get_weights()])
                if first == 1 and hvd.size() == 3:
                    os.kill(os.getpid(), 9)

    callbacks = [
        hvd.elastic.CommitStateCallback(state),
        Committed(),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
    ]

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, batch_size=8, epochs=3 - state.epoch, shuffle=False, verbose=0, callbacks=callbacks)

    train(state)
    save(
        outdir,
        "shrink",
        first,
        weights_dict(model),
        {
            "first": first,
            "rank": hvd.rank(),
            "size": hvd.size(),
            "epoch": state.epoch,
            "batch": state.batch,
            "resets": resets,
            "commit": commits[0],
            "iterations": int(model.optimizer.iterations.numpy()),
        },
    )


SCENARIOS = {
    "frozen": scenario_frozen,
    "train": scenario_train,
    "stock": scenario_stock,
    "aggregate": scenario_aggregate,
    "partial": scenario_partial,
    "shrink": scenario_shrink,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](sys.argv[2])
