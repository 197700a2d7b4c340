"""The Keras 3 Horovod binding (kdist_magics.keras_horovod).

The horovod tests run N=2 real Horovod (Gloo) ranks as plain subprocesses against a
loopback-only rendezvous in the test process; each rank writes its results to a temp
folder and the assertions compare ranks here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, python_without

WORKERS = Path(__file__).resolve().parent / "workers"
N = 2

try:
    import horovod  # noqa: F401  (the package only; horovod.tensorflow imports TF)

    HAVE_HOROVOD = True
except ImportError:
    HAVE_HOROVOD = False

needs_horovod = pytest.mark.skipif(not HAVE_HOROVOD, reason="Horovod is not installed")


def rank_env(horovod_env: dict[str, str], **extra: str) -> dict[str, str]:
    """A rank subprocess's environment: its HOROVOD_* variables, one thread, Keras 3 on TF."""
    env = {
        **os.environ,
        **horovod_env,
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "KERAS_BACKEND": "tensorflow",
        "PYTHONUNBUFFERED": "1",
        **extra,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("TF_USE_LEGACY_KERAS", None)
    return env


def run_ranks(script: Path, args: list[str], outdir: Path, timeout: float = 150) -> None:
    """Start N ranks of ``script`` under one rendezvous; fail with their output if any fails.
    Every child is killed (by PID) whatever happens."""
    from kdist_magics.strategies.horovod.rendezvous import Rendezvous

    procs: list[subprocess.Popen] = []
    logs = []
    with Rendezvous(["localhost"] * N) as rdv:
        try:
            for i in range(N):
                env = rank_env(rdv.env(i))
                log = open(outdir / f"rank{i}.log", "w+")
                logs.append(log)
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(script), *args, str(outdir)],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=str(outdir),
                    )
                )
            failed = []
            for i, p in enumerate(procs):
                try:
                    rc = p.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    rc = "timeout"
                if rc != 0:
                    failed.append((i, rc))
                    break
            if failed:
                out = []
                for i, log in enumerate(logs):
                    log.flush()
                    log.seek(0)
                    out.append(f"--- rank {i} ---\n" + log.read()[-4000:])
                pytest.fail(f"rank(s) failed: {failed}\n" + "\n".join(out))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
            for log in logs:
                log.close()


def load(outdir: Path, scenario: str):
    ranks = []
    for r in range(N):
        arrays = dict(np.load(outdir / f"{scenario}-rank{r}.npz"))
        info = json.loads((outdir / f"{scenario}-rank{r}.json").read_text())
        ranks.append((arrays, info))
    return ranks


def keys(arrays, prefix):
    return sorted(
        (k for k in arrays if k.startswith(prefix) and k[len(prefix) :].isdigit()), key=lambda k: int(k[len(prefix) :])
    )


def assert_same(ranks, prefix, **tol):
    for k in keys(ranks[0][0], prefix):
        for r in range(1, N):
            np.testing.assert_allclose(ranks[r][0][k], ranks[0][0][k], err_msg=f"{k}, rank {r}", **tol)


def max_diff(ranks, prefix):
    return max(float(np.max(np.abs(ranks[1][0][k] - ranks[0][0][k]))) for k in keys(ranks[0][0], prefix))


# ---------------------------------------------------------------------------------------------
# Two real ranks
@pytest.mark.quick
@needs_horovod
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fit_syncs_broadcasts_warms_up_and_averages_metrics(tmp_path):
    run_ranks(WORKERS / "keras_hvd_worker.py", ["train"], tmp_path)
    ranks = load(tmp_path, "train")
    (a0, i0), (a1, i1) = ranks
    assert i0["size"] == N and {i0["rank"], i1["rank"]} == {0, 1}

    # The ranks trained on different data and started from different weights ...
    assert not np.allclose(a0["x"], a1["x"])
    assert max_diff(ranks, "init") > 1e-3
    # ... the broadcast made rank 1 start from rank 0's weights before the first step ...
    for k in keys(a0, "bcast"):
        np.testing.assert_array_equal(a1[k], a0[k.replace("bcast", "init")])
        np.testing.assert_array_equal(a0[k], a0[k.replace("bcast", "init")])
    # ... and averaged gradients kept them identical to the end.
    assert_same(ranks, "w", rtol=0, atol=1e-6)
    assert max_diff(ranks, "init") > 1e-3  # (not trivially: they did not start equal)

    # The optimizer is still an SGD (same class name), and counted every step.
    assert i0["opt_class"] == "SGD" and i0["is_sgd"]
    assert i0["iterations"] == i0["steps"] * i0["epochs"]

    # Its all-reduce is timed where it runs, every step: rank 1 started each step 30 ms late,
    # so rank 0 waited for it inside the collective and rank 1 did not
    (s0, n0), (s1, n1) = i0["collective"], i1["collective"]
    assert n0 == n1 == i0["steps"] * i0["epochs"]
    assert s0 / n0 > 0.02 and s1 / n1 < s0 / n0 - 0.015, (s0 / n0, s1 / n1)

    # Loss falls (averaged over ranks by MetricAverageCallback, so equal on both).
    loss = i0["history"]["loss"]
    assert loss[-1] < loss[0]

    # MetricAverageCallback: logs hold the mean over ranks of each rank's own metric.
    for epoch in range(i0["epochs"]):
        for metric in ("loss", "mae"):
            raw = [i0["raw_logs"][epoch][metric], i1["raw_logs"][epoch][metric]]
            assert raw[0] != pytest.approx(raw[1])  # different data: different local values
            for info in (i0, i1):
                assert info["avg_logs"][epoch][metric] == pytest.approx(np.mean(raw), rel=1e-6)
                assert info["history"][metric][epoch] == pytest.approx(np.mean(raw), rel=1e-6)

    # LearningRateWarmupCallback: Horovod's formula, per batch, during warm-up; then the target.
    steps, warmup, base, size = i0["steps"], i0["warmup"], i0["base_lr"], i0["size"]
    expected = []
    for epoch in range(i0["epochs"]):
        for batch in range(steps):
            if epoch < warmup:
                e = epoch + batch / steps + 1.0 / steps
                expected.append(base / size * (e * (size - 1) / warmup + 1))
            else:
                expected.append(expected[-1])
    assert i0["lr_at_batch"] == pytest.approx(expected, rel=1e-5)
    assert expected[0] == pytest.approx(base / size * (1 + (size - 1) / (warmup * steps)))
    assert expected[-1] == pytest.approx(base)
    assert i0["history"]["lr"][-1] == pytest.approx(base, rel=1e-5)


@needs_horovod
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_broadcast_covers_a_model_with_no_trainable_variable_from_root_rank_1(tmp_path):
    run_ranks(WORKERS / "keras_hvd_worker.py", ["frozen"], tmp_path)
    (a0, i0), (a1, i1) = load(tmp_path, "frozen")
    assert i0["all_trainable"] == i1["all_trainable"] == 0
    inits = keys(a0, "all_init")
    assert len(inits) == 8  # kernel, bias, BN gamma/beta/mean/variance, kernel, bias
    assert max(float(np.max(np.abs(a0[k] - a1[k]))) for k in inits) > 1e-3  # started apart
    # every variable, trainable or not (BatchNorm's statistics too), is rank 1's, exactly
    for k in inits:
        after = k.replace("init", "after")
        np.testing.assert_array_equal(a0[after], a1[k], err_msg=k)
        np.testing.assert_array_equal(a1[after], a1[k], err_msg=k)
    np.testing.assert_array_equal(a0["all_after4"], np.full((4,), 2.0))  # rank 1's moving mean
    # with the first kernel local: it stays each rank's own, the rest come from rank 1
    for k in keys(a0, "local_init"):
        after = k.replace("init", "after")
        if k == "local_init0":
            np.testing.assert_array_equal(a0[after], a0[k])
            np.testing.assert_array_equal(a1[after], a1[k])
            assert not np.array_equal(a0[after], a1[after])
        else:
            np.testing.assert_array_equal(a0[after], a1[k], err_msg=k)


@needs_horovod
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_partial_distributed_optimizer_keeps_local_layers_gradients_local(tmp_path):
    run_ranks(WORKERS / "keras_hvd_worker.py", ["partial"], tmp_path)
    ranks = load(tmp_path, "partial")
    (a0, i0), _ = ranks
    lr, size = i0["lr"], i0["size"]
    assert i0["modules"] == ["kdist_magics.keras_horovod"] * 2
    assert "keras.layers.Layer" in i0["bad_layers"]
    grads = [[a[k] for k in keys(a, "g")] for a, _ in ranks]
    n_vars = len(grads[0])
    local = {n_vars - 2, n_vars - 1}  # the last Dense layer's kernel and bias
    for j in range(n_vars):
        w0 = a0[f"w0_{j}"]
        mean = sum(g[j] for g in grads) / size
        for r, (a, info) in enumerate(ranks):
            own = grads[r][j]
            want = {
                "binding": w0 - lr * (own / size if j in local else mean),
                "keras": w0 - lr * (own / size if j in local else mean),
                "tfkeras": w0 - lr * (own / size if j in local else mean),
                "unscaled": w0 - lr * (own if j in local else mean),
                "nolocal": w0 - lr * mean,  # no local_layers: DistributedOptimizer's update
            }
            for name, expected in want.items():
                assert info[f"{name}_class"] == "SGD"
                np.testing.assert_allclose(
                    a[f"{name}_{j}"], expected, rtol=1e-4, atol=1e-6, err_msg=f"{name} variable {j} rank {r}"
                )
    # the local layer really differs between ranks; the shared ones do not
    last = n_vars - 1
    assert np.abs(ranks[0][0][f"binding_{last}"] - ranks[1][0][f"binding_{last}"]).max() > 1e-6
    np.testing.assert_allclose(ranks[0][0]["binding_0"], ranks[1][0]["binding_0"], atol=1e-6)


def run_elastic_ranks(script: Path, args: list[str], outdir: Path, n: int, timeout: float = 200) -> dict[int, int]:
    """Start ``n`` elastic ranks; when one dies, re-form the job without it (as kdist's
    kernel does). Returns each rank's exit code. Every child is killed by PID at the end."""
    import time

    from kdist_magics.strategies.horovod.rendezvous import Rendezvous

    procs: list[subprocess.Popen] = []
    with Rendezvous(["localhost"] * n, elastic=True) as rdv:
        rdv.plan.started()  # fresh processes: no rank re-initialises before the first failure
        try:
            for i in range(n):
                env = rank_env(rdv.env(i), HOROVOD_GLOO_TIMEOUT_SECONDS="8")
                with open(outdir / f"rank{i}.log", "w") as log:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, str(script), *args, str(outdir)],
                            env=env,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            cwd=str(outdir),
                        )
                    )
            lost: set[int] = set()
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                for i, p in enumerate(procs):
                    if p.poll() not in (None, 0) and i not in lost:
                        lost.add(i)
                        rdv.shrink([i])
                time.sleep(0.1)
            return {i: p.poll() for i, p in enumerate(procs)}
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)


@needs_horovod
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_elastic_state_restores_the_last_commit_on_the_ranks_left(tmp_path):
    """hvd.elastic on 3 real ranks, one lost mid-epoch: KerasState, the three callbacks and
    hvd.elastic.run bring the other two back to the last commit, as 2 ranks, in step."""
    codes = run_elastic_ranks(WORKERS / "keras_hvd_worker.py", ["shrink"], tmp_path, n=3)
    logs = {i: (tmp_path / f"rank{i}.log").read_text()[-3000:] for i in range(3)}
    assert codes == {0: 0, 1: -9, 2: 0}, logs
    infos = {r: json.loads((tmp_path / f"shrink-rank{r}.json").read_text()) for r in (0, 2)}
    arrays = {r: dict(np.load(tmp_path / f"shrink-rank{r}.npz")) for r in (0, 2)}
    for first, info in infos.items():
        # re-formed as 2 ranks, in the old order; one reset, at the commit of (epoch 1, batch 2)
        # (CommitStateCallback runs before UpdateBatchStateCallback there: batch 1 is saved)
        assert (info["size"], info["rank"]) == (2, {0: 0, 2: 1}[first])
        assert [(x["size"], x["rank"], x["epoch"], x["batch"]) for x in info["resets"]] == [
            (2, {0: 0, 2: 1}[first], 1, 1)
        ]
        # the weights after the reset are the committed ones, exactly
        for got, want in zip(info["resets"][0]["weights"], info["commit"]):
            np.testing.assert_array_equal(np.array(got, "float32"), np.array(want, "float32"))
        # 8 steps in epoch 0, 3 in epoch 1 up to the commit (restored with the optimizer),
        # then epochs 1 and 2 again in full: 8 + 3 + 16
        assert info["iterations"] == 27
        assert (info["epoch"], info["batch"]) == (3, 0)
    for k in arrays[0]:
        np.testing.assert_array_equal(arrays[0][k], arrays[2][k], err_msg=k)


@needs_horovod
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_stock_horovod_keras_does_not_sync_under_keras3(tmp_path):
    """Why the binding exists: Horovod's own module lets ranks drift apart silently."""
    run_ranks(WORKERS / "keras_hvd_worker.py", ["stock"], tmp_path)
    ranks = load(tmp_path, "stock")
    assert ranks[0][1]["module"] == "horovod.tensorflow.keras"
    assert max_diff(ranks, "init") == 0.0  # same start
    assert all(info["loss"][-1] < info["loss"][0] for _, info in ranks)  # each rank trained
    assert max_diff(ranks, "w") > 1e-3  # ... but not together


@needs_horovod
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_backward_passes_per_step_and_fp16_compression(tmp_path):
    run_ranks(WORKERS / "keras_hvd_worker.py", ["aggregate"], tmp_path)
    ranks = load(tmp_path, "aggregate")
    (a0, i0), _ = ranks
    lr, size = i0["lr"], i0["size"]

    # Two backward passes, one update: w2 = w0 - lr * mean_over_ranks(g_batch0 + g_batch1) / 2
    # (average_aggregated_gradients=True divides the local sum by backward_passes_per_step).
    grads = keys(a0, "g")
    for j, k in enumerate(keys(a0, "w0_")):
        total = sum(a[grads[j]] for a, _ in ranks)
        expected = a0[k] - lr * total / size / 2
        for a, _ in ranks:
            np.testing.assert_allclose(a[f"w2_{j}"], expected, rtol=1e-4, atol=1e-6)
            # a third pass only accumulates: no update yet
            np.testing.assert_array_equal(a[f"w3_{j}"], a[f"w2_{j}"])
    assert i0["iterations_two"] == 2  # iterations count backward passes, as in Horovod

    # One step from w0 with other options, recomputed from each rank's batch-0 gradient.
    first = [[a[k] for k in keys(a, "first")] for a, _ in ranks]
    n_vars = len(first[0])
    for j in range(n_vars):
        w0 = a0[f"w0_{j}"]
        total = sum(f[j] for f in first)
        expected = {
            "sum": w0 - lr * total,  # op=Sum, grouped by variable lists
            "predivide": w0 - lr * total / size,  # Average; predivide cancels out
            "eager": w0 - lr * total / size,  # custom loop, eager apply_gradients
            "tffunc": w0 - lr * total / size,  # custom loop inside a tf.function
        }
        for name, want in expected.items():
            for a, _ in ranks:
                np.testing.assert_allclose(a[f"{name}{j}"], want, rtol=1e-4, atol=1e-6, err_msg=f"{name}{j}")
        for r, (a, _) in enumerate(ranks):
            if j == n_vars - 1:  # registered local: own gradient / size, not allreduced
                want = w0 - lr * first[r][j] / size
            else:
                want = w0 - lr * total / size
            np.testing.assert_allclose(a[f"local{j}"], want, rtol=1e-4, atol=1e-6, err_msg=f"local{j} rank {r}")
    assert max_diff(ranks, "local") > 1e-6  # the local bias really differs between ranks

    # Embedding gradients are IndexedSlices; the ranks stay equal through the allgather path
    # and through sparse_as_dense with local aggregation, and they did train.
    assert i0["sparse_grad"]
    for name in ("sparse", "sparsedense"):
        assert_same(ranks, name, rtol=0, atol=1e-6)
        assert np.abs(a0[f"{name}0"] - a0["probe0"]).max() > 1e-4  # the embedding moved

    # fp16 compression with local aggregation: still in sync, and learning.
    assert_same(ranks, "b_", rtol=0, atol=1e-6)
    assert i0["iterations_b"] == 3 * 64 // 8
    assert i0["loss_b"][-1] < i0["loss_b"][0]


def write_mnist_like(path: Path) -> None:
    """scikit-learn's 8x8 digits upsampled to MNIST's 28x28 uint8 format (no network)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3)))  # 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))  # 28x28
    images = np.round(images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    np.savez(path, x_train=images, y_train=labels, x_test=images[:100], y_test=labels[:100])


@needs_horovod
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_horovods_keras_mnist_example_runs_with_only_keras3_edits(tmp_path):
    pytest.importorskip("sklearn", reason="scikit-learn provides the MNIST-shaped digits")
    write_mnist_like(tmp_path / "mnist.npz")
    run_ranks(WORKERS / "hvd_keras_mnist_example.py", [], tmp_path, timeout=240)
    ranks = load(tmp_path, "example")
    (_, i0), (_, i1) = ranks
    # `import horovod.tensorflow.keras as hvd` in the example got the binding
    assert i0["hvd_module"] == "kdist_magics.keras_horovod"
    assert i0["size"] == N
    # Different shuffles and dropout masks per rank, yet identical weights at the end.
    assert_same(ranks, "w", rtol=0, atol=1e-6)
    assert i0["iterations"] == 2 * (8 // N)
    # MetricAverageCallback: the logged loss and accuracy agree across ranks.
    for metric in ("loss", "accuracy"):
        assert i0["history"][metric] == pytest.approx(i1["history"][metric], rel=1e-6)
    assert "lr" in i0["history"]
    # Rank 0's `.keras` checkpoint reloads through hvd.load_model with a wrapped optimizer
    # that kept its state.
    assert (tmp_path / "checkpoint-2.keras").exists()
    assert not (tmp_path / "checkpoint-3.keras").exists()
    assert i0["restored_optimizer"] == "Adam" and i0["restored_is_distributed"]
    assert i0["restored_iterations"] == i0["iterations"]
    assert i0["restored_matches"]


# ---------------------------------------------------------------------------------------------
# install(): one process, no rendezvous
INSTALL_CHECK = (
    r"""
import os, sys
os.environ["KERAS_BACKEND"] = "tensorflow"
import kdist_magics.keras_horovod as kh
"""
    + python_without("tensorflow", "keras", "horovod")
    + r"""
order = sys.argv[1]
if order == "parent-first":
    import horovod.tensorflow
    import horovod.tensorflow.keras as original   # Horovod's own, already imported
    assert original.__name__ == "horovod.tensorflow.keras" and original is not kh
assert kh.keras3_active()
assert kh.install() is True and kh.install() is True and kh.is_installed()
import horovod.tensorflow.keras as hvd
assert hvd is kh, hvd
from horovod.tensorflow.keras import callbacks
import horovod.tensorflow.keras.callbacks as callbacks2
from horovod.tensorflow import keras as hvd2
import horovod.keras as hvd3
assert callbacks is callbacks2 is kh.callbacks and hvd2 is kh and hvd3 is kh
assert hvd.callbacks.BroadcastGlobalVariablesCallback.__module__ == "kdist_magics.keras_horovod.callbacks"
import horovod.tensorflow.keras.elastic as elastic1
from horovod.keras import elastic as elastic2
assert elastic1 is elastic2 is kh.elastic and elastic1.KerasState.__module__ == "kdist_magics.keras_horovod.elastic"
hvd.init(); hvd.init()
assert hvd.size() == 1 and hvd.rank() == 0 and hvd.local_rank() == 0
import keras
opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3), compression=hvd.Compression.fp16)
assert isinstance(opt, keras.optimizers.Adam)
kh.uninstall()
assert not kh.is_installed()
import horovod.tensorflow.keras as back
assert back is not kh and back.__name__ == "horovod.tensorflow.keras", back
assert "kdist_magics" not in back.DistributedOptimizer.__module__
import horovod.tensorflow
assert horovod.tensorflow.keras is back
print("OK", order)
"""
)


@needs_horovod
@pytest.mark.horovod
@pytest.mark.timeout(180)
@pytest.mark.parametrize("order", ["install-first", "parent-first"])
def test_install_resolves_horovod_keras_imports_to_the_binding(order):
    env = {**os.environ, "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    for k in [k for k in env if k.startswith("HOROVOD_")] + ["TF_USE_LEGACY_KERAS"]:
        env.pop(k, None)
    out = subprocess.run(
        [sys.executable, "-c", INSTALL_CHECK, order],
        capture_output=True,
        text=True,
        timeout=170,
        env=env,
        cwd=str(ROOT),
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"OK {order}" in out.stdout


API_CHECK = r"""
import os, sys, tempfile, warnings
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np
import kdist_magics.keras_horovod as hvd
import keras

def raises(exc, fn, *args, match="", **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as err:
        assert match in str(err), (match, str(err))
        return
    raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")

hvd.init(); hvd.init()
assert hvd.is_initialized() and hvd.size() == 1 and hvd.cross_size() == 1
assert float(hvd.allreduce([1.0, 3.0])[1]) == 3.0
assert float(hvd.broadcast(2.5, 0)) == 2.5 and hvd.allgather([[1, 2]]).shape == (1, 2)

sgd = keras.optimizers.SGD(0.1)
raises(ValueError, hvd.DistributedOptimizer, sgd, op=hvd.Adasum, match="Average and Sum")
raises(ValueError, hvd.DistributedOptimizer, sgd, groups=-1, match="groups")
raises(ValueError, hvd.DistributedOptimizer, sgd, backward_passes_per_step=0, match="> 0")
raises(TypeError, hvd.DistributedOptimizer, object(), match="Keras 3 optimizer")
wrapped = hvd.DistributedOptimizer(sgd, name="MySGD")
assert isinstance(wrapped, keras.optimizers.SGD) and type(wrapped).__name__ == "SGD"
assert wrapped.get_config() == sgd.get_config()
raises(ValueError, hvd.DistributedOptimizer, wrapped, match="already")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    hvd.DistributedOptimizer(sgd, num_groups=2)
assert any(issubclass(x.category, DeprecationWarning) for x in w)
raises(RuntimeError, hvd.broadcast_global_variables, 0, match="broadcast_variables")
raises(ValueError, hvd.load_model, "x.keras", legacy_opts=True, match="legacy")
# hvd.elastic on one rank: sync, commit, restore of the model, the optimizer and attributes
m1 = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
m1.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
state = hvd.elastic.KerasState(m1, epoch=3, note="a")
assert m1.optimizer.built and (state.epoch, state.note) == (3, "a")
w_committed = [w.copy() for w in m1.get_weights()]
m1.fit(np.ones((4, 2), "float32"), np.zeros((4, 1), "float32"), epochs=1, verbose=0)
assert int(m1.optimizer.iterations.numpy()) == 1 and not np.allclose(m1.get_weights()[0], w_committed[0])
state.epoch, state.note = 4, "b"
state.restore()
assert (state.epoch, state.note) == (3, "a") and int(m1.optimizer.iterations.numpy()) == 0
assert all(np.array_equal(a, b) for a, b in zip(m1.get_weights(), w_committed))
state.epoch = 5
state.commit(); state.epoch = 6; state.restore()
assert state.epoch == 5
raises(ValueError, hvd.elastic.KerasState, keras.Sequential([keras.layers.Dense(1)]), match="built")
calls = []
@hvd.elastic.run
def train(st, calls=calls):
    calls.append(st.epoch)
    if len(calls) == 1:  # a pending host change interrupts at a commit: reset, no restore
        from horovod.runner.elastic.worker import HostUpdateResult
        st.on_hosts_updated(1, HostUpdateResult.added)
        st.epoch = 7
        st.commit()
    return "trained"
assert train(state) == "trained" and calls == [5, 7] and hvd.size() == 1
assert hvd.elastic.hosts_added() == 0  # no run waiting: nobody to tell

# A 1-rank fit through every callback, eager (run_eagerly) with local aggregation.
x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32"); y = x.sum(1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), backward_passes_per_step=2)
model.compile(optimizer=opt, loss="mse", run_eagerly=True)
cbs = [hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=model.variables[-1]),
       hvd.callbacks.MetricAverageCallback(),
       hvd.callbacks.LearningRateScheduleCallback(0.05, multiplier=0.5, start_epoch=1)]
hist = model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=cbs)
assert int(np.asarray(opt.iterations)) == 12
# Horovod: epoch 0 is before start_epoch (untouched), then 0.05 * 0.5 ** (epoch - 1)
assert np.allclose(hist.history["lr"], [0.05, 0.05, 0.025]), hist.history["lr"]

# Momentum correction: Keras 3 bakes `momentum` into the compiled step, so the binding scales
# the momentum buffers by new_lr / old_lr instead (the same update for SGD with momentum).
for correct in (True, False):
    m3 = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    o3 = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    m3.compile(optimizer=o3, loss="mse")
    o3.build(m3.trainable_variables)
    for slot in o3.momentums:
        slot.assign(np.ones(slot.shape, "float32"))
    cb = hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=0.5, momentum_correction=correct)
    cb.set_model(m3); cb.set_params({"steps": 4, "epochs": 2})
    cb.on_train_begin(); cb.on_epoch_begin(1); cb.on_train_batch_begin(0)
    assert abs(float(np.asarray(o3.learning_rate)) - 0.05) < 1e-7
    want = 0.5 if correct else 1.0
    assert all(np.allclose(np.asarray(s), want) for s in o3.momentums), (correct, o3.momentums)
raises(ValueError, hvd.callbacks.BroadcastGlobalVariablesCallback, 0, local_variables=[1], match="variables")

# An optimizer driven by a LearningRateSchedule cannot be warmed up: clear error
sched = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
m2 = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
m2.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(sched)), loss="mse")
raises(TypeError, m2.fit, x, y, verbose=0, epochs=1,
       callbacks=[hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1)], match="LearningRateSchedule")

# .keras round trip: loads without Horovod too (same class name and config)
path = os.path.join(tempfile.mkdtemp(), "m.keras")
model.save(path)
plain = keras.models.load_model(path)
assert type(plain.optimizer) is keras.optimizers.SGD
again = hvd.load_model(path, compression=hvd.Compression.fp16)
assert isinstance(again.optimizer, keras.optimizers.SGD) and hasattr(again.optimizer, "register_local_var")
assert again.optimizer._kdist_hvd.s.compression is hvd.Compression.fp16
assert int(np.asarray(again.optimizer.iterations)) == 12
# mixed_float16: the loss-scale check must see allreduced gradients, so the distributed
# optimizer is the outer LossScaleOptimizer and compile() does not wrap it again.
keras.config.set_dtype_policy("mixed_float16")
try:
    mp = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    mopt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3))
    assert isinstance(mopt, keras.optimizers.LossScaleOptimizer) and hasattr(mopt, "_kdist_hvd")
    mp.compile(optimizer=mopt, loss="mse")
    assert mp.optimizer is mopt
    mp.fit(x, y, epochs=1, verbose=0)
finally:
    keras.config.set_dtype_policy("float32")
print("API OK")
"""


@needs_horovod
@pytest.mark.horovod
@pytest.mark.timeout(180)
def test_api_surface_errors_callbacks_and_keras_files_on_one_rank():
    env = {**os.environ, "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    for k in [k for k in env if k.startswith("HOROVOD_")] + ["TF_USE_LEGACY_KERAS"]:
        env.pop(k, None)
    out = subprocess.run(
        [sys.executable, "-c", API_CHECK], capture_output=True, text=True, timeout=170, env=env, cwd=str(ROOT)
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "API OK" in out.stdout


@needs_horovod
@pytest.mark.horovod
@pytest.mark.timeout(180)
def test_other_keras_backends_get_a_clear_error():
    pytest.importorskip("jax", reason="JAX is the other Keras backend installed here")
    code = (
        "import keras, kdist_magics.keras_horovod as hvd\n"
        "assert keras.backend.backend() == 'jax'\n"
        "try:\n    hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))\n"
        "except RuntimeError as err:\n    assert 'KERAS_BACKEND=tensorflow' in str(err), err\n"
        "    print('refused')\n"
    )
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=170, env=env, cwd=str(ROOT)
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "refused" in out.stdout


def test_install_does_nothing_when_keras2_is_active(monkeypatch):
    import kdist_magics.keras_horovod as kh

    sentinel = types.ModuleType("horovod.tensorflow.keras")
    monkeypatch.setitem(sys.modules, "horovod.tensorflow.keras", sentinel)
    # tf_keras selected the documented way
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    assert not kh.keras3_active()
    assert kh.install() is False and not kh.is_installed()
    assert sys.modules["horovod.tensorflow.keras"] is sentinel
    # an imported Keras 2
    monkeypatch.delenv("TF_USE_LEGACY_KERAS")
    fake = types.ModuleType("keras")
    fake.__version__ = "2.15.0"
    monkeypatch.setitem(sys.modules, "keras", fake)
    assert not kh.keras3_active()
    assert kh.install() is False and not kh.is_installed()
    assert sys.modules["horovod.tensorflow.keras"] is sentinel
    kh.uninstall()  # harmless when not installed
    assert sys.modules["horovod.tensorflow.keras"] is sentinel


def test_importing_the_binding_loads_no_framework():
    code = (
        "import kdist_magics.keras_horovod as hvd; "
        "assert callable(hvd.DistributedOptimizer) and hvd.Compression.fp16; "
        + python_without("tensorflow", "keras", "horovod")
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-2000:]
