"""Engines tier: ``%%kdist --strategy horovod --np 2`` on real ipyparallel engines.

One warm 2-engine cluster serves the whole module (tests that must break the
engines come last and leave them restarted); the module fixture stops it and
checks that no process it started is left.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import numpy as np
import pytest

pytest.importorskip(
    "horovod.tensorflow",
    reason="Horovod is not installed here (make test builds it into .venv; the Colab-pinned .venv-colab has none, as Colab has none)",
)
pytest.importorskip("ipyparallel", reason="ipyparallel is a core dependency")

import kdist_magics  # noqa: E402
import kernel_driver  # noqa: E402
from kdist_magics.cluster.compat_psutil import net_connections  # noqa: E402
from conftest import run_cell  # noqa: E402
from kdist_magics.errors import CellFailed, KDistError, RankDied, RankFailed, RunTimedOut  # noqa: E402

pytestmark = [pytest.mark.engines, pytest.mark.horovod, pytest.mark.timeout(300)]


def kdist(ip, line, cell):
    return ip.run_cell_magic("kdist", f"--strategy horovod --np 2 --no-dashboard {line}", cell)


def strategy():
    return kdist_magics._extension._strategies["horovod"]


def engine_values(name):
    return kernel_driver.engine_values(strategy(), name)


def cluster_pids():
    return kernel_driver.engine_pids(strategy())


@pytest.fixture(scope="module")
def hip(shell):
    """The session shell, with the module's engines stopped (and checked gone) at the end."""
    import psutil

    kdist(shell, "", "pass")  # start the module's warm engines (any test may run alone)
    yield shell
    if "horovod" not in kdist_magics._extension._strategies:
        return
    cluster = strategy().cluster
    pids = set(cluster._process_tree_pids()) if cluster is not None else set()
    shell.run_line_magic("kdist", "stop")
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left after %kdist stop: {left}"


# -- ranks, namespaces, threads, sockets -------------------------------------------------
def test_engines_are_ranks_with_warm_namespaces_threads_and_loopback_sockets(hip, capsys):
    import psutil

    kdist(
        hip,
        "",
        "import os\nkd_seen = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())\n"
        "kd_threads = os.environ.get('TF_NUM_INTRAOP_THREADS')\n"
        "kd_preloaded = os.environ.get('KDIST_PRELOADED')\n"
        "import horovod.tensorflow.keras as hk\n"
        "kd_binding = (hvd.__name__, hk is hvd)",
    )
    assert engine_values("kd_seen") == [(0, 2, 0, 2), (1, 2, 1, 2)]
    # under Keras 3, `hvd` and `import horovod.tensorflow.keras` are kdist's binding
    assert engine_values("kd_binding") == [("kdist_magics.keras_horovod", True)] * 2
    cpus = len(os.sched_getaffinity(0))
    assert engine_values("kd_threads") == [str(max(1, cpus // 2))] * 2
    # the engines imported TensorFlow and Horovod as they started (no GPU here), before the
    # controller counted them, and the controller beats their hearts every 0.25 s
    assert engine_values("kd_preloaded") == ["imported tensorflow, horovod.tensorflow"] * 2
    controller = psutil.Process(strategy().cluster.processes()["controller"])
    assert "--HeartMonitor.period=250" in controller.cmdline()
    rec = kdist_magics.last_run()
    assert rec.status == "done" and set(rec.ranks) == {0, 1}
    assert all(r.state == "done" and r.pid in cluster_pids() and r.host for r in rec.ranks.values())
    # namespaces persist between cells with the same N (like %%px); hvd is re-initialised
    pids = cluster_pids()
    kdist(hip, "", "kd_seen2 = (kd_seen[0], hvd.rank(), hvd.size())")
    assert engine_values("kd_seen2") == [(0, 0, 2), (1, 1, 2)]
    assert cluster_pids() == pids
    # every socket a kdist-started cluster listens on is on loopback (with its own network, the
    # default where the host gives one, the controller serves on Unix sockets: no TCP at all)
    listening = []
    for pid in strategy().cluster._process_tree_pids():
        try:
            listening += [
                c.laddr.ip for c in net_connections(psutil.Process(pid), "inet") if c.status == psutil.CONN_LISTEN
            ]
        except psutil.Error:
            pass
    assert all(ip in ("127.0.0.1", "::1") for ip in listening), listening
    assert listening or strategy().cluster.namespace is not None
    # and so does every socket of the ranks while Horovod (Gloo) is initialised and talking
    kdist(
        hip,
        "",
        "import psutil, tensorflow as tf, horovod.tensorflow as hcore\n"
        "from kdist_magics.cluster.compat_psutil import net_connections\n"
        "hcore.allreduce(tf.ones(2))\n"
        "kd_listen = [c.laddr.ip for c in net_connections(psutil.Process(), 'inet')\n"
        "             if c.status == psutil.CONN_LISTEN]\n"
        "kd_peers = [c.raddr.ip for c in net_connections(psutil.Process(), 'inet') if c.raddr]",
    )
    for listen, peers in zip(engine_values("kd_listen"), engine_values("kd_peers")):
        assert all(ip in ("127.0.0.1", "::1") for ip in listen + peers), (listen, peers)


def test_ranks_run_with_earlier_objects_out_of_the_collectors_sight_unless_configured(hip):
    cell = "import gc\nkd_frozen = gc.get_freeze_count()"
    kdist(hip, "", cell)
    # warm engines hold hundreds of thousands of objects; a full collection of them would
    # stall every rank at the next allreduce, so they are frozen for the run...
    assert all(n > 1000 for n in engine_values("kd_frozen")), engine_values("kd_frozen")
    # ...and given back to the collector afterwards (nothing is leaked)
    import gc

    assert strategy().cluster.view().apply_sync(gc.get_freeze_count) == [0, 0]
    hip.run_line_magic("config", "KDist.freeze_gc = False")
    try:
        kdist(hip, "", cell)
        assert engine_values("kd_frozen") == [0, 0]
    finally:
        hip.run_line_magic("config", "KDist.freeze_gc = True")


def test_engines_follow_the_notebooks_working_directory(hip, tmp_path, monkeypatch):
    (tmp_path / "kd_data.txt").write_text("local file")
    monkeypatch.chdir(tmp_path)
    assert kdist(hip, "", "open('kd_data.txt').read()") == "local file"


def test_rich_display_of_rank0_reaches_the_notebook(hip, capsys):
    kdist(hip, "", "from IPython.display import display, Markdown\ndisplay(Markdown(f'**from {hvd.rank()}**'))")
    out = capsys.readouterr().out
    assert "Markdown object" in out and out.count("Markdown object") == 1


def test_output_rank0_by_default_all_prefixed_or_none(hip, capsys):
    cell = "print(f'hello from {hvd.rank()}')"
    kdist(hip, "", cell)
    out = capsys.readouterr().out
    assert "hello from 0" in out and "hello from 1" not in out and out.count("hello from 0") == 1
    kdist(hip, "--out all", cell)
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out
    kdist(hip, "--out none", cell)
    assert "hello from" not in capsys.readouterr().out


def test_last_expression_comes_back_as_a_value(hip):
    value = kdist(hip, "", "{'rank': hvd.rank(), 'squares': [i * i for i in range(4)]}")
    assert value == {"rank": 0, "squares": [0, 1, 4, 9]}


def test_push_and_pull_plain_values_and_clear_errors(hip):
    hip.user_ns["kd_data"] = np.arange(6.0)
    kdist(hip, "--push kd_data --pull kd_total", "kd_total = float(kd_data.sum()) * (hvd.rank() + 1)")
    assert hip.user_ns["kd_total"] == 15.0  # rank 0's value
    with pytest.raises(KDistError, match="kd_missing"):
        kdist(hip, "--pull kd_total,kd_missing", "kd_kept = 1")
    # the engines kept their state
    assert engine_values("kd_total") == [15.0, 30.0] and engine_values("kd_kept") == [1, 1]
    with pytest.raises(KDistError, match="kd_gen.*cannot travel"):
        kdist(hip, "--pull kd_gen", "kd_gen = (i for i in range(3))")
    with pytest.raises(KDistError, match="--push"):
        kdist(hip, "--push kd_not_in_notebook", "pass")
    # functions defined in the notebook travel (as with %px / view.push)
    run_cell(hip, "def kd_double(v):\n    return 2 * v")
    assert kdist(hip, "--push kd_double", "kd_double(hvd.rank() + 21)") == 42


def test_syntax_error_is_reported_once_and_no_engine_runs(hip, capsys):
    kdist(hip, "", "kd_marker = 'before'")
    with pytest.raises(CellFailed) as info:
        kdist(hip, "", "kd_marker = 'after'\nif True print(1)")
    assert isinstance(info.value.original, SyntaxError)
    out = capsys.readouterr()
    assert (out.out + out.err).count("SyntaxError") == 1
    assert engine_values("kd_marker") == ["before", "before"]


# -- correctness of training -------------------------------------------------------------
CUSTOM_LOOP = """
import numpy as np, tensorflow as tf
import horovod.tensorflow as hcore
rng = np.random.default_rng(hvd.rank())          # every rank sees different data
x = rng.normal(size=(64, 4)).astype('float32')
y = x @ np.array([[1.], [-2.], [0.5], [3.]], dtype='float32')
w = tf.Variable(tf.random.normal((4, 1), seed=hvd.rank()))   # and starts from different weights
w.assign(hcore.broadcast(w, root_rank=0))
losses = []
for step in range(30):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((x @ w - y) ** 2)
    grad = hcore.allreduce(tape.gradient(loss, w), op=hcore.Average)
    w.assign_sub(0.1 * grad)
    losses.append(float(loss))
kd_w = w.numpy()
"""


@pytest.mark.quick
def test_custom_loop_on_core_collectives_keeps_ranks_identical(hip):
    kdist(hip, "", CUSTOM_LOOP)
    w0, w1 = engine_values("kd_w")
    np.testing.assert_array_equal(w0, w1)
    l0, l1 = engine_values("losses")
    assert l0[-1] < l0[0] / 10 and l1[-1] < l1[0] / 10


STRAGGLER_CELL = """
import time, numpy as np, keras
class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(SLOW if hvd.rank() == 1 else 0)
x = np.random.default_rng(hvd.rank()).normal(size=(512, 4)).astype('float32')
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss='mse')
model.fit(x, x.sum(1, keepdims=True), batch_size=BATCH, epochs=EPOCHS, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Slow()])
"""


def test_a_slowed_rank_is_marked_as_the_straggler_and_a_balanced_run_has_none(hip, tmp_path, capsys):
    from kdist_magics.watch import stragglers

    # rank 1 spends 80 ms outside every step: rank 0 steps as slowly, waiting in the allreduce
    # (80 ms, not less: on a loaded 2-core host the ranks' compute differs by ~10-20 ms a step,
    # which moves rank 0's wait by as much; rehearsal 28 read a 15 ms wait for a 30 ms sleep)
    hip.user_ns.update(SLOW=0.08, BATCH=8, EPOCHS=1)
    kdist(hip, f"--push SLOW,BATCH,EPOCHS --tensorboard {tmp_path}/tb", STRAGGLER_CELL)
    rec = kdist_magics.last_run()
    assert rec.status == "done"
    assert [s.rank for s in rec.stragglers()] == [1], stragglers.own_times(rec.metrics)
    assert "rank 1: steps" in rec.summary() and "rank 0: steps" not in rec.summary()
    # the all-reduce is timed on both ranks: rank 0's time inside it waiting for rank 1 is the
    # wait, not communication (the least either spent there: rank 1's, which waits for no one)
    split = {row["rank"]: row for row in rec.split()}
    assert all("all-reduce timed on every rank" in row["source"] for row in split.values()), split
    assert split[0]["wait_s"] > 0.04 and split[1]["wait_s"] == 0.0, split
    assert split[0]["communication_s"] == split[1]["communication_s"] < split[0]["wait_s"] / 2, split
    # --tensorboard: the kernel wrote both ranks' rows, as TensorBoard reads them
    assert f"%tensorboard --logdir {tmp_path}/tb" in capsys.readouterr().out
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="TensorBoard (the test extra) reads the files back",
    )
    for r in (0, 1):
        acc = accumulator.EventAccumulator(str(tmp_path / "tb" / f"rank{r}"))
        acc.Reload()
        want = [(row["step"], row["loss"]) for row in rec.metrics if row["rank"] == r and row["kind"] == "step"]
        assert [(e.step, e.value) for e in acc.Scalars("loss")] == [
            (s, pytest.approx(v, rel=1e-6)) for s, v in want
        ] and len(want) >= 3
        assert [e.step for e in acc.Scalars("epoch_loss")] == [64]
    hip.user_ns.update(SLOW=0.0, BATCH=4, EPOCHS=3)
    kdist(hip, "--push SLOW,BATCH,EPOCHS", STRAGGLER_CELL)
    rec = kdist_magics.last_run()
    assert set(stragglers.own_times(rec.metrics)) == {0, 1}  # judged, on both ranks' timings
    assert rec.stragglers() == [] and "steps" not in rec.summary()


# Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py training body as a notebook
# cell. Edits: Keras 3 (keras.* for tf.keras.*, an Input layer, no
# experimental_run_tf_function, .keras checkpoints in CKPT), data from a local .npz,
# and fewer steps/epochs (EPOCHS, STEPS pushed) so it fits a 2-core test machine.
MNIST_CELL = """
import numpy as np
import tensorflow as tf
import keras
import horovod.tensorflow.keras as hvd

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

with np.load(DATA) as d:
    mnist_images, mnist_labels = d['x_train'], d['y_train']

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
     tf.cast(mnist_labels, tf.int64))
)
dataset = dataset.repeat().shuffle(10000).batch(128)

mnist_model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(32, [3, 3], activation='relu'),
    keras.layers.Conv2D(64, [3, 3], activation='relu'),
    keras.layers.MaxPooling2D(pool_size=(2, 2)),
    keras.layers.Dropout(0.25),
    keras.layers.Flatten(),
    keras.layers.Dense(128, activation='relu'),
    keras.layers.Dropout(0.5),
    keras.layers.Dense(10, activation='softmax')
])

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.001 * hvd.size()
opt = keras.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(
    opt, backward_passes_per_step=1, average_aggregated_gradients=True)

mnist_model.compile(loss=keras.losses.SparseCategoricalCrossentropy(),
                    optimizer=opt,
                    metrics=['accuracy'])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: warm the learning rate up over the first epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    callbacks.append(keras.callbacks.ModelCheckpoint(CKPT + '/checkpoint-{epoch}.keras'))

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0

# Train the model.
# Horovod: adjust number of steps based on number of GPUs.
history = mnist_model.fit(dataset, steps_per_epoch=STEPS // hvd.size(), callbacks=callbacks,
                          epochs=EPOCHS, verbose=verbose)
"""


def mnist_like(path):
    """scikit-learn's 8x8 digits upsampled to MNIST's 28x28 uint8, saved like keras' mnist.npz."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3)))  # 24 x 24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
    images = (images * (255.0 / 16.0)).round().astype("uint8")
    labels = digits.target.astype("uint8")
    np.savez(path, x_train=images, y_train=labels, x_test=images[:100], y_test=labels[:100])
    return images, labels


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_horovod_keras_mnist_example_cell(hip, tmp_path, capsys):
    images, labels = mnist_like(tmp_path / "mnist.npz")
    hip.user_ns.update(DATA=str(tmp_path / "mnist.npz"), CKPT=str(tmp_path / "ckpt"), EPOCHS=3, STEPS=16)
    (tmp_path / "ckpt").mkdir()
    live = []

    def listener(kind, payload):
        rec = kdist_magics.last_run()
        # a row counts as live when it arrives while its rank is still running the cell
        if kind == "metric" and rec is not None and rec.ranks[payload["rank"]].state == "running":
            live.append(payload)

    stop = kdist_magics._extension.observe_runs(lambda record: record.subscribe(listener))
    try:
        kdist(hip, "--push DATA,CKPT,EPOCHS,STEPS --pull mnist_model,history", MNIST_CELL)
    finally:
        stop()
    out = capsys.readouterr().out
    assert "Epoch 3/3" in out and out.count("Epoch 1/3") == 1  # rank 0's progress, once
    rec = kdist_magics.last_run()
    assert rec.status == "done"
    # what the run did, in order (the engines were warm: no start-up phase)
    assert [p["name"] for p in rec.phases] == [
        "setting up Horovod (TensorFlow import, hvd.init)",
        "running the cell",
        "training",
        "finishing",
    ]
    # every rank ends with identical weights (a silently drifting binding fails here)
    kdist(hip, "", "kd_weights = [v.numpy() for v in mnist_model.weights]")
    w0, w1 = engine_values("kd_weights")
    assert len(w0) == len(w1) > 0
    for a, b in zip(w0, w1):
        np.testing.assert_array_equal(a, b)
    # the loss falls
    history = hip.user_ns["history"]
    assert len(history.history["loss"]) == 3 and history.history["loss"][-1] < history.history["loss"][0]
    # telemetry rows from both ranks reached the record while the cell ran
    assert {m["rank"] for m in live} == {0, 1}
    epochs = [(m["rank"], m["epoch"]) for m in rec.metrics if m.get("kind") == "epoch"]
    assert sorted(epochs) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]  # none lost, none twice
    # rank 0 wrote its checkpoints
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir())[-1] == "checkpoint-3.keras"
    # the pulled model is a working, compiled Keras model predicting what rank 0 predicts
    import keras

    model = hip.user_ns["mnist_model"]
    assert isinstance(model, keras.Model) and model.optimizer is not None
    probe = (images[:16, ..., None] / 255.0).astype("float32")
    hip.user_ns["PROBE"] = probe
    kdist(hip, "--push PROBE", "kd_pred = mnist_model.predict(PROBE, verbose=0)")
    np.testing.assert_allclose(model.predict(probe, verbose=0), engine_values("kd_pred")[0], rtol=1e-5, atol=1e-6)
    kernel = model.layers[0].get_weights()[0].copy()
    model.fit(probe, labels[:16], epochs=2, verbose=0)  # it keeps training in the notebook
    assert not np.array_equal(kernel, model.layers[0].get_weights()[0])
    # a second cell on the same (warm) engines trains again
    pids = cluster_pids()
    hip.user_ns["EPOCHS"] = 1
    kdist(hip, "--push EPOCHS --pull history", MNIST_CELL)
    assert cluster_pids() == pids and len(hip.user_ns["history"].history["loss"]) == 1
    print(
        f"second cell: engines ready for the cell in {sum(strategy().last_timing.values()):.2f} s",
        file=__import__("sys").stderr,
    )


# -- failures -----------------------------------------------------------------------------
def test_a_rank_raising_names_the_rank_and_stops_the_others(hip):
    pids = cluster_pids()
    with pytest.raises(RankFailed) as info:
        kdist(
            hip,
            "",
            "import time\nkd_progress = 'started'\n"
            "if hvd.rank() == 1:\n    raise ValueError('bad data on one rank')\n"
            "time.sleep(120)",
        )
    err = info.value
    assert set(err.failures) == {1} and err.stopped == [0]
    assert "rank 1" in str(err) and "ValueError" in str(err) and "bad data on one rank" in str(err)
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err._render_traceback_()))
    assert "raise ValueError" in text and "[1:execute]" not in text  # rank 1's own traceback, with its source line
    rec = kdist_magics.last_run()
    assert rec.status == "failed" and rec.ranks[1].state == "failed" and rec.ranks[0].state == "stopped"
    # the next cell works, on the same engines with their state
    kdist(hip, "", "kd_after = kd_progress")
    assert engine_values("kd_after") == ["started", "started"] and cluster_pids() == pids


def test_a_rank_raising_while_the_other_waits_in_a_collective(hip):
    pids = cluster_pids()
    with pytest.raises(RankFailed) as info:
        kdist(
            hip,
            "",
            "import tensorflow as tf, horovod.tensorflow as hcore\n"
            "if hvd.rank() == 1:\n    raise RuntimeError('no data')\n"
            "hcore.allreduce(tf.ones(3))",
        )
    assert set(info.value.failures) == {1} and info.value.stopped == [0]
    assert kdist_magics.last_run().ranks[0].state == "stopped"
    # rank 0 never returns from allreduce by itself and ignores SIGINT there: kdist ends
    # Horovod's collectives (coordinated shutdown) so the same warm engines run the next cell
    assert kdist(hip, "", "hvd.size()") == 2
    assert cluster_pids() == pids


GIVES_UP_IN_FIT = """
import keras, numpy as np
X = np.random.default_rng(0).normal(size=(256, 8)).astype('float32')
class GiveUp(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 1 and epoch == 1:
            raise RuntimeError('rank 1 gave up')
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss='mse')
model.fit(X, X.sum(1), batch_size=8, epochs=50, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), GiveUp()])
"""


def test_a_rank_failing_mid_fit_releases_the_other_from_its_compiled_step(hip):
    pids = cluster_pids()
    with pytest.raises(RankFailed) as info:
        kdist(hip, "", GIVES_UP_IN_FIT)
    assert set(info.value.failures) == {1} and "rank 1 gave up" in str(info.value)
    # rank 0 waited in the gradient allreduce inside Keras' compiled train step; the
    # coordinated Horovod shutdown released it, so the engines (and rank 0's model) survive
    assert strategy().needs_restart is None
    assert kdist(hip, "", "(hvd.size(), 'model' in globals())") == (2, True)
    assert cluster_pids() == pids


def test_helpers_run_below_the_ranks_and_the_cell_at_normal_priority(hip):
    import psutil

    kdist(
        hip,
        "",
        "import os, threading\n"
        "kd_nice = {t.name: os.getpriority(os.PRIO_PROCESS, t.native_id)"
        " for t in threading.enumerate()}\n"
        "kd_main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())",
    )
    me = os.getpriority(os.PRIO_PROCESS, 0)
    for nice, main in zip(engine_values("kd_nice"), engine_values("kd_main")):
        assert main == me  # the cell, and the framework's threads it starts, keep the priority
        assert nice["IOPub"] == min(19, me + 10) and nice["Control"] == min(19, me + 10), nice
    cluster = strategy().cluster
    engines = set(cluster_pids())
    helpers = [p for p in cluster._process_tree_pids() if p not in engines]
    controller = [
        psutil.Process(p) for p in helpers if "ipyparallel.controller" in " ".join(psutil.Process(p).cmdline())
    ]
    assert controller and all(p.nice() == min(19, me + 10) for p in controller)


def test_kdist_start_warms_engines_in_the_background_for_the_first_cell(hip, capsys):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="runs in the notebook's own kernel"):
        hip.run_line_magic("kdist", "start --strategy mirrored")
    hip.run_line_magic("kdist", "stop")
    capsys.readouterr()
    hip.run_line_magic("kdist", "start --strategy horovod --np 2")
    out = capsys.readouterr().out
    assert "starting 2 horovod engines in the background and importing tensorflow, horovod.tensorflow there" in out
    warming = strategy().warming
    assert warming is not None and warming.busy  # the line magic returned at once
    hip.run_line_magic("kdist", "status")
    assert "warming 2 engines" in capsys.readouterr().out
    assert warming.wait(240) and warming.error is None, warming.error
    hip.run_line_magic("kdist", "status")
    assert "2 engines warmed by %kdist start in" in capsys.readouterr().out
    # the engines hold the framework already, imported after kdist's thread variables
    strategy().cluster.view().execute(
        "import os, sys\nkd_warm = ('tensorflow' in sys.modules, 'horovod.tensorflow' in sys.modules,"
        " os.environ.get('TF_NUM_INTRAOP_THREADS'))",
        block=True,
    )
    cpus = len(os.sched_getaffinity(0))
    assert engine_values("kd_warm") == [(True, True, str(max(1, cpus // 2)))] * 2
    pids = cluster_pids()
    kdist(hip, "", "kd_r = hvd.rank()")
    out = capsys.readouterr().out
    assert "using the 2 engines %kdist start warmed" in out and "starting 2 engines" not in out
    assert cluster_pids() == pids and engine_values("kd_r") == [0, 1]
    phases = [p["name"] for p in kdist_magics.last_run().phases]
    assert phases[0].startswith("setting up Horovod"), phases  # no engines to start
    assert strategy().warming is None


def test_timeout_reports_busy_ranks_and_leaves_engines_usable(hip):
    pids = cluster_pids()
    with pytest.raises(RunTimedOut) as info:
        kdist(hip, "--timeout 3", "import time\nkd_t = 'in'\ntime.sleep(600 if hvd.rank() == 0 else 0)")
    assert info.value.busy == [0]
    rec = kdist_magics.last_run()
    assert rec.status == "timeout" and rec.ranks[0].state == "stopped" and rec.ranks[1].state == "done"
    assert kdist(hip, "", "kd_t") == "in" and cluster_pids() == pids


def test_interrupt_stops_all_ranks_and_keeps_the_checkpoint(hip, tmp_path):
    hip.user_ns["X"] = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    cell = (
        "import keras, numpy as np\n"
        "model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])\n"
        "model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss='mse')\n"
        "model.fit(X, X.sum(1), batch_size=8, epochs=10000, verbose=0,\n"
        "          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])\n"
    )
    stop = threading.Event()

    def interrupt_after_two_epochs():
        while not stop.is_set():
            rec = kdist_magics.last_run()
            if (
                rec is not None
                and rec.status == "running"
                and sum(1 for m in list(rec.metrics) if m.get("kind") == "epoch" and m["rank"] == 0) >= 2
            ):
                os.kill(os.getpid(), signal.SIGINT)  # what the notebook's Stop button does
                return
            time.sleep(0.1)

    t = threading.Thread(target=interrupt_after_two_epochs, daemon=True)
    ext = kdist_magics._extension
    grace, ext.stop_grace = ext.stop_grace, 30.0  # a loaded test machine may be slow to stop
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            kdist(hip, f"--push X --checkpoint {tmp_path}", cell)
    finally:
        ext.stop_grace = grace
        stop.set()
        t.join()
    assert strategy().needs_restart is None  # every rank stopped by itself: engines stay warm
    rec = kdist_magics.last_run()
    assert rec.status == "interrupted"
    assert all(r.state == "stopped" for r in rec.ranks.values())
    assert [m for m in rec.metrics if m.get("kind") == "epoch"]  # the history so far is kept
    assert (tmp_path / "last.keras").exists()  # rank 0's last epoch checkpoint
    import keras

    assert keras.saving.load_model(tmp_path / "last.keras").count_params() == 9
    # the next cell works, and rank 0 still has the model and its history so far
    assert kdist(hip, "--pull model", "len(model.history.history['loss'])") >= 2
    assert isinstance(hip.user_ns["model"], keras.Model)


def test_a_dying_rank_is_reported_with_its_exit_status_and_engines_restart(hip):
    old = cluster_pids()
    with pytest.raises(RankDied) as info:
        kdist(hip, "", "import os, time\nif hvd.rank() == 1:\n    os._exit(3)\ntime.sleep(120)")
    assert info.value.deaths == {1: "exited with status 3"}
    rec = kdist_magics.last_run()
    assert rec.status == "failed" and rec.ranks[1].state == "failed" and "status 3" in rec.ranks[1].error
    assert kdist(hip, "", "(hvd.rank(), hvd.size())") == (0, 2)  # restarted automatically
    assert not cluster_pids() & old
    phases = kdist_magics.last_run().phases  # the restart is the run's first phase, counted
    assert [p["name"] for p in phases] == [
        "starting 2 engines",
        "setting up Horovod (TensorFlow import, hvd.init)",
        "running the cell",
        "finishing",
    ]
    assert phases[0]["detail"] == "2 of 2 registered"


FROZEN_CELL = """
import os, signal, time, numpy as np
hvd.allreduce(np.ones(4, "float32"))  # both ranks are in the job
if hvd.rank() == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen, as a debugger or a stuck node leaves it
for _ in range(1000):
    hvd.allreduce(np.ones(4, "float32"))  # rank 0 waits here for ever
time.sleep(300)
"""


def test_a_frozen_rank_is_ended_after_ten_seconds_and_named(hip):
    """No --timeout: a stopped engine would hang the run for ever; kdist ends it."""
    from kdist_magics.cluster.cluster import FROZEN_AFTER

    old = cluster_pids()
    t0 = time.monotonic()
    with pytest.raises(RankDied) as info:
        kdist(hip, "", FROZEN_CELL)
    took = time.monotonic() - t0
    assert info.value.deaths == {
        1: f"was stopped (SIGSTOP) for {FROZEN_AFTER:.0f} s while its peers waited for it; kdist ended it"
    }
    assert FROZEN_AFTER <= took < FROZEN_AFTER + 50  # bounded, not for ever
    assert kdist(hip, "", "(hvd.rank(), hvd.size())") == (0, 2)  # the next cell works
    assert not cluster_pids() & old


def test_the_controller_killed_mid_run_ends_the_run_and_the_next_cell_starts_a_new_cluster(hip):
    import psutil

    from kdist_magics.errors import ControllerDied

    cluster = strategy().cluster
    old = set(cluster._process_tree_pids())
    controller = cluster.cluster.controller.pid

    def kill_controller():
        time.sleep(4)  # the cell is running on both ranks
        os.kill(controller, signal.SIGKILL)

    threading.Thread(target=kill_controller, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(ControllerDied) as info:
        kdist(hip, "", "import time\nfor _ in range(600):\n    time.sleep(0.1)")
    assert "was killed by SIGKILL" in str(info.value) and time.monotonic() - t0 < 60
    rec = kdist_magics.last_run()
    assert rec.status == "failed" and all(r.state == "failed" for r in rec.ranks.values())
    assert kdist(hip, "", "(hvd.rank(), hvd.size())") == (0, 2)  # a new cluster
    time.sleep(2)
    left = [p for p in old if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"the old cluster's processes are still there: {left}"


def test_a_framework_import_failing_on_one_engine_is_named_at_once_and_the_next_cell_works(hip):
    """hvd.init() fails on rank 1 (its import breaks); rank 0 waits for it in the rendezvous:
    the error comes as soon as rank 1 fails, not at the set-up's 120 s bound."""
    cl = strategy().cluster
    cl.client[cl.engines[1].engine_id].execute("import sys\nsys.modules['horovod.tensorflow'] = None", block=True)
    t0 = time.monotonic()
    with pytest.raises(KDistError) as info:
        kdist(hip, "", "pass")
    message = str(info.value)
    assert "hvd.init() failed: rank 1: ModuleNotFoundError" in message, message
    assert "(rank 0 left waiting for it)" in message
    assert time.monotonic() - t0 < 60
    assert kdist(hip, "", "(hvd.rank(), hvd.size())") == (0, 2)  # fresh engines


@pytest.mark.timeout(300)
def test_attach_to_a_cluster_the_user_started_and_never_stop_it(hip):
    import ipyparallel as ipp
    import psutil

    theirs = ipp.Cluster(n=2, cluster_id=f"users-{os.getpid()}", controller_ip="127.0.0.1", log_level=40)
    theirs.start_cluster_sync()
    try:
        client = theirs.connect_client_sync()
        client.wait_for_engines(2, timeout=120, interactive=False)
        their_pids = set(client[:].apply_sync(os.getpid))
        client.close()
        line = f"--cluster-id {theirs.cluster_id}"
        assert kdist(hip, line, "(hvd.rank(), hvd.size())") == (0, 2)
        assert cluster_pids() == their_pids and not strategy().cluster.owned
        kdist(hip, line, "kd_attached = hvd.rank()")
        assert engine_values("kd_attached") == [0, 1]
        hip.run_line_magic("kdist", "stop")
        assert all(psutil.pid_exists(p) for p in their_pids)  # kdist never stops their engines
    finally:
        theirs.stop_cluster_sync()
    kdist(hip, "", "pass")  # the module's own engines again, for whatever runs next


KERNEL_EXITS = """
import json, kdist_magics
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "kdist_magics")
value = ip.run_cell_magic("kdist", "--strategy horovod --np 2 --no-dashboard", "hvd.size()")
cluster = kdist_magics._extension._strategies["horovod"].cluster
print(json.dumps({"value": value, "pids": cluster._process_tree_pids()}), flush=True)
# the kernel ends here without %kdist stop
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kernel_exit_leaves_no_engine_processes(tmp_path):
    import json
    import subprocess
    import sys

    import psutil

    out = subprocess.run(
        [sys.executable, "-c", KERNEL_EXITS],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "IPYTHONDIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["value"] == 2 and len(facts["pids"]) >= 3  # controller, 2 engines (+ nannies)
    left = [p for p in facts["pids"] if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"still running after the kernel exited: {left}"


def test_an_attached_clusters_engines_with_different_pasts_train_together(shell):
    """A model on both engines of an attached cluster, a second one on one engine, then on
    both: the engine that trained alone has named more layers (Keras' counters) and kept
    Horovod's broadcast traced with the second model's variables under its names then
    (``sequential_1/...``), and Horovod, which matches the ranks' collectives by name, waited
    for ever (``%kdist scale`` of a second model on a cluster the user started did). kdist
    clears every rank's session when the counters differ (strategies/horovod/strategy.py) and
    forgets Horovod's kept traces at each init (compat_horovod); the run trains, in sync."""
    import ipyparallel as ipp

    theirs = ipp.Cluster(n=2, cluster_id="kd-pasts", controller_ip="127.0.0.1", log_level=40)
    theirs.start_cluster_sync()
    first = """
import numpy as np, keras
x = np.random.default_rng(hvd.rank()).normal(size=(128, 8)).astype("float32"); y = x[:, :1]
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
model.fit(x, y, batch_size=16, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""
    cell = first.replace("Dense(4)", "Dense(8)") + "kd_weights = [w.tolist() for w in model.get_weights()]\n"
    try:
        for n, code in ((2, first), (1, cell), (2, cell)):
            shell.run_cell_magic(
                "kdist", f"--strategy horovod --np {n} --no-dashboard --timeout 90 --cluster-id kd-pasts", code
            )
        weights = theirs.connect_client_sync()[:].pull("kd_weights", block=True)
        assert weights[0] == weights[1]
    finally:
        shell.run_line_magic("kdist", "stop")
        theirs.stop_cluster_sync()
