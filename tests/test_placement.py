"""Which engine is which rank and which GPU each rank sees (fast tier: no framework, fake
device files)."""

from __future__ import annotations

import os

import pytest

from kdist_magics.rank import lifecycle
from kdist_magics.cluster.placement import TooFewGPUs, gpu_env, host_grouped_ranks, local_ranks, visible_gpus


def test_local_ranks_follow_rank_order_within_each_host():
    hosts = ["b", "a", "b", "a"]
    ranks = host_grouped_ranks(hosts)
    assert ranks == [0, 2, 1, 3]
    assert local_ranks(hosts, ranks) == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert local_ranks(["h"], [0]) == [(0, 1)]


def test_visible_gpus_from_the_environment_or_the_driver_files(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia10"):
        (dev / name).touch()
    assert visible_gpus({}, root=str(tmp_path)) == ["0", "1", "10"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5"}, root=str(tmp_path)) == ["3", "5"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, root=str(tmp_path)) == []
    assert visible_gpus({}, root=str(tmp_path / "none")) == []


def test_each_rank_gets_its_own_gpu_and_too_few_is_an_error():
    assert gpu_env(["0", "1"], 1, 2) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}
    assert gpu_env(["4", "6"], 0, 2)["CUDA_VISIBLE_DEVICES"] == "4"  # a scheduler's subset
    assert gpu_env([], 1, 2) == {}  # CPU only: nothing to set
    assert gpu_env(["0"], 1, 2, "all") == {}  # every rank sees every GPU, as under horovodrun
    with pytest.raises(TooFewGPUs) as info:
        gpu_env(["0"], 1, 2, host="node7")
    assert str(info.value).startswith("2 ranks on node7, which has 1 GPU: kdist gives every rank a GPU")
    assert "KDist.rank_gpus = 'shared'" in str(info.value)
    with pytest.raises(ValueError, match="rank_gpus must be one of"):
        gpu_env(["0"], 0, 1, "some")


def test_shared_gpus_go_round_robin_with_part_of_the_memory_each():
    envs = [gpu_env(["0"], r, 2, "shared") for r in range(2)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "0"]
    assert all(e["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.45" and e["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" for e in envs)
    three = [gpu_env(["0", "1"], r, 3, "shared")["CUDA_VISIBLE_DEVICES"] for r in range(3)]
    assert three == ["0", "1", "0"]
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in gpu_env(["0", "1"], 1, 2, "shared")  # enough GPUs


def test_engine_prepare_pins_the_gpu_from_what_the_engine_saw_first(monkeypatch):
    """A second run on the same engine chooses from the host's GPUs, not from the one GPU the
    first run left visible."""
    monkeypatch.setattr(lifecycle, "_run", {})
    monkeypatch.setattr(lifecycle, "_engine", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    for var in ("CUDA_DEVICE_ORDER", "TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS", "TF_NUM_INTEROP_THREADS"):
        monkeypatch.delenv(var, raising=False)
    first = lifecycle.prepare({}, None, None, (1, 2, "own"))
    assert first["gpu"] == "1" and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    lifecycle.end(flush=False)  # the run is over: per-run state goes, the engine's GPUs stay known
    again = lifecycle.prepare({}, None, None, (1, 2, "own"))
    assert again["gpu"] == "1" and "gpu_error" not in again
    crowded = lifecycle.prepare({}, None, None, (2, 3, "own"))
    assert "3 ranks on" in crowded["gpu_error"] and "which has 2 GPUs" in crowded["gpu_error"]


def test_one_rule_for_the_keras_backend(tmp_path, monkeypatch):
    """Without importing Keras: KERAS_BACKEND, else keras.json under KERAS_HOME, else tensorflow."""
    import sys

    from kdist_magics.strategies.frameworks.backends import keras_backend

    monkeypatch.delitem(sys.modules, "keras", raising=False)
    assert keras_backend({"KERAS_BACKEND": "jax"}) == "jax"
    assert keras_backend({"KERAS_HOME": str(tmp_path)}) == "tensorflow"  # no keras.json
    (tmp_path / "keras.json").write_text('{"backend": "torch", "floatx": "float32"}')
    assert keras_backend({"KERAS_HOME": str(tmp_path)}) == "torch"
    assert keras_backend({"KERAS_HOME": str(tmp_path), "KERAS_BACKEND": "jax"}) == "jax"
    assert "keras" not in sys.modules


def test_run_options_come_from_the_magics_traitlets_with_one_set_of_defaults():
    from kdist_magics.magics import KDist
    from kdist_magics.strategies.base import RunOptions

    magics = KDist()
    assert RunOptions.of(magics) == RunOptions()  # the traitlets' defaults are RunOptions'
    magics.rank_gpus, magics.stop_grace = "shared", 1.5
    assert RunOptions.of(magics) == RunOptions(rank_gpus="shared", stop_grace=1.5)
    assert RunOptions.of(object()) == RunOptions()  # a fake without settings: the defaults
