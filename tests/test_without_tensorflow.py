"""Kdist where TensorFlow is not installed, as on Colab's TPU runtime (JAX 0.7.2,
Keras 3.13.2, no TensorFlow) and on a torch-only stack.

Each test runs a fresh Python with an IPython shell and kdist loaded. In ``.venv-colab-tpu``
(Colab's TPU pins, ``make test`` sets it up) TensorFlow is not installed at all; elsewhere a
``sitecustomize`` on ``PYTHONPATH`` makes every ``import tensorflow`` of that Python and of the
engines it starts fail as a missing package does (``ModuleNotFoundError: No module named
'tensorflow'``), so the main environment checks the same paths. The torch-only stack (Keras on
PyTorch, neither TensorFlow nor JAX) is ``.venv-colab-tpu``'s PyTorch 2.9 with JAX hidden the
same way: kdist sees what it would see where they are not installed. What must work there trains
and proves it (a falling loss; identical weights across processes); the TensorFlow-only paths
refuse in one line naming what to set or install, before anything starts. ``make test`` runs this
module in ``.venv-colab-tpu`` only (marker ``tfless``: the main suite and the Colab part leave it
out, for time); ``pytest tests/test_without_tensorflow.py`` runs it anywhere.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from conftest import run_in_fresh_shell

pytestmark = [pytest.mark.kernel, pytest.mark.notf, pytest.mark.tfless, pytest.mark.timeout(600)]

HIDE = '''\
"""Tests: {names} not installed here (tests/test_without_tensorflow.py): the import system finds
no package of that name, as where it is not installed."""
import importlib.machinery, sys
_HIDDEN = {hidden!r}
class _PathFinderWithout(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in _HIDDEN:
            return None
        return super().find_spec(name, path, target)
sys.meta_path[:] = [_PathFinderWithout if f is importlib.machinery.PathFinder else f
                    for f in sys.meta_path]
'''


def hiding(tmp_path, *names: str) -> dict:
    """``PYTHONPATH`` for a Python (and the engines it starts) where ``names`` cannot be
    imported: a ``sitecustomize`` whose path finder finds none of them (those not installed
    here need no hiding)."""
    import os

    hidden = sorted(n for n in names if importlib.util.find_spec(n) is not None)
    if not hidden:
        return {}
    (tmp_path / "sitecustomize.py").write_text(HIDE.format(names=", ".join(hidden), hidden=hidden))
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


FIT = """
import numpy as np, keras
rng = np.random.default_rng(0)
x = rng.normal(size=(128, 4)).astype("float32")
y = (x @ np.array([1., -2., .5, 3.], dtype="float32"))[:, None]
"""

CELL = """
import keras
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(x, y, batch_size=16, epochs=4, verbose=0)
kd_loss = history.history["loss"]
kd_replicas = strategy.num_replicas_in_sync
"""


@pytest.fixture
def no_tf(tmp_path) -> dict:
    """The environment of a Python (and its engines) where TensorFlow cannot be imported."""
    return {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", **hiding(tmp_path, "tensorflow")}


def shell(body: str, env: dict, **kw) -> dict:
    return run_in_fresh_shell(
        "ip.run_cell(" + repr(FIT) + ")\n" + textwrap.dedent(body), env, unset=("XLA_FLAGS",), **kw
    )


def test_the_plainest_cell_trains_with_auto_and_default(no_tf):
    out = shell(
        f"""
        import importlib.util
        out["tf"] = importlib.util.find_spec("tensorflow") is not None
        for line in ("--no-dashboard", "--strategy default --no-dashboard"):
            _, exc = attempt(line, {CELL!r})
            out[line] = [repr(exc), ip.user_ns.get("kd_loss"), ip.user_ns.get("kd_replicas"),
                         repr(ip.user_ns.get("strategy"))]
            ip.user_ns.pop("kd_loss", None)
        out["tf_imported"] = "tensorflow" in sys.modules
    """,
        no_tf,
    )
    assert out["tf"] is False and out["tf_imported"] is False
    for line in ("--no-dashboard", "--strategy default --no-dashboard"):
        error, loss, replicas, strategy = out[line]
        assert error == "None", (line, error)
        assert loss[-1] < loss[0] and replicas == 1 and "OneDevice" in strategy, (line, out[line])
    assert "auto chose default" in out["_stdout"]


def test_mirrored_and_sharded_train_on_jax_devices(no_tf):
    out = shell(
        f"""
        _, exc = attempt("--strategy mirrored --devices 2 --no-dashboard", {CELL!r})
        out["mirrored"] = [repr(exc), ip.user_ns.get("kd_loss"), ip.user_ns.get("kd_replicas")]
        _, exc = attempt("--strategy sharded --devices 2 --no-dashboard", {CELL!r})
        out["sharded"] = [repr(exc), ip.user_ns.get("kd_loss")]
        out["tf_imported"] = "tensorflow" in sys.modules
    """,
        no_tf,
    )
    error, loss, replicas = out["mirrored"]
    assert error == "None" and loss[-1] < loss[0] and replicas == 2, out["mirrored"]
    error, loss = out["sharded"]
    assert error == "None" and loss[-1] < loss[0], out["sharded"]
    assert out["tf_imported"] is False


def test_tensorflow_only_paths_refuse_in_one_line_before_anything_starts(no_tf):
    """On Keras' default backend (tensorflow) every strategy but sharded is a TensorFlow path; on
    jax, Horovod still is. Each refuses in one line naming what to set or install."""
    refuse = """
        import psutil
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        for line in LINES:
            _, exc = attempt(line + " --no-dashboard", "x = 1")
            out[line] = [type(exc).__name__, str(exc)]
        out["started"] = sorted({p.pid for p in psutil.Process().children(recursive=True)} - before)
    """
    on_tf = ["--strategy default", "--strategy mirrored", "--strategy multiworker --np 2", "--strategy horovod --np 2"]
    out = run_in_fresh_shell(
        f"LINES = {on_tf!r}\n" + textwrap.dedent(refuse), {**no_tf, "KERAS_BACKEND": "tensorflow"}, unset=("XLA_FLAGS",)
    )
    on_jax = shell(f"LINES = {['--strategy horovod --np 2']!r}\n" + textwrap.dedent(refuse), no_tf)
    # a TPU here (Colab's TPU runtime) with Keras left on tensorflow: TPUStrategy's path
    on_tpu = run_in_fresh_shell(
        f"LINES = {['--strategy tpu']!r}\n" + textwrap.dedent(refuse),
        {**no_tf, "KERAS_BACKEND": "tensorflow", "TPU_ACCELERATOR_TYPE": "v5litepod-8"},
        unset=("XLA_FLAGS",),
    )
    assert out["started"] == [] and on_jax["started"] == [] and on_tpu["started"] == []
    for line in on_tf:
        assert_refused(out[line], "set KERAS_BACKEND=jax (or torch) before importing keras")
    assert_refused(on_jax["--strategy horovod --np 2"], "pip install tensorflow")
    assert_refused(on_tpu["--strategy tpu"], "set KERAS_BACKEND=jax (or torch) before importing keras")


def assert_refused(outcome: list[str], fix: str) -> None:
    name, message = outcome
    assert name == "StrategyUnavailable" and "\n" not in message, outcome
    assert "needs TensorFlow, which is not installed here" in message and fix in message, message
    assert message.endswith("The cell did not run."), message


@pytest.mark.engines
def test_multiworker_on_jax_trains_in_sync_across_engines_without_tensorflow(no_tf):
    out = shell(
        f"""
        line = "--strategy multiworker --np 2 --no-dashboard --push x,y"
        _, exc = attempt(line, {CELL!r} + "\\nkd_weights = [w.tolist() for w in model.get_weights()]")
        out["error"] = repr(exc)
        out["weights"] = by_rank("kd_weights")
        out["loss"] = by_rank("kd_loss")[0]
        out["tf"] = kdist_magics._extension._strategies["multiworker"].cluster.view().apply_sync(
            lambda: __import__("sys").modules.get("tensorflow") is not None)
        ip.run_line_magic("kdist", "stop")
    """,
        no_tf,
    )
    assert out["error"] == "None", out["_stdout"][-2000:]
    first, second = out["weights"]
    assert first == second  # in sync: the same weights on both processes
    assert out["loss"][-1] < out["loss"][0]
    assert out["tf"] == [False, False]


SCRIPT = """
import os, numpy as np, keras, jax
x = np.random.default_rng(0).normal(size=(96, 4)).astype("float32")
y = (x @ np.array([1., -2., .5, 3.], dtype="float32"))[:, None]
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
kd_weights = [w.tolist() for w in model.get_weights()]
kd_loss = history.history["loss"]
kd_process = jax.process_index()
"""


@pytest.mark.engines
def test_kdist_run_trains_a_script_in_sync_without_tensorflow(no_tf, tmp_path):
    """%kdist run on Colab's TPU runtime: a Keras-on-JAX script as it is, on 2 engine processes."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = shell(
        f"""
        try:
            ip.run_line_magic("kdist", "run --strategy multiworker --np 2 --no-dashboard {script}")
            out["error"] = None
        except Exception as exc:
            out["error"] = repr(exc)
        out["weights"] = by_rank("kd_weights")
        out["loss"] = by_rank("kd_loss")[0]
        out["process"] = by_rank("kd_process")
        out["tf"] = kdist_magics._extension._strategies["multiworker"].cluster.view().apply_sync(
            lambda: __import__("sys").modules.get("tensorflow") is not None)
        ip.run_line_magic("kdist", "stop")
    """,
        no_tf,
    )
    assert out["error"] is None, out["_stdout"][-2000:]
    assert out["process"] == [0, 1]
    first, second = out["weights"]
    assert first == second  # one model on both processes
    assert out["loss"][-1] < out["loss"][0]
    assert out["tf"] == [False, False]


TORCH_CELL = CELL.replace(
    "kd_replicas = strategy.num_replicas_in_sync",
    """kd_replicas = strategy.num_replicas_in_sync
import sys
kd_frameworks = sorted(m for m in ("tensorflow", "jax") if m in sys.modules)""",
)


@pytest.mark.engines
@pytest.mark.timeout(900)
def test_a_torch_only_stack_trains_with_default_auto_and_multiworker(tmp_path):
    """Keras on PyTorch with neither TensorFlow nor JAX: the plainest cell (auto),
    ``--strategy default`` and ``--strategy multiworker --np 2`` (Keras' own torch guide as a
    cell: DistributedDataParallel over kdist's process group) train; Horovod refuses in one line."""
    pytest.importorskip("torch", reason="PyTorch is in .venv-colab-tpu and the torch extra")
    from test_multiworker_torch import GUIDE

    env = {"KERAS_BACKEND": "torch", **hiding(tmp_path, "tensorflow", "jax", "jaxlib")}
    out = shell(
        f"""
        import importlib.util
        out["found"] = [m for m in ("tensorflow", "jax", "torch") if importlib.util.find_spec(m)]
        for line in ("--no-dashboard", "--strategy default --no-dashboard"):
            _, exc = attempt(line, {TORCH_CELL!r})
            out[line] = [repr(exc), ip.user_ns.get("kd_loss"), ip.user_ns.get("kd_replicas"),
                         ip.user_ns.get("kd_frameworks")]
            ip.user_ns.pop("kd_loss", None)
        _, exc = attempt("--strategy multiworker --np 2 --no-dashboard", {GUIDE!r})
        out["multiworker"] = [repr(exc), by_rank("kd_guide_weights"), by_rank("kd_guide_loss"),
                              by_rank("kd_group")]
        out["engines"] = kdist_magics._extension._strategies["multiworker"].cluster.view().apply_sync(
            lambda: sorted(m for m in ("tensorflow", "jax") if m in __import__("sys").modules))
        _, exc = attempt("--strategy horovod --np 2 --no-dashboard", "x = 1")
        out["horovod"] = [type(exc).__name__, str(exc)]
        ip.run_line_magic("kdist", "stop")
    """,
        env,
    )
    assert out["found"] == ["torch"], out["found"]
    for line in ("--no-dashboard", "--strategy default --no-dashboard"):
        error, loss, replicas, frameworks = out[line]
        assert error == "None", (line, error, out["_stdout"][-2000:])
        assert loss[-1] < loss[0] and replicas == 1 and frameworks == [], (line, out[line])
    assert "auto chose default" in out["_stdout"]
    error, weights, losses, groups = out["multiworker"]
    assert error == "None", out["_stdout"][-3000:]
    assert weights[0] == weights[1]  # in sync: DDP kept both processes' weights identical
    assert losses[0][-1] < losses[0][0] and [g[:3] for g in groups] == [[0, 2, "gloo"], [1, 2, "gloo"]]
    assert out["engines"] == [[], []]
    assert_refused(out["horovod"], "pip install tensorflow")
