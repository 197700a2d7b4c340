"""Engines tier: an elastic ``%%kdist --strategy horovod --np 4 --min-np 2`` run losing a rank.

The kernel is Horovod's elastic driver here: when an engine dies mid-epoch, the others
restore the last commit and go on as 3 ranks; the next cell gets 4 engines again. The
module stops its engines at the end and checks that none of its processes is left.
"""

from __future__ import annotations

import pytest

pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here (make test builds it into .venv; the Colab-pinned .venv-colab has none, as Colab has none)")
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
    out = eip.run_cell_magic("kdist", "--strategy horovod --np 4 --min-np 2 --push KILLED",
                             ELASTIC_CELL)
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
    # the next cell gets a full set of engines again
    assert eip.run_cell_magic("kdist", "--strategy horovod --np 4", "hvd.size()") == 4
    assert "restarting the engines (ranks were lost in the previous run)" in capsys.readouterr().out


def test_losing_rank_0_makes_the_next_rank_the_new_rank_0(eip):
    eip.user_ns["KILLED"] = 0
    out = eip.run_cell_magic("kdist", "--strategy horovod --np 4 --min-np 3 --push KILLED",
                             ELASTIC_CELL)
    assert (out["size"], out["ranks"], out["spread"]) == (3, 3, 0.0)  # rank 1's value, as rank 0
    assert kdist_magics.last_run().ranks[0].state == "lost"


def test_fewer_ranks_left_than_min_np_stops_the_run(eip, capsys):
    eip.user_ns["KILLED"] = 2
    with pytest.raises(RankDied) as info:
        eip.run_cell_magic("kdist", "--strategy horovod --np 4 --min-np 4 --push KILLED",
                           ELASTIC_CELL)
    assert list(info.value.deaths) == [2] and "SIGKILL" in info.value.deaths[2]
    assert "only 3 ranks left, fewer than --min-np 4" in capsys.readouterr().err
    assert eip.run_cell_magic("kdist", "--strategy horovod --np 4", "hvd.size()") == 4
