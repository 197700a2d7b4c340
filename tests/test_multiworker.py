"""``%%kdist --strategy multiworker``: MultiWorkerMirroredStrategy on ipyparallel engines.

Fast tier: rank grouping by host and TF_CONFIG address selection (no engines).
Engines tier: one warm 2-engine cluster for the module (tests that must break
the engines come last), plus a cluster the test starts itself and kdist
attaches to with ``--cluster-id`` and must not stop.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import numpy as np
import pytest

import kdist_magics
import kernel_driver
from kdist_magics.errors import KDistError, RankFailed, RunTimedOut
from kdist_magics.cluster.network import engine_address, ephemeral_range, free_port, free_ports, join
from kdist_magics.cluster.placement import host_grouped_ranks

TRAIN = """
import os, numpy as np, keras
from kdist_magics.strategies.multiworker import keras_mwms
kd_tf_config = os.environ["TF_CONFIG"]
rng = np.random.default_rng(0)
x = rng.normal(size=(128, 4)).astype("float32")
y = (x @ np.array([1., -2., .5, 3.], dtype="float32"))[:, None]
keras.utils.set_random_seed(10 + strategy.cluster_resolver.task_id)   # different initial weights
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
kd_fix_during = keras_mwms.active()
history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
kd_weights = [w.tolist() for w in model.get_weights()]
kd_loss = history.history["loss"]
"""


# -- fast tier ------------------------------------------------------------------------
def test_ranks_group_engines_by_host_in_order_of_first_appearance():
    assert host_grouped_ranks(["a", "a"]) == [0, 1]
    assert host_grouped_ranks(["b", "a", "b", "a"]) == [0, 2, 1, 3]
    assert host_grouped_ranks(["h1", "h2", "h3"]) == [0, 1, 2]


def test_worker_addresses_by_mode():
    import psutil

    assert engine_address("loopback") == "127.0.0.1"
    lo = next(n for n, addrs in psutil.net_if_addrs().items() if any(a.address == "127.0.0.1" for a in addrs))
    assert engine_address(lo) == "127.0.0.1"  # an interface name
    assert engine_address("127.0.0.0/8") == "127.0.0.1"  # a network
    assert engine_address("127.0.0.1") == "127.0.0.1"  # an address to route towards
    with pytest.raises(LookupError, match="not an interface"):
        engine_address("no-such-iface0")
    import ipaddress

    mine = [
        ipaddress.ip_address(a.address.split("%")[0])
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family.name in ("AF_INET", "AF_INET6")
    ]
    absent = next(
        n
        for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")  # TEST-NETs
        if not any(m in ipaddress.ip_network(n) for m in mine)
    )
    with pytest.raises(LookupError, match="no address in"):
        engine_address(absent)
    port = free_port("127.0.0.1")
    assert 0 < port < 65536
    ports = free_ports(3)  # distinct, and free again once returned (a worker can bind each)
    assert len(set(ports)) == 3
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
    # below the range outgoing connections take their source ports from, so nothing but an
    # explicit bind can take one before the worker listens ("Could not start gRPC server")
    low, high = ephemeral_range()
    assert all(p < low for p in ports) and low <= high
    assert join("10.0.0.1", 5) == "10.0.0.1:5" and join("fe80::1", 5) == "[fe80::1]:5"


def test_two_engines_on_one_host_drawing_one_port_get_distinct_tf_config_addresses():
    from types import SimpleNamespace

    from kdist_magics.strategies.multiworker.tf_workers import MultiWorkerStrategy

    draws = {0: [5001], 1: [5001, 5001, 5002]}  # engine 1 draws engine 0's port twice

    class Done:
        def __init__(self, value):
            self.value = value

        def wait(self, timeout=None):
            pass

        def ready(self):
            return True

        def get(self, timeout=None):
            return self.value

    def view(engine_id):
        def apply_async(fn, mode):
            return Done(
                {
                    "host": "h",
                    "tf_config": None,
                    "tf_started": False,
                    "address": "127.0.0.1",
                    "port": draws[engine_id].pop(0),
                }
            )

        return SimpleNamespace(apply_async=apply_async)

    cluster = SimpleNamespace(
        loopback=True,
        owned=True,
        client={0: view(0), 1: view(1)},
        engines=[SimpleNamespace(engine_id=i, hostname="h") for i in (0, 1)],
    )
    ranks, configs = MultiWorkerStrategy()._plan(cluster, SimpleNamespace(options=None))
    assert ranks == [0, 1] and not draws[1]
    assert json.loads(configs[0])["cluster"]["worker"] == ["127.0.0.1:5001", "127.0.0.1:5002"]


def test_multiworker_is_registered_and_imports_without_tensorflow():
    from kdist_magics.strategies import REGISTRY

    assert REGISTRY["multiworker"] == ".multiworker.tf_workers:for_backend"  # TF or JAX, by the Keras backend
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, kdist_magics.strategies.multiworker.tf_workers, kdist_magics.strategies.multiworker.keras_mwms\n"
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


# -- engines tier -----------------------------------------------------------------------
def kdist(ip, line, cell):
    return ip.run_cell_magic("kdist", f"--strategy multiworker --np 2 --no-dashboard {line}", cell)


def strategy():
    return kdist_magics._extension._strategies["multiworker"]


def engine_values(name, s=None):
    return kernel_driver.engine_values(s or strategy(), name)


def pids(s=None):
    return kernel_driver.engine_pids(s or strategy())


@pytest.fixture(scope="module")
def mip(shell):
    """The session shell; the module's engines are stopped (and checked gone) at the end."""
    import psutil

    yield shell
    if "multiworker" not in kdist_magics._extension._strategies:
        return
    cluster = strategy().cluster
    started = set(cluster._process_tree_pids()) if cluster is not None else set()
    shell.run_line_magic("kdist", "stop")
    left = [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left after %kdist stop: {left}"


@pytest.mark.quick
@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fit_gives_identical_weights_on_both_workers_and_pulls_the_model(mip, capsys):
    kdist(mip, "--pull model,history", TRAIN)
    weights = engine_values("kd_weights")
    for wa, wb in zip(*weights):  # seeded differently, trained as one model
        np.testing.assert_array_equal(np.array(wa), np.array(wb))
    loss0, loss1 = engine_values("kd_loss")
    assert loss0 == loss1 and loss0[-1] < loss0[0] / 2, loss0
    assert engine_values("kd_fix_during") == [True, True]
    rec = kdist_magics.last_run()
    assert rec.status == "done" and {r.state for r in rec.ranks.values()} == {"done"}
    # --pull brought rank 0's model and history into the notebook
    model, history = mip.user_ns["model"], mip.user_ns["history"]
    for got, want in zip(model.get_weights(), weights[0]):
        np.testing.assert_allclose(got, np.array(want))
    assert history.history["loss"] == loss0
    # TF_CONFIG: worker index = rank, loopback ports, one per engine
    configs = [json.loads(c) for c in engine_values("kd_tf_config")]
    workers = configs[0]["cluster"]["worker"]
    assert len(set(workers)) == 2 and all(w.startswith("127.0.0.1:") for w in workers)
    assert configs[1]["cluster"]["worker"] == workers
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    out = capsys.readouterr()
    assert "restarting" not in out.out + out.err
    assert "INFO:tensorflow" not in out.out + out.err  # MWMS's per-collective chatter is muted


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_push_out_all_and_checkpoint_on_both_workers(mip, capsys, tmp_path):
    """--push, --out all and --checkpoint mean under multiworker what they mean under horovod
    (kdist_magics.strategies.capabilities): every worker gets the value, every worker's output shows
    prefixed, rank 0 saves after every epoch."""
    import keras

    mip.user_ns["kd_in"] = np.arange(4.0)
    capsys.readouterr()
    kdist(
        mip,
        f"--push kd_in --out all --checkpoint {tmp_path}",
        TRAIN
        + """
kd_got = float(kd_in.sum())
print("worker", strategy.cluster_resolver.task_id, "saw", kd_got)
""",
    )
    assert engine_values("kd_got") == [6.0, 6.0]
    printed = capsys.readouterr()
    out = printed.out
    assert "[rank 0] worker 0 saw 6.0" in out and "[rank 1] worker 1 saw 6.0" in out, out
    # the engines run with TensorFlow's C++ INFO lines off, or as the kernel's environment says
    # (ipykernel forwards an engine's stderr into the cell: --out all showed every rank's copy)
    import os

    kdist(mip, "", "import os\nkd_cpp = os.environ.get('TF_CPP_MIN_LOG_LEVEL')")
    assert engine_values("kd_cpp") == [os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1")] * 2
    saved = keras.saving.load_model(tmp_path / "last.keras").get_weights()
    for got, want in zip(saved, engine_values("kd_weights")[0]):
        np.testing.assert_allclose(got, np.array(want))


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_warm_engines_keep_the_strategy_bound_and_the_fix_only_inside_runs(mip):
    before = pids()
    kdist(
        mip,
        "",
        "import os, tensorflow as tf\n"
        "kd_seen = (strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync,\n"
        "           tf.distribute.get_strategy() is strategy, os.environ['TF_CONFIG'])",
    )
    seen = engine_values("kd_seen")
    assert [s[:3] for s in seen] == [(0, 2, True), (1, 2, True)]
    assert [json.loads(s[3])["task"]["index"] for s in seen] == [0, 1]
    assert pids() == before  # same processes: the strategy was reused, not rebuilt
    # outside a kdist run: no scope, Keras unpatched, `strategy` still bound
    view = strategy().cluster.view()
    view.execute(
        "import tensorflow as tf\nfrom kdist_magics.strategies.multiworker import keras_mwms\n"
        "kd_after = (keras_mwms.active(), tf.distribute.has_strategy(), "
        "type(strategy).__name__)",
        block=True,
    )
    assert engine_values("kd_after") == [(False, False, "CollectiveAllReduceStrategy")] * 2
    value = kdist(mip, "", "strategy.cluster_resolver.task_id * 10 + 7")
    assert value == 7  # the last expression's value, from rank 0


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tensorflows_multi_worker_tutorial_runs_unchanged_as_a_cell(mip, tmp_path, monkeypatch, capsys):
    """TensorFlow's tutorial worker code (tests/test_launcher_code.py lists what differs): its
    own MultiWorkerMirroredStrategy() is the run's, chief-only saving works."""
    from test_launcher_code import MNIST_SETUP, tf_tutorial

    (tmp_path / "mnist_setup.py").write_text(MNIST_SETUP)
    monkeypatch.chdir(tmp_path)  # the notebook's folder, where the tutorial writes mnist_setup.py
    kdist(mip, "", tf_tutorial(str(tmp_path / "keras-model.keras")))
    before = pids()
    kdist(
        mip,
        "",
        "import tensorflow as tf\n"
        "kd_w = [w.tolist() for w in multi_worker_model.get_weights()]\n"
        "kd_loss = multi_worker_model.history.history['loss']\n"
        "kd_same = (strategy is tf.distribute.get_strategy(), task_id)\n"
        "del multi_worker_model, multi_worker_dataset",
    )
    assert pids() == before  # the same workers go on: no restart for the tutorial's own strategy
    out = capsys.readouterr()
    assert "restarting" not in out.out + out.err and "Mixing different" not in out.out + out.err
    weights = engine_values("kd_w")
    for wa, wb in zip(*weights):
        np.testing.assert_array_equal(np.array(wa), np.array(wb))
    loss0, loss1 = engine_values("kd_loss")
    assert loss0 == loss1 and loss0[-1] < loss0[0], loss0
    assert engine_values("kd_same") == [(True, 0), (True, 1)]
    # chief-only saving: worker 0 wrote the model, worker 1 wrote to its temp folder and removed it
    assert (tmp_path / "keras-model.keras").is_file() and not (tmp_path / "workertemp_1").exists()
    import keras

    saved = keras.models.load_model(tmp_path / "keras-model.keras")
    for got, want in zip(saved.get_weights(), weights[0]):
        np.testing.assert_allclose(got, np.array(want))
    # the tutorial's main.py as a script: %kdist run, its folder on sys.path (import mnist_setup)
    (tmp_path / "main.py").write_text(tf_tutorial(str(tmp_path / "again.keras")))
    mip.run_line_magic("kdist", f"run --strategy multiworker --np 2 --no-dashboard {tmp_path / 'main.py'}")
    kdist(
        mip,
        "",
        "kd_w = [w.tolist() for w in multi_worker_model.get_weights()]\n"
        "kd_loss = multi_worker_model.history.history['loss']\n"
        "del multi_worker_model, multi_worker_dataset",
    )
    for wa, wb in zip(*engine_values("kd_w")):
        np.testing.assert_array_equal(np.array(wa), np.array(wb))
    loss0, loss1 = engine_values("kd_loss")
    assert loss0 == loss1 and loss0[-1] < loss0[0], loss0
    assert (tmp_path / "again.keras").is_file() and pids() == before
    view = strategy().cluster.view()  # after the cell, TensorFlow's class constructs as usual
    view.execute(
        "import tensorflow as tf\nkd_class = (tf.distribute.MultiWorkerMirroredStrategy."
        "__init__.__qualname__, tf.distribute.has_strategy())",
        block=True,
    )
    assert engine_values("kd_class") == [("CollectiveAllReduceStrategy.__init__", False)] * 2


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_contradicting_cluster_resolver_is_one_line_naming_np(mip):
    with pytest.raises(RankFailed) as info:
        kdist(
            mip,
            "",
            "import json, tensorflow as tf\n"
            "spec = tf.train.ClusterSpec({'worker': ['a:1', 'b:1', 'c:1']})\n"
            "resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(\n"
            "    spec, task_type='worker', task_id=strategy.cluster_resolver.task_id)\n"
            "tf.distribute.experimental.MultiWorkerMirroredStrategy(cluster_resolver=resolver)",
        )
    text = str(info.value)
    assert "LauncherMismatch" in text and "3 workers" in text and "give --np 3" in text, text


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_error_on_one_worker_is_reported_against_it_and_the_engines_stay_warm(mip):
    before = pids()
    with pytest.raises(RankFailed) as info:
        kdist(
            mip,
            "",
            "if strategy.cluster_resolver.task_id == 1:\n"
            "    raise ValueError('bad shard on this worker')\nkd_ok = True",
        )
    err = info.value
    assert set(err.failures) == {1} and "rank 1: ValueError: bad shard on this worker" in str(err)
    rec = kdist_magics.last_run()
    assert rec.ranks[1].state == "failed" and "bad shard" in rec.ranks[1].error
    assert rec.ranks[0].state == "done"
    # nothing was in flight, so the next run reuses the same engines and strategy
    kdist(mip, "", TRAIN)
    assert pids() == before
    a, b = engine_values("kd_weights")
    for wa, wb in zip(a, b):
        np.testing.assert_array_equal(np.array(wa), np.array(wb))


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_failing_mid_training_restarts_the_engines_before_the_next_run(mip, capsys):
    before = pids()
    with pytest.raises(RankFailed) as info:
        kdist(
            mip,
            "",
            TRAIN.replace(
                "history = model.fit",
                "if strategy.cluster_resolver.task_id == 1:\n"
                "    raise RuntimeError('worker 1 gave up')\n"
                "history = model.fit",
            ),
        )
    assert set(info.value.failures) == {1} and info.value.stopped == [0]
    assert kdist_magics.last_run().ranks[0].state == "stopped"  # it was waiting in a collective
    assert strategy().status().get("restart")
    capsys.readouterr()
    kdist(mip, "", TRAIN)
    assert "restarting the engines" in capsys.readouterr().out
    assert not (pids() & before)
    a, b = engine_values("kd_weights")
    for wa, wb in zip(a, b):
        np.testing.assert_array_equal(np.array(wa), np.array(wb))


@pytest.mark.kernel
def test_only_the_chief_writes_a_backup_and_restore_backup(tmp_path):
    """compat_backup: a worker that is not the chief neither writes nor removes the backup
    (Keras 3's callback would have every worker write the same files); uninstalled, Keras' own
    behaviour is back."""
    keras = pytest.importorskip("keras")
    from kdist_magics.strategies.multiworker import compat_backup

    x, y = np.ones((8, 2), "float32"), np.zeros((8, 1), "float32")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")

    def fit(folder):
        model.fit(
            x,
            y,
            epochs=2,
            verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(str(folder), delete_checkpoint=False)],
        )

    assert compat_backup.install(chief=False)
    try:
        fit(tmp_path / "worker1")
        assert not (tmp_path / "worker1").exists()
        assert compat_backup.install(chief=True)  # the next run on the chief
        fit(tmp_path / "chief")
        assert (tmp_path / "chief" / "latest.weights.h5").is_file()
    finally:
        compat_backup.uninstall()
    fit(tmp_path / "after")
    assert (tmp_path / "after" / "latest.weights.h5").is_file()


#: the fault: worker 1 ends (as a killed process does) once the second epoch's backup is written
DIE_AFTER_EPOCH_2 = """import os, json
class KdDie(tf.keras.callbacks.Callback):
  def on_epoch_end(self, epoch, logs=None):
    if strategy.cluster_resolver.task_id == 0:
      with open(os.path.join(BACKUP_DIR, "..", "first-run.json"), "a") as f:
        f.write(json.dumps([epoch, float(logs["loss"])]) + "\\n")
    elif epoch == 1:
      os._exit(3)
kd_callback = KdDie()"""
#: the run again: which epochs it trains, and with what loss
EPOCHS = """class KdEpochs(tf.keras.callbacks.Callback):
  def on_train_begin(self, logs=None):
    self.seen = []
  def on_epoch_end(self, epoch, logs=None):
    self.seen.append((epoch, float(logs["loss"])))
kd_callback = KdEpochs()"""


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_backup_and_restore_resumes_the_tutorials_training_after_a_worker_died(mip, tmp_path, monkeypatch):
    """TensorFlow's tutorial, section "Fault tolerance": worker 1 dies after the second epoch's
    backup; the cell run again (on restarted engines) trains the third epoch only, from the
    backup, and both workers end with identical weights."""
    from kdist_magics.errors import RankDied
    from test_launcher_code import MNIST_SETUP, tf_tutorial_backup

    (tmp_path / "mnist_setup.py").write_text(MNIST_SETUP)
    monkeypatch.chdir(tmp_path)
    backup = tmp_path / "backup"
    backup.mkdir()
    with pytest.raises(RankDied) as info:
        kdist(mip, "", tf_tutorial_backup(str(backup), DIE_AFTER_EPOCH_2.replace("BACKUP_DIR", repr(str(backup)))))
    assert "rank 1" in str(info.value)
    first = [json.loads(line) for line in (tmp_path / "first-run.json").read_text().splitlines()]
    assert [epoch for epoch, _ in first][:2] == [0, 1], first
    kdist(
        mip,
        "",
        tf_tutorial_backup(str(backup), EPOCHS) + "\nkd_seen = kd_callback.seen\n"
        "kd_w = [w.tolist() for w in multi_worker_model.get_weights()]",
    )
    seen = engine_values("kd_seen")
    assert [[epoch for epoch, _ in s] for s in seen] == [[2], [2]], seen  # resumed at the third
    assert seen[0][0][1] < first[0][1], (seen, first)  # from the trained weights, not new ones
    for wa, wb in zip(*engine_values("kd_w")):
        np.testing.assert_array_equal(np.array(wa), np.array(wb))
    assert not backup.exists()  # the chief removed its backup once fit had finished


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_timeout_stops_every_worker_and_the_next_run_restarts_the_engines(mip, capsys):
    kdist(mip, "", "kd_warm = True")  # engines up before the clock starts
    before = pids()
    with pytest.raises(RunTimedOut) as info:
        kdist(mip, "--timeout 5", TRAIN.replace("epochs=3", "epochs=100000"))
    assert info.value.busy == [0, 1]
    rec = kdist_magics.last_run()
    assert rec.status == "timeout" and {r.state for r in rec.ranks.values()} == {"stopped"}
    capsys.readouterr()
    kdist(mip, "", "kd_task = strategy.cluster_resolver.task_id")
    # ranks stuck in a collective ignore SIGINT and are killed; either way: fresh engines
    assert "restarting the engines" in capsys.readouterr().out
    assert not (pids() & before) and engine_values("kd_task") == [0, 1]


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_engines_where_tensorflow_already_started_are_restarted_and_kdist_says_why(mip, capsys):
    kdist(mip, "", "kd_x = 1")
    view = strategy().cluster.view()
    # an engine whose TensorFlow started outside kdist's strategy (simulated: forget it)
    view.execute(
        "from kdist_magics.strategies.multiworker import tf_workers as _m\n_m._mw.clear()\n"
        "import tensorflow as tf\n_ = tf.constant(1) + 1",
        block=True,
    )
    before = pids()
    capsys.readouterr()
    kdist(mip, "", "kd_task = strategy.cluster_resolver.task_id")
    said = capsys.readouterr().out
    assert "restarting the engines (TensorFlow already started on rank 0, 1" in said
    assert not (pids() & before) and engine_values("kd_task") == [0, 1]


# -- a cluster the user started -------------------------------------------------------------
def stop_owned_engines_and_check(shell):
    """``%kdist stop`` ends every process of the cluster kdist started for this module."""
    import psutil

    s = kdist_magics._extension._strategies.get("multiworker")
    started = set(s.cluster._process_tree_pids()) if s and s.cluster and s.cluster.owned else set()
    shell.run_line_magic("kdist", "stop")
    left = [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left after %kdist stop: {left}"


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_attach_to_a_user_started_cluster_by_id_and_never_stop_it(shell, user_cluster):
    import ipyparallel as ipp
    import psutil

    stop_owned_engines_and_check(shell)
    cluster_id, engine_pids = user_cluster
    line = f"--strategy multiworker --np 2 --no-dashboard --cluster-id {cluster_id}"
    try:
        shell.run_cell_magic("kdist", line, TRAIN)
        s = strategy()
        assert s.cluster.attached and not s.cluster.owned
        assert pids(s) == engine_pids  # the user's engines ran the cell
        a, b = engine_values("kd_weights", s)
        for wa, wb in zip(a, b):
            np.testing.assert_array_equal(np.array(wa), np.array(wb))
        # every engine is on this host and reaches the controller on loopback: TF_CONFIG too
        assert all(w.startswith("127.0.0.1:") for w in s.addresses)
    finally:
        shell.run_line_magic("kdist", "stop")
    assert all(psutil.pid_exists(p) for p in engine_pids), "kdist stopped engines it did not start"
    client = ipp.Client(cluster_id=cluster_id)
    try:
        client.wait_for_engines(2, timeout=30)
        # attach again: the engines kept their strategy and namespace
        shell.run_cell_magic("kdist", line, "kd_again = (strategy.cluster_resolver.task_id, len(kd_weights))")
        assert engine_values("kd_again") == [(0, 4), (1, 4)]
    finally:
        client.close()
        shell.run_line_magic("kdist", "stop")
    assert all(psutil.pid_exists(p) for p in engine_pids)


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_attached_engines_with_tensorflow_started_are_the_users_to_restart(shell, user_cluster):
    import ipyparallel as ipp

    stop_owned_engines_and_check(shell)
    cluster_id, engine_pids = user_cluster
    client = ipp.Client(cluster_id=cluster_id)
    try:
        client.wait_for_engines(2, timeout=60)
        client[:].execute("import tensorflow as tf\n_ = tf.constant(1) + 1", block=True)
    finally:
        client.close()
    try:
        with pytest.raises(KDistError, match="restart them"):
            shell.run_cell_magic(
                "kdist", f"--strategy multiworker --np 2 --no-dashboard --cluster-id {cluster_id}", "pass"
            )
    finally:
        shell.run_line_magic("kdist", "stop")
