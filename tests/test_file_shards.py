"""Data that does not fit in the notebook: each rank reads its own files.

Fast tier: ``shard_files`` and ``npz_shards`` (kdist_magics.datasets) with the position given or
found from what runs the process (TF_CONFIG, torch.distributed, Horovod). Engines tier: the same
cell on real engines under Horovod (2 ranks), multiworker on JAX (2 processes) and sharded
across 2 processes with a model axis over both (mesh 1x2: one data position, so both read every
file in the same order); each rank names the files it read, and the weights come out identical.
"""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from kdist_magics import datasets
from kdist_magics.datasets import data_position, npz_shards, shard_files, write_npz_shards

pytestmark = pytest.mark.notf


@pytest.fixture
def parts(tmp_path):
    x = np.arange(1000 * 4, dtype="float32").reshape(1000, 4)
    y = np.arange(1000)
    return tmp_path, write_npz_shards(tmp_path, x, y, 5)


def test_each_position_gets_as_many_files_in_name_order_and_the_rest_is_said(parts, capsys):
    folder, paths = parts
    pattern = str(folder / "part-*.npz")
    first, second = shard_files(pattern, 0, 2), shard_files(pattern, 1, 2)
    assert [p.rsplit("-", 1)[1] for p in first] == ["00000.npz", "00002.npz"]
    assert [p.rsplit("-", 1)[1] for p in second] == ["00001.npz", "00003.npz"]
    assert capsys.readouterr().out == (
        "kdist: 5 files over 2 ranks: leaving out the last 1 so every rank reads as many\n"
    )  # once: rank 0 says it
    assert shard_files(paths, 0, 1) == sorted(map(str, paths))  # a list works as a pattern does
    with pytest.raises(ValueError, match=r"^5 files matching .* for 8 data positions: give every rank"):
        shard_files(pattern, 0, 8)


def test_the_position_comes_from_what_runs_the_process(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name in ("torch.distributed", "kdist_magics.keras_horovod", "horovod.tensorflow"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "keras", None)  # no Keras distribution to ask
    assert data_position() == (0, 1)
    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    assert data_position() == (2, 3)
    group = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda: 1, get_world_size=lambda: 4
    )
    monkeypatch.setitem(sys.modules, "torch.distributed", group)
    assert data_position() == (1, 4)
    hvd = types.SimpleNamespace(is_initialized=lambda: True, rank=lambda: 3, size=lambda: 8)
    monkeypatch.setitem(sys.modules, "kdist_magics.keras_horovod", hvd)
    assert data_position() == (3, 8)


def test_every_rank_makes_as_many_batches_as_the_smallest_part_gives(tmp_path, monkeypatch):
    pytest.importorskip("keras")
    rng = np.random.default_rng(0)
    sizes = [300, 100, 250, 120]  # batches of 64 in each file: 4, 1, 3, 1
    for i, n in enumerate(sizes):
        np.savez(tmp_path / f"part-{i:05d}.npz", x=rng.normal(size=(n, 3)).astype("float32"), y=np.full(n, i))
    seen = []
    for position in (0, 1):  # position 0 reads files 0 and 2 (7 batches), 1 files 1 and 3 (2)
        monkeypatch.setattr(datasets, "data_position", lambda p=position: (p, 2))
        ds = npz_shards(tmp_path / "part-*.npz", batch_size=64, shuffle_seed=1)  # a path works too
        assert len(ds) == 2
        for i in range(len(ds)):
            x, y = ds[i]
            assert x.shape == (64, 3) and len(set(y.tolist())) == 1  # a batch within one file
            assert set(y.tolist()) <= {position, position + 2}
        seen.append([f.rsplit("-", 1)[1] for f in ds.files])
        ds.on_epoch_end()
        assert len(set(ds.order)) == len(ds)  # every batch once in an epoch
    assert seen == [["00000.npz", "00002.npz"], ["00001.npz", "00003.npz"]]
    # the first epoch is shuffled too, and alike wherever the seed is the same
    monkeypatch.setattr(datasets, "data_position", lambda: (0, 1))
    plain = npz_shards(str(tmp_path / "part-*.npz"), batch_size=64)
    shuffled = [npz_shards(str(tmp_path / "part-*.npz"), batch_size=64, shuffle_seed=s) for s in (1, 1, 2)]
    assert plain.order == sorted(plain.order) and shuffled[0].order == shuffled[1].order
    assert shuffled[0].order != plain.order and shuffled[2].order != shuffled[0].order
    with pytest.raises(ValueError, match="no rank's files hold a whole batch of 512 rows"):
        npz_shards(str(tmp_path / "part-*.npz"), batch_size=512)


# -- real engines --------------------------------------------------------------------------

CELL = """
import numpy as np, keras
from kdist_magics.datasets import npz_shards
ds = npz_shards(FOLDER + "/part-*.npz", batch_size=32)
kd_files = [f.rsplit("/", 1)[1] for f in ds.files]
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=OPTIMIZER, loss="mse")
model.fit(ds, epochs=2, verbose=0)
kd_weights = [w.tolist() for w in model.get_weights()[:2]]
"""


def _write(folder):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 8)).astype("float32")
    write_npz_shards(folder, x, x[:, :1] * 2 - x[:, 1:2], 4)


def _identical(a, b):
    return all(np.allclose(np.array(u), np.array(v), rtol=1e-5, atol=1e-6) for u, v in zip(a, b))


@pytest.mark.engines
@pytest.mark.horovod
@pytest.mark.timeout(600)
def test_horovod_ranks_read_their_own_files_and_train_in_sync(tmp_path):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here (make test builds it into .venv)")
    from conftest import run_in_fresh_shell

    _write(tmp_path)
    cell = (
        CELL.replace("FOLDER", repr(str(tmp_path)))
        .replace("OPTIMIZER", "hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))")
        .replace(
            "model.fit(ds, epochs=2, verbose=0)",
            "model.fit(ds, epochs=2, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])",
        )
    )
    out = run_in_fresh_shell(
        f"""
_, err = attempt("--strategy horovod --np 2 --no-dashboard", {cell!r})
out["err"] = repr(err)
out["files"], out["weights"] = by_rank("kd_files", "horovod"), by_rank("kd_weights", "horovod")
ip.run_line_magic("kdist", "stop")
""",
        {"KERAS_BACKEND": "tensorflow"},
    )
    assert out["err"] == "None", out["_stdout"][-3000:]
    assert out["files"] == [["part-00000.npz", "part-00002.npz"], ["part-00001.npz", "part-00003.npz"]]
    assert _identical(*out["weights"])


@pytest.mark.engines
@pytest.mark.tfless  # JAX only: make test runs it in .venv-colab-tpu
@pytest.mark.timeout(600)
def test_jax_processes_read_their_own_files_and_sharded_ones_on_one_position_read_the_same():
    pytest.importorskip("jax", reason="JAX is not installed here")
    import tempfile

    from conftest import run_in_fresh_shell

    folder = tempfile.mkdtemp()
    _write(folder)
    cell = CELL.replace("FOLDER", repr(folder)).replace("OPTIMIZER", "keras.optimizers.SGD(0.01)")
    sharded = cell.replace(
        "kd_weights = [w.tolist() for w in model.get_weights()[:2]]\n",
        "kd_loss = model.history.history['loss'] if model.history else None\n",
    )
    out = run_in_fresh_shell(
        f"""
_, err = attempt("--strategy multiworker --np 2 --no-dashboard", {cell!r})
out["err"] = repr(err)
out["files"], out["weights"] = by_rank("kd_files"), by_rank("kd_weights")
_, err = attempt("--strategy sharded --np 2 --mesh 1,2 --no-dashboard", {sharded!r})
out["sharded err"] = repr(err)
s = kdist_magics._extension._strategies["sharded"].engines
ranks = s.ranks(s.cluster, None)
out["sharded files"] = [v for _, v in sorted(zip(ranks, s.cluster.view().pull("kd_files", block=True)))]
ip.run_line_magic("kdist", "stop")
""",
        {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
    )
    assert out["err"] == "None", out["_stdout"][-3000:]
    assert out["files"] == [["part-00000.npz", "part-00002.npz"], ["part-00001.npz", "part-00003.npz"]]
    assert _identical(*out["weights"])
    assert out["sharded err"] == "None", out["_stdout"][-3000:]
    every = ["part-00000.npz", "part-00001.npz", "part-00002.npz", "part-00003.npz"]
    assert out["sharded files"] == [every, every]  # mesh 1x2: one data position, both read it all
