"""Code written for the standard launchers runs as it is in a kdist cell and with ``%kdist run``.

Part of the corpus (tests/corpus); the whole list, with every change from the original code and
its reason, is ``CORPUS`` in ``tests/test_corpus.py`` (the README's table comes from it). Here:

1. TensorFlow's tutorial "Multi-worker training with Keras" (tensorflow.org/tutorials/
   distribute/multi_worker_with_keras, Apache-2.0): its ``mnist_setup.py`` and its worker code
   (:data:`MNIST_SETUP`, :data:`TF_TUTORIAL`), and its section "Fault tolerance"
   (:data:`TF_TUTORIAL_BACKUP`); their tests are in ``tests/test_multiworker.py``, on that
   module's warm engines.
2. A torchrun-style script (:data:`TORCH_SCRIPT`, written for this test in torchrun's idiom),
   twice as a cell, then with ``%kdist run``; on the same engines Keras' guide "Multi-GPU
   distributed training with PyTorch" as a cell and with ``%kdist run``, and PyTorch's
   ``multigpu_torchrun.py`` with a Keras model, twice (``tests/corpus/``).

What each run checks: identical final weights on every rank (synchronisation), a falling
loss, and for the script the launcher variables, ``sys.argv`` and ``--pull``.

Fast tier: the hand-back of a class, argument checks and their one-line errors, torchrun's
variables, ``start_processes`` in a rank, ``%kdist run``'s parsing and UsageErrors,
``run_main`` in the session shell.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from IPython.core.error import UsageError

import kdist_magics

from test_corpus import CORPUS_DIR

from kdist_magics.strategies.frameworks.compat_tf_strategy import handing_back, multiworker_check
from kdist_magics.errors import LauncherMismatch, ScriptExited
from kdist_magics.strategies.multiworker.run_script import help_lines, run_main, split_line
from kdist_magics.strategies.processes.launcher_env import _in_this_rank, check_world, patched, torchrun_env

# -- 1. TensorFlow's multi-worker Keras tutorial -------------------------------------------
LOCAL_MNIST = '''
def local_mnist(n=4096, seed=0):
  """MNIST's shapes and dtypes, made here (CI has no network): a bar whose height is the label."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 10, n).astype(np.uint8)
  x = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
  for i, label in enumerate(y):
    x[i, 2 * label + 4:2 * label + 7, 4:24] = 255
  return (x, y), (x[:0], y[:0])
'''

MNIST_SETUP = (
    """import os
import tensorflow as tf
import numpy as np
"""
    + LOCAL_MNIST
    + """
def mnist_dataset(batch_size):
  (x_train, y_train), _ = local_mnist()
  # The `x` arrays are in uint8 and have values in the [0, 255] range.
  # You need to convert them to float32 with values in the [0, 1] range.
  x_train = x_train / np.float32(255)
  y_train = y_train.astype(np.int64)
  train_dataset = tf.data.Dataset.from_tensor_slices(
      (x_train, y_train)).shuffle(60000).repeat().batch(batch_size)
  return train_dataset

def build_and_compile_cnn_model():
  model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(28, 28)),
      tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
      tf.keras.layers.Conv2D(32, 3, activation='relu'),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(128, activation='relu'),
      tf.keras.layers.Dense(10)
  ])
  model.compile(
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
      metrics=['accuracy'])
  return model
"""
)

TF_TUTORIAL = """import os
import json

import tensorflow as tf
import mnist_setup

per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = mnist_setup.build_and_compile_cnn_model()

multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=10)

model_path = MODEL_PATH

def _is_chief(task_type, task_id):
  # Note: there are two possible `TF_CONFIG` configurations.
  #   1) In addition to `worker` tasks, a `chief` task type is use;
  #      in this case, this function should be modified to
  #      `return task_type == 'chief'`.
  #   2) Only `worker` task type is used; in this case, worker 0 is
  #      regarded as the chief. The implementation demonstrated here
  #      is for this case.
  # For the purpose of this Colab section, the `task_type` is `None` case
  # is added because it is effectively run with only a single worker.
  return (task_type == 'worker' and task_id == 0) or task_type is None

def _get_temp_dir(dirpath, task_id):
  base_dirpath = 'workertemp_' + str(task_id)
  temp_dir = os.path.join(dirpath, base_dirpath)
  tf.io.gfile.makedirs(temp_dir)
  return temp_dir

def write_filepath(filepath, task_type, task_id):
  dirpath = os.path.dirname(filepath)
  base = os.path.basename(filepath)
  if not _is_chief(task_type, task_id):
    dirpath = _get_temp_dir(dirpath, task_id)
  return os.path.join(dirpath, base)

task_type, task_id = (strategy.cluster_resolver.task_type,
                      strategy.cluster_resolver.task_id)
write_model_path = write_filepath(model_path, task_type, task_id)

multi_worker_model.save(write_model_path)

if not _is_chief(task_type, task_id):
  tf.io.gfile.rmtree(os.path.dirname(write_model_path))
"""


def tf_tutorial(model_path: str) -> str:
    return TF_TUTORIAL.replace("MODEL_PATH", repr(model_path))


#: the tutorial's section "Fault tolerance": the same worker code, its fit with BackupAndRestore
TF_TUTORIAL_BACKUP = (
    TF_TUTORIAL.split("multi_worker_model.fit(", 1)[0]
    + """# Multi-worker training with `MultiWorkerMirroredStrategy` and `BackupAndRestore`
callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=BACKUP_DIR)]
with strategy.scope():
  multi_worker_model = mnist_setup.build_and_compile_cnn_model()
multi_worker_model.fit(multi_worker_dataset,
                       epochs=3,
                       steps_per_epoch=10,
                       callbacks=callbacks)
"""
)


def tf_tutorial_backup(backup_dir: str, extra_callback: str = "") -> str:
    """The fault-tolerance cell; ``extra_callback``: code defining ``kd_callback``, appended
    after the tutorial's own callbacks (the test's fault, or its record of the epochs)."""
    code = TF_TUTORIAL_BACKUP.replace("BACKUP_DIR", repr(backup_dir))
    if extra_callback:
        code = code.replace(
            "callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=",
            extra_callback + "\ncallbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=",
        )
        code = code.replace(
            "backup_dir=" + repr(backup_dir) + ")]", "backup_dir=" + repr(backup_dir) + "), kd_callback]"
        )
    return code


# -- 2. a torchrun-style script -------------------------------------------------------------
TORCH_SCRIPT = '''"""Train a small regression with DDP; launch with torchrun --nproc-per-node 2 train.py."""
import argparse
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_data(n=256):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32"))[:, None]
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def train(epochs):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group(backend="gloo", init_method="env://", world_size=world, rank=rank)
    torch.manual_seed(100 + rank)  # DDP starts every rank from rank 0's weights
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = DDP(model)
    dataset = make_data()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total / len(loader))
        if rank == 0:
            print(f"epoch {epoch}: loss {losses[-1]:.4f}")
    dist.destroy_process_group()
    return model, losses, local_rank


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args, _ = parser.parse_known_args()
    model, losses, local_rank = train(args.epochs)
    weights = [p.detach().numpy().tolist() for p in model.parameters()]
    seen_argv = list(sys.argv)
'''

LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


# -- fast tier -------------------------------------------------------------------------------
class Made:
    made = 0

    def __init__(self, value=0):
        Made.made += 1
        self.value = value


class MadeToo(Made):
    def __init__(self, flavour="a", value=0):
        super().__init__(value)


def test_handing_back_returns_the_run_object_and_restores_the_class():
    run = Made(7)
    seen = []
    with handing_back(Made, run, lambda klass, a, kw: seen.append((klass, a, kw))):
        assert Made() is run and Made(value=3) is run and MadeToo("b") is run
        assert run.value == 7 and Made.made == 1  # neither __init__ ran again
        assert seen == [(Made, (), {}), (Made, (), {"value": 3}), (MadeToo, ("b",), {})]
    assert Made.__init__ is Made.__dict__["__init__"] and "__init__" in MadeToo.__dict__
    other = MadeToo("c", value=5)  # the class works as before, arguments and all
    assert other is not run and other.value == 5 and Made.made == 2


def test_handing_back_lets_the_check_refuse_and_still_restores():
    def refuse(klass, args, kwargs):
        raise LauncherMismatch("no")

    with pytest.raises(LauncherMismatch):
        with handing_back(Made, Made(), refuse):
            Made()
    assert Made(1).value == 1 and MadeToo("x", 2).value == 2


class Resolver:
    def __init__(self, workers, task):
        self.workers, self.task_id = workers, task

    def cluster_spec(self):
        spec = {"worker": [f"w{i}:1" for i in range(self.workers)]}
        return type("Spec", (), {"as_dict": lambda s: spec})()


def test_a_cluster_resolver_must_describe_the_run():
    check = multiworker_check(2, 1)
    check(object, (), {})
    check(object, (Resolver(2, 1),), {})
    check(object, (None,), {"cluster_resolver": Resolver(2, None)})
    with pytest.raises(LauncherMismatch, match="asks for 4 workers.*--np 2.*give --np 4"):
        check(object, (), {"cluster_resolver": Resolver(4, 1)})
    with pytest.raises(LauncherMismatch, match="task 0.*as task 1"):
        check(object, ("AUTO", Resolver(2, 0)), {})  # the experimental alias: resolver second


def test_a_contradicting_world_size_or_rank_is_one_line_naming_np():
    check_world("init_process_group()", 2, 1, -1, None)
    check_world("init_process_group()", 2, 1, 2, 1)
    with pytest.raises(LauncherMismatch) as info:
        check_world("torch.distributed.init_process_group()", 2, 1, 4, None)
    text = str(info.value)
    assert "\n" not in text and "4 processes" in text and "give --np 4" in text
    with pytest.raises(LauncherMismatch, match="rank 5.*give --np 6 or more"):
        check_world("jax.distributed.initialize()", 2, 1, None, 5)
    with pytest.raises(LauncherMismatch, match="rank 0.*read RANK"):
        check_world("jax.distributed.initialize()", 2, 1, None, 0)


def test_torchrun_variables_for_two_hosts():
    envs = torchrun_env(["a", "b", "a", "b"], [0, 2, 1, 3], ("10.0.0.1", 29500))
    got = [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs]
    assert got == [("0", "0", "0", "2"), ("2", "0", "1", "2"), ("1", "1", "0", "2"), ("3", "1", "1", "2")]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} and {e["GROUP_WORLD_SIZE"] for e in envs} == {"2"}
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.0.0.1", "29500")}
    assert all(set(LAUNCHER_VARS) <= set(e) and e["ROLE_RANK"] == e["RANK"] for e in envs)


def test_start_processes_in_a_run_calls_fn_as_this_ranks_process():
    def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        raise AssertionError("a rank of a run starts no process")

    seen = []
    start = _in_this_rank("torch.multiprocessing.start_processes()", start_processes, local=1, here=2, world=4, hosts=2)
    assert start(lambda i, a, b: seen.append((i, a, b)), args=(7, 8), nprocs=2, start_method="fork") is None
    assert start(lambda i: seen.append(i), (), 2, False).join() is True  # join=False: a context
    assert seen == [(1, 7, 8), 1]
    with pytest.raises(LauncherMismatch) as info:
        start(print, nprocs=3)
    text = str(info.value)
    assert "3 processes on this host" in text and "give --np 6" in text and "\n" not in text
    assert "nprocs=int(os.environ['LOCAL_WORLD_SIZE'])" in text  # the other way out
    with pytest.raises(LauncherMismatch, match=r"nprocs=int\(os.environ\['LOCAL_WORLD_SIZE'\]\)"):
        start(print, nprocs=0)  # the guide's torch.cuda.device_count() on a host without GPUs


def test_patched_restores_attributes():
    holder = type("Holder", (), {"f": staticmethod(len)})
    with patched((holder, "f", abs)):
        assert holder.f is abs
    assert holder.f is len


def test_run_line_splits_kdist_options_from_the_script_and_its_arguments():
    assert split_line("--np 2 --no-dashboard train.py --epochs 3 'a b'") == (
        "--np 2 --no-dashboard",
        "train.py",
        ["--epochs", "3", "a b"],
    )
    assert split_line("--strategy=multiworker t.py") == ("--strategy=multiworker", "t.py", [])
    for line, says in (
        ("", "which script"),
        ("--np", "--np needs a value"),
        ("--bogus 1 t.py", "unknown option '--bogus'"),
        ("--np 2", "which script"),
        ("'unclosed t.py", "cannot read the line"),
    ):
        with pytest.raises(UsageError, match=says):
            split_line(line)


def test_kdist_run_usage_errors_are_one_line(ip, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n    pass\n")
    for line, says in (
        (f"run {tmp_path / 'missing.py'}", "no such file"),
        (f"run --np 0 {bad}", "--np: 0 ranks"),
        (f"run {bad}", "bad.py, line 1: SyntaxError"),
        ("run --pull 1x t.py", None),
        ("run", "which script"),
    ):
        with pytest.raises(UsageError) as info:
            ip.run_line_magic("kdist", line)
        assert "\n" not in str(info.value).strip() or line.startswith("run --pull"), str(info.value)
        if says:
            assert says in str(info.value)


def test_torch_distributed_code_under_another_backend_is_one_line_before_anything_starts(ip, tmp_path, monkeypatch):
    """A plain PyTorch DDP script under the default backend failed on every rank
    with "RANK expected, but not set", with no word of KERAS_BACKEND=torch."""
    from kdist_magics.errors import StrategyUnavailable
    from kdist_magics.strategies.frameworks import backends

    monkeypatch.setattr(backends, "keras_backend", lambda env=None: "tensorflow")
    ddp = tmp_path / "ddp.py"
    ddp.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n")
    before = set(kdist_magics._extension._strategies)
    for run in (
        lambda: ip.run_line_magic("kdist", f"run --strategy multiworker --np 2 {ddp}"),
        lambda: ip.run_cell_magic("kdist", "--strategy multiworker --np 2", ddp.read_text()),
    ):
        with pytest.raises(StrategyUnavailable) as info:
            run()
        said = str(info.value)
        assert "\n" not in said and "uses torch.distributed, but Keras' backend here is tensorflow" in said
        assert "os.environ['KERAS_BACKEND'] = 'torch'" in said and said.endswith("The cell did not run.")
    assert set(kdist_magics._extension._strategies) == before  # nothing was made, nothing started


def test_only_code_that_uses_torch_distributed_counts_not_a_comment_or_a_string():
    from kdist_magics.strategies.processes.launcher_env import uses_torch_distributed

    for code in (
        "import torch.distributed as dist",
        "from torch import distributed",
        "from torch.distributed import init_process_group",
        "import torch\ntorch.distributed.barrier()",
        "dist.init_process_group('gloo')",
        "%env X=1\nimport torch.distributed",
    ):
        assert uses_torch_distributed(code), code
    for code in (
        "# like torch.distributed's init_process_group(), but Keras",
        "import torch",
        "note = 'call init_process_group() under torchrun'",
        "x = 1  # torch.distributed",
        "def f(:",
    ):
        assert not uses_torch_distributed(code), code


def test_kdist_run_question_mark_shows_its_usage(ip, capsys):
    assert help_lines(["%kdist run?\n"]) == ["get_ipython().run_line_magic('kdist', 'run --help')\n"]
    assert help_lines(["%kdist run x.py\n"]) == ["%kdist run x.py\n"]
    ip.run_cell("%kdist run?", store_history=False)
    out = capsys.readouterr().out
    assert "%kdist run [kdist options] script.py [script args]" in out and "--np, -n N" in out


def test_run_main_runs_a_script_as_main_with_its_argv(ip, tmp_path):
    script = tmp_path / "s.py"
    source = (
        "import sys\nkd_seen = (__name__, __file__, list(sys.argv), sys.path[0])\n"
        "if __name__ == '__main__':\n    kd_main = True\n    sys.exit(0)\n"
    )
    script.write_text(source)
    argv_before, path_before = list(sys.argv), list(sys.path)
    run_main(source, str(script), ["--epochs", "3"])
    assert ip.user_ns["kd_seen"] == ("__main__", str(script), [str(script), "--epochs", "3"], str(tmp_path))
    assert ip.user_ns["kd_main"] is True and "__file__" not in ip.user_ns
    assert sys.argv == argv_before and sys.path == path_before
    with pytest.raises(ScriptExited, match="s.py exited with status 3"):
        run_main("import sys\nsys.exit(3)\n", str(script), [])
    assert sys.argv == argv_before and sys.path == path_before


@pytest.mark.kernel
def test_run_main_starts_keras_names_afresh_and_later_cells_count_on(ip, tmp_path):
    keras = pytest.importorskip("keras", reason="Keras is a core dependency")
    counted = [keras.layers.Dense(1).name for _ in range(3)]  # a warm engine has counted on
    run_main(
        "import keras\nkd_names = [keras.layers.Dense(1).name, keras.layers.Dense(1).name]\n",
        str(tmp_path / "s.py"),
        [],
    )
    assert ip.user_ns["kd_names"] == ["dense", "dense_1"]  # as in a launcher's new process
    later = keras.layers.Dense(1).name
    assert later not in counted + ["dense", "dense_1"], later  # no later name repeats one


# -- engines: the torchrun-style script twice as a cell, then with %kdist run ---------------
BODY = """
import os, tempfile
SCRIPT, VARS = {script!r}, {vars!r}
folder = tempfile.mkdtemp(prefix="kdist-run-")
path = os.path.join(folder, "train.py")
with open(path, "w") as f:
    f.write(SCRIPT)
line = "--strategy multiworker --np 2 --no-dashboard"
out["cells"] = []
for _ in range(2):
    value, err = attempt(line, SCRIPT)
    out["cells"].append(repr(err) if err is not None else [by_rank("weights"), by_rank("losses")])
value, err = attempt(line, f"import os\\nkd_env = {{{{k: os.environ[k] for k in {{VARS!r}}}}}}")
out["env"] = by_rank("kd_env") if err is None else repr(err)
try:
    ip.run_line_magic("kdist", f"run {{line}} --pull weights,losses {{path}} --epochs 4")
    out["run"] = [by_rank("weights"), by_rank("losses"), by_rank("seen_argv")]
    out["pulled"] = [ip.user_ns["weights"], ip.user_ns["losses"]]
except Exception as exc:
    out["run"] = repr(exc)
with open(os.path.join(folder, "bad.py"), "w") as f:
    f.write("import os\\n\\ndef main():\\n    if os.environ['RANK'] == '1':\\n"
            "        raise ValueError('no data on this rank')\\n\\nif __name__ == '__main__':\\n    main()\\n")
try:
    ip.run_line_magic("kdist", f"run {{line}} {{os.path.join(folder, 'bad.py')}}")
    out["failed"] = None
except Exception as exc:
    out["failed"] = [str(exc), "\\n".join(exc._render_traceback_())]
try:  # no --strategy: a launcher script runs on engines (multiworker), said in one line
    ip.run_line_magic("kdist", f"run --np 2 --no-dashboard {{path}} --epochs 1")
    out["auto"] = by_rank("seen_argv")
except Exception as exc:
    out["auto"] = repr(exc)
with open(os.path.join(folder, "strict.py"), "w") as f:
    f.write("import argparse\\np = argparse.ArgumentParser()\\np.add_argument('--epochs', type=int)\\n"
            "p.parse_args()\\n")
try:  # kdist's options after the script reach its argparse: exit 2, and a word of where they go
    ip.run_line_magic("kdist", f"run {{os.path.join(folder, 'strict.py')}} --strategy multiworker --np 2")
    out["late"] = None
except Exception as exc:
    out["late"] = str(exc)
value, err = attempt(line, "import torch.distributed as dist\\ndist.init_process_group('gloo', world_size=4)")
out["mismatch"] = str(err)
value, err = attempt(line, "import os, torch.distributed as dist\\n"
                     "dist.init_process_group('gloo', init_method='tcp://localhost:12355', world_size=2,\\n"
                     "                        rank=int(os.environ['RANK']))\\n"
                     "kd_tcp = (dist.get_rank(), dist.get_world_size())")
out["tcp"] = by_rank("kd_tcp") if err is None else repr(err)
"""

#: the corpus' torch examples (tests/test_corpus.py lists what differs), on the same engines:
#: Keras' torch guide as a cell and with %kdist run, PyTorch's multigpu_torchrun.py twice
CORPUS_BODY = '''
import shutil
for name in ("mnist_local.py", "datautils.py", "keras_torch_guide.py", "multigpu_torchrun.py"):
    shutil.copy(os.path.join(CORPUS, name), folder)
os.chdir(folder)  # the notebook's folder: the engines work there too (snapshot.pt, imports)
# the test's probe, not a change to the examples: every DDP model made on a rank is kept
value, err = attempt(line, """
import torch.nn.parallel as _tnp
if not hasattr(_tnp.DistributedDataParallel, "kd_made"):
    _tnp.DistributedDataParallel.kd_made = []
    _kd_init = _tnp.DistributedDataParallel.__init__
    def _kd_recorded(self, *args, **kwargs):
        _kd_init(self, *args, **kwargs)
        _tnp.DistributedDataParallel.kd_made.append(self)
    _tnp.DistributedDataParallel.__init__ = _kd_recorded
""")
assert err is None, repr(err)
PROBE = """
import numpy as np, torch, keras, torch.nn.parallel as _tnp
_m = _tnp.DistributedDataParallel.kd_made[-1].module
kd_w = [np.asarray(keras.ops.convert_to_numpy(v)).tolist() for v in _m.weights]
kd_made = len(_tnp.DistributedDataParallel.kd_made)
_ce = torch.nn.CrossEntropyLoss()
with torch.no_grad():
    kd_loss = [float(_ce(_m(_x), _y)), float(_ce(_fresh(_x), _y))]
"""
GUIDE_DATA = "_d = get_dataset(); _x, _y = _d.tensors[0][:512], _d.tensors[1][:512].long(); _fresh = get_model()\\n"
TORCHRUN_DATA = "_d, _fresh, _ = load_train_objs(); _x, _y = _d.x[:512], _d.y[:512]\\n"
def probe(data):
    value, err = attempt(line, data + PROBE)
    return repr(err) if err is not None else [by_rank("kd_w"), by_rank("kd_made"), by_rank("kd_loss")]
guide = open("keras_torch_guide.py").read()
value, err = attempt(line, guide)
out["guide_cell"] = repr(err) if err is not None else probe(GUIDE_DATA)
try:
    ip.run_line_magic("kdist", f"run {line} keras_torch_guide.py")
    out["guide_run"] = probe(GUIDE_DATA)
except Exception as exc:
    out["guide_run"] = repr(exc)
out["torchrun"] = []
for epochs in ("4", "6"):
    try:
        ip.run_line_magic("kdist", f"run {line} multigpu_torchrun.py {epochs} 2")
        out["torchrun"].append(probe(TORCHRUN_DATA))
    except Exception as exc:
        out["torchrun"].append(repr(exc))
value, err = attempt(line, "import torch.multiprocessing as mp\\nmp.spawn(print, nprocs=3)")
out["spawn_mismatch"] = str(err)
ip.run_line_magic("kdist", "stop")
'''


def same_weights(per_rank):
    a, b = per_rank
    for wa, wb in zip(a, b):
        np.testing.assert_allclose(np.array(wa), np.array(wb), rtol=1e-6, atol=1e-7)


@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(900)
def test_a_torchrun_script_runs_twice_as_a_cell_and_with_kdist_run():
    pytest.importorskip("torch", reason="PyTorch is in the torch extra (make test installs it)")
    from conftest import run_in_fresh_shell

    r = run_in_fresh_shell(
        BODY.format(script=TORCH_SCRIPT, vars=LAUNCHER_VARS) + f"CORPUS = {str(CORPUS_DIR)!r}\n" + CORPUS_BODY,
        env={"KERAS_BACKEND": "torch"},
    )
    for cell in r["cells"]:  # init_process_group() joined, destroy_process_group() did not break
        assert not isinstance(cell, str), cell + r["_stderr"][-3000:]
        weights, losses = cell
        same_weights(weights)
        assert losses[0][-1] < losses[0][0] / 2, losses
    env = r["env"]
    assert [e["RANK"] for e in env] == ["0", "1"] and [e["LOCAL_RANK"] for e in env] == ["0", "1"]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) for e in env} == {("2", "2", "0")}
    assert env[0]["MASTER_ADDR"] == env[1]["MASTER_ADDR"] and env[0]["MASTER_PORT"] == env[1]["MASTER_PORT"]
    assert not isinstance(r["run"], str), r["run"] + r["_stderr"][-3000:]
    weights, losses, argv = r["run"]
    same_weights(weights)
    assert len(losses[0]) == 4 and losses[0][-1] < losses[0][0] / 2  # --epochs 4 reached argparse
    assert argv[0][1:] == ["--epochs", "4"] and argv[0][0].endswith("train.py")
    same_weights([r["pulled"][0], weights[0]])  # --pull brought rank 0's globals
    said, shown = r["failed"]  # a raising rank is named, its traceback points into the file
    shown = re.sub(r"\x1b\[[0-9;]*m", "", shown)
    assert said.startswith("rank 1: ValueError: no data on this rank"), said
    assert "bad.py" in shown and "raise ValueError" in shown, shown
    # the traceback starts at one short line, not the whole script pasted as one
    assert "def main():" not in shown.split("bad.py")[0], shown
    auto = r["auto"]  # %kdist run without --strategy ran on the engines
    assert not isinstance(auto, str), auto
    assert [a[1:] for a in auto] == [["--epochs", "1"]] * 2
    assert "no --strategy given, so train.py runs under --strategy multiworker" in r["_stdout"]
    late = r["late"]
    assert late and "exited with status 2" in late and "--strategy reached the script" in late, late
    assert "--np 4" in r["mismatch"] and "4 processes" in r["mismatch"], r["mismatch"]
    assert r["tcp"] == [[0, 2], [1, 2]], r["tcp"]
    # the corpus: Keras' torch guide (its start_processes ran per_device_launch_fn once on each
    # rank), then PyTorch's multigpu_torchrun.py, the second launch resuming from its snapshot
    made = 0
    for key, run in (
        ("guide_cell", r["guide_cell"]),
        ("guide_run", r["guide_run"]),
        ("torchrun 4", r["torchrun"][0]),
        ("torchrun 6", r["torchrun"][1]),
    ):
        assert not isinstance(run, str), key + ": " + run + r["_stderr"][-3000:]
        weights, count, (loss, _) = run
        same_weights(weights)
        made += 1
        assert count == [made, made], (key, count)  # one DDP model per rank per run
        trained, untrained = loss
        assert trained < 0.75 * untrained, (key, loss)  # at least a quarter below untrained
    printed = r["_stdout"]
    assert "Epoch 2/2, Loss:" in printed  # the guide's loop, printed by rank 0
    assert "Resuming training from snapshot at Epoch 2" in printed
    assert "[GPU0] Epoch 5 |" in printed and "[GPU0] Epoch 1 |" in printed
    assert "give --np 3" in r["spawn_mismatch"] and "3 processes on this host" in r["spawn_mismatch"]


def test_pull_of_a_name_the_script_binds_only_inside_main_is_said_before_it_runs():
    """--pull model of a script whose model lives inside main() failed the run after
    training; the script is read first, and the line says that only its globals travel."""
    from kdist_magics.strategies.multiworker.run_script import not_global

    script = (
        "import keras\nSTEPS = 3\ndef main():\n    model = keras.Sequential()\n    global history\n"
        "    history = model\nfor epoch in range(2):\n    last = epoch\nif __name__ == '__main__':\n"
        "    main()\n"
    )
    assert not_global(script, ["model", "history", "STEPS", "last", "keras", "main", "absent"]) == ["model", "absent"]
