"""Engines tier: an elastic ``%%kdist --strategy horovod --np 4 --min-np 2`` run losing a rank.

The kernel is Horovod's elastic driver here: when an engine dies mid-epoch, the others
restore the last commit and go on as 3 ranks; the next cell gets 4 engines again. The
module stops its engines at the end and checks that none of its processes is left.
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "horovod.tensorflow",
    reason="Horovod is not installed here (make test builds it into .venv; the Colab-pinned .venv-colab has none, as Colab has none)",
)
pytest.importorskip("ipyparallel", reason="ipyparallel is a core dependency")

import kdist_magics  # noqa: E402
from kdist_magics.errors import RankDied  # noqa: E402

pytestmark = [pytest.mark.engines, pytest.mark.horovod, pytest.mark.slow, pytest.mark.timeout(420)]

#: rank 1 kills itself (SIGKILL) at the end of batch 2 of epoch 1, after that batch's commit
ELASTIC_CELL = """
import os, keras, numpy as np
first = hvd.rank()
rng = np.random.default_rng(first)
x = rng.normal(size=(64, 8)).astype('float32'); y = x.sum(1, keepdims=True)
keras.utils.set_random_seed(first)  # different on purpose: state.sync() makes them rank 0's
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation='tanh'),
                          keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.02)), loss='mse')
state = hvd.elastic.KerasState(model, batch=0, epoch=0)
resets, committed = [], []
state.register_reset_callbacks([lambda: resets.append(
    (hvd.size(), state.epoch, state.batch, [w.copy() for w in model.get_weights()]))])

class Killed(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if (state.epoch, batch) == (1, 2):
            committed.append([w.copy() for w in model.get_weights()])
            if first == KILLED and hvd.size() == 4:
                os.kill(os.getpid(), 9)

@hvd.elastic.run
def train(state):
    model.fit(x, y, batch_size=8, epochs=3 - state.epoch, shuffle=False, verbose=0,
              callbacks=[hvd.elastic.CommitStateCallback(state), Killed(),
                         hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.UpdateEpochStateCallback(state)])

train(state)
weights = hvd.allgather_object(np.concatenate([w.ravel() for w in model.get_weights()]))
{"size": hvd.size(), "epoch": state.epoch, "iterations": int(model.optimizer.iterations.numpy()),
 "resets": [(n, e, b) for n, e, b, _ in resets],
 "restored_commit": all(np.array_equal(a, b) for a, b in zip(resets[0][3], committed[0])),
 "spread": float(max(np.abs(w - weights[0]).max() for w in weights)), "ranks": len(weights)}
"""


@pytest.fixture(scope="module")
def eip(shell):
    import psutil

    yield shell
    strategy = kdist_magics._extension._strategies.get("horovod")
    cluster = strategy.cluster if strategy is not None else None
    pids = set(cluster._process_tree_pids()) if cluster is not None else set()
    shell.run_line_magic("kdist", "stop")
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left after %kdist stop: {left}"


def test_a_rank_lost_mid_epoch_the_others_go_on_from_the_last_commit(eip, capsys):
    eip.user_ns["KILLED"] = 1
    out = eip.run_cell_magic("kdist", "--strategy horovod --np 4 --min-np 2 --push KILLED", ELASTIC_CELL)
    printed = capsys.readouterr().out
    # re-formed once, as 3 ranks, at the commit of (epoch 1, batch 2), whose weights came back
    # (CommitStateCallback runs before UpdateBatchStateCallback: the saved batch is 1)
    assert out["resets"] == [(3, 1, 1)] and out["restored_commit"]
    assert (out["size"], out["ranks"], out["epoch"]) == (3, 3, 3)
    assert out["spread"] == 0.0  # identical weights on the three ranks left
    assert out["iterations"] == 8 + 3 + 16  # epoch 0, epoch 1 up to the commit, epochs 1-2 again
    rec = kdist_magics.last_run()
    assert rec.status == "done" and rec.world_size == 3
    assert [(e["lost"], e["size"]) for e in rec.resizes] == [([1], 3)]
    assert rec.ranks[1].state == "lost" and "SIGKILL" in rec.ranks[1].error
    assert all(rec.ranks[r].state == "done" for r in (0, 2, 3))
    assert "world size 4 \u2192 3" in rec.summary() and "rank 1" in rec.summary()
    assert "rank 1 was killed by SIGKILL" in printed and "going on with 3 ranks" in printed
    # the next cell gets a full set of engines again, with the thread rule for 4 ranks on this
    # host (on 2 cores: one intra-op thread each and two inter-op, as they outnumber the cores)
    from kdist_magics.rank.lifecycle import thread_env, threads_per_rank

    threads = eip.run_cell_magic(
        "kdist",
        "--strategy horovod --np 4",
        "import os\n(hvd.size(), {k: os.environ[k] for k in ('TF_NUM_INTRAOP_THREADS',"
        " 'TF_NUM_INTEROP_THREADS', 'OMP_NUM_THREADS')})",
    )
    assert threads == (4, thread_env(threads_per_rank(4), 4))
    assert "restarting the engines (ranks were lost in the previous run)" in capsys.readouterr().out


@pytest.mark.timeout(600)
def test_horovods_keras_examples_run_with_kdist_run(eip, tmp_path, monkeypatch):
    """The corpus' Horovod examples as scripts, on the module's engines (tests/test_corpus.py
    lists what differs from the originals): the Keras MNIST example, then the elastic one."""
    pytest.importorskip("sklearn", reason="scikit-learn provides the MNIST-shaped digits")
    import json
    import shutil

    import numpy as np
    from test_corpus import CORPUS_DIR
    from test_keras_horovod import WORKERS, write_mnist_like

    for name in ("mnist_local.py", "hvd_keras_mnist_elastic.py"):
        shutil.copy(CORPUS_DIR / name, tmp_path)
    mnist = tmp_path / "mnist"  # the MNIST example's folder (its argument): its files go there
    mnist.mkdir()
    write_mnist_like(mnist / "mnist.npz")
    monkeypatch.chdir(tmp_path)
    example = WORKERS / "hvd_keras_mnist_example.py"
    eip.run_line_magic("kdist", f"run --strategy horovod --np 4 --no-dashboard {example} {mnist}")
    ranks = [json.loads((mnist / f"example-rank{r}.json").read_text()) for r in range(4)]
    weights = [np.load(mnist / f"example-rank{r}.npz") for r in range(4)]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["size"] for r in ranks} == {4}
    for other in weights[1:]:
        for key in weights[0].files:
            np.testing.assert_allclose(other[key], weights[0][key], rtol=0, atol=1e-6)
    loss = ranks[0]["history"]["loss"]
    assert loss[-1] < loss[0] and all(r["history"]["loss"] == pytest.approx(loss) for r in ranks), loss
    assert ranks[0]["restored_matches"] and ranks[0]["hvd_module"] == "kdist_magics.keras_horovod"

    eip.run_line_magic("kdist", "run --strategy horovod --np 4 --min-np 2 --no-dashboard hvd_keras_mnist_elastic.py")
    out = eip.run_cell_magic(
        "kdist",
        "--strategy horovod --np 4 --min-np 2 --no-dashboard",
        """
import numpy as np
every = hvd.allgather_object(np.concatenate([w.ravel() for w in model.get_weights()]))
{"spread": float(max(np.abs(w - every[0]).max() for w in every)), "size": hvd.size(),
 "loss": model.history.history["loss"], "epoch": state.epoch}
""",
    )
    assert (out["size"], out["spread"], out["epoch"]) == (4, 0.0, 3), out
    assert out["loss"][-1] < out["loss"][0], out["loss"]  # three epochs of the elastic fit
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*.keras")) == [
        f"checkpoint-{e}.keras" for e in (1, 2, 3)
    ]  # rank 0's checkpoints, one per epoch


def test_losing_rank_0_makes_the_next_rank_the_new_rank_0(eip):
    eip.user_ns["KILLED"] = 0
    out = eip.run_cell_magic("kdist", "--strategy horovod --np 4 --min-np 3 --push KILLED", ELASTIC_CELL)
    assert (out["size"], out["ranks"], out["spread"]) == (3, 3, 0.0)  # rank 1's value, as rank 0
    assert kdist_magics.last_run().ranks[0].state == "lost"


def test_fewer_ranks_left_than_min_np_stops_the_run(eip, capsys):
    eip.user_ns["KILLED"] = 2
    with pytest.raises(RankDied) as info:
        eip.run_cell_magic("kdist", "--strategy horovod --np 4 --min-np 4 --push KILLED", ELASTIC_CELL)
    assert list(info.value.deaths) == [2] and "SIGKILL" in info.value.deaths[2]
    assert "only 3 ranks left, fewer than --min-np 4" in capsys.readouterr().err
    assert eip.run_cell_magic("kdist", "--strategy horovod --np 4", "hvd.size()") == 4


#: every rank trains at a steady pace (so an engine has time to register and join mid-run)
GROW_CELL = """
import time, keras, numpy as np
first = hvd.rank()
rng = np.random.default_rng(first)
x = rng.normal(size=(64, 8)).astype('float32'); y = x.sum(1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation='tanh'),
                          keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.02)), loss='mse')
state = hvd.elastic.KerasState(model, batch=0, epoch=0)
resets = []
state.register_reset_callbacks([lambda: resets.append((hvd.size(), state.epoch))])

class Pace(keras.callbacks.Callback):  # slower until the third rank is in (a loaded host
    def on_train_batch_end(self, batch, logs=None):  # warms a new engine slowly: CI, 6 Dec)
        time.sleep(0.25 if hvd.size() >= 3 else 0.75)

@hvd.elastic.run
def train(state):
    model.fit(x, y, batch_size=8, epochs=EPOCHS - state.epoch, shuffle=False, verbose=0,
              callbacks=[hvd.elastic.CommitStateCallback(state), Pace(),
                         hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.UpdateEpochStateCallback(state)])

train(state)
weights = hvd.allgather_object(np.concatenate([w.ravel() for w in model.get_weights()]))
{"size": hvd.size(), "epoch": state.epoch, "resets": resets, "ranks": len(weights),
 "spread": float(max(np.abs(w - weights[0]).max() for w in weights))}
"""


def test_an_engine_registering_mid_run_joins_at_the_next_commit(eip, capsys):
    """--max-np on an attached cluster: a third engine started while 2 ranks train is taken
    in at their next commit; the run ends as 3 ranks in step, rank 0's state synced to it."""
    import os
    import threading
    import time

    import ipyparallel as ipp

    import subprocess
    import sys

    theirs = ipp.Cluster(n=2, cluster_id=f"grow-{os.getpid()}", controller_ip="127.0.0.1", log_level=40)
    theirs.start_cluster_sync()
    stop = threading.Event()
    extra: list[subprocess.Popen] = []
    try:
        client = theirs.connect_client_sync()
        client.wait_for_engines(2, timeout=120, interactive=False)
        client.close()

        def add_an_engine_once_training():  # as `ipcluster engines` or a batch job would
            while not stop.is_set():
                rec = kdist_magics.last_run()
                if rec is not None and rec.strategy == "horovod" and rec.metrics:
                    extra.append(
                        subprocess.Popen(
                            [
                                sys.executable,
                                "-m",
                                "ipyparallel.engine",
                                f"--cluster-id={theirs.cluster_id}",
                                "--log-level=40",
                            ]
                        )
                    )
                    return
                time.sleep(0.2)

        adder = threading.Thread(target=add_an_engine_once_training, daemon=True)
        adder.start()
        eip.user_ns["EPOCHS"] = 8
        out = eip.run_cell_magic(
            "kdist", f"--strategy horovod --np 2 --max-np 3 --cluster-id {theirs.cluster_id} --push EPOCHS", GROW_CELL
        )
        adder.join(timeout=60)
        printed = capsys.readouterr().out
        assert (out["size"], out["ranks"], out["epoch"]) == (3, 3, 8)
        assert out["spread"] == 0.0  # the joined rank holds exactly what the others hold
        assert [n for n, _ in out["resets"]] == [3]  # rank 0 reset once, into 3 ranks
        rec = kdist_magics.last_run()
        assert rec.status == "done" and rec.world_size == 3
        assert [(e["added"], e["size"]) for e in rec.resizes] == [([2], 3)]
        assert all(rec.ranks[r].state == "done" for r in (0, 1, 2))
        assert "world size 2 \u2192 3 (rank 2 joined)" in rec.summary()
        assert "rank 2 joins the run at its next commit" in printed
        # the next cell uses the cluster as asked (2 ranks), the third engine idle
        assert (
            eip.run_cell_magic("kdist", f"--strategy horovod --np 2 --cluster-id {theirs.cluster_id}", "hvd.size()")
            == 2
        )
        eip.run_line_magic("kdist", "stop")
    finally:
        stop.set()
        import psutil

        for proc in extra:  # the engine this test started (and its nanny), by pid
            try:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
            except psutil.Error:
                pass
            proc.kill()
            proc.wait(timeout=30)
        theirs.stop_cluster_sync()
