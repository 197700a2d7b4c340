"""The corpus of code written for the standard launchers, and every change from it.

:data:`CORPUS` lists each piece of official code kdist runs unchanged in CI: where it is
published, how it runs (a cell, ``%kdist run``, or both), every change from the original with
its reason, what its test checks, and where that test is. Only data loading should differ;
anything else listed is a cost of running in CI (no network, no GPU, two shared cores) or of
Keras 3, not something a user has to change for kdist. The tables "What runs unchanged" in
``README.md`` and ``docs/guide/launcher-code.md`` are generated from this list
(``scripts/corpus_table.py``; a fast test here fails when they are stale).

The examples' files are in ``tests/corpus/``. They are written for this corpus in each
original's idiom -- its calls, in its order, with its structure and names -- not copied from
it; a line that differs from the original says so with a ``# corpus:`` comment.
TensorFlow's multi-worker tutorial and Horovod's Keras MNIST example were vendored earlier
(``tests/test_launcher_code.py``, ``tests/workers/hvd_keras_mnist_example.py``).

Every run checks that its ranks (or replicas) end with identical weights and that the loss fell.
Each test runs on the warm cluster of its strategy's module where there is one; this module
holds the kernel-tier ones (TensorFlow's and JAX's guides run in the notebook's process).
"""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

CORPUS_DIR = Path(__file__).parent / "corpus"


@dataclass(frozen=True)
class Example:
    name: str  # as its authors call it
    source: str  # where it is published (and its licence)
    run_as: str  # how kdist runs it in the test
    changes: tuple[tuple[str, str], ...]  # (what differs from the original, why)
    checked: str  # what the test asserts
    test: str  # the test, file::name


NO_NETWORK = "CI has no network"
DATA_LOCAL = (
    "data: MNIST's download becomes `mnist_local.load_data()`, 2048 local images of "
    "MNIST's shape and type (a bar whose height is the label)",
    NO_NETWORK,
)
CPU = "CI has no GPU (on a GPU host the original lines run, with `%config KDist.rank_gpus = 'all'`)"

CORPUS: tuple[Example, ...] = (
    Example(
        'TensorFlow\'s tutorial "Multi-worker training with Keras"',
        "tensorflow.org/tutorials/distribute/multi_worker_with_keras (Apache-2.0)",
        "its worker code as a `%%kdist --strategy multiworker --np 2` cell (its `mnist_setup.py` "
        "next to the notebook), and as `main.py` with `%kdist run`",
        (
            (
                "data: `tf.keras.datasets.mnist.load_data()` becomes `local_mnist()`, 4096 local images "
                "of MNIST's shape and type",
                NO_NETWORK,
            ),
            ("`steps_per_epoch=70` becomes 10 (its 3 epochs are kept)", "CI's time on two shared cores"),
            (
                "`model_path = '/tmp/keras-model'` becomes a `.keras` file in a test folder",
                "Keras 3 saves only `.keras` files; tests never write to a shared `/tmp` path",
            ),
            (
                "its launch (`TF_CONFIG` set by hand, `python main.py &` per worker) is not used",
                "kdist starts the workers and sets `TF_CONFIG`; the code reads it as it is",
            ),
        ),
        "identical weights on both workers, falling loss, its own `MultiWorkerMirroredStrategy()` "
        "is the run's, only the chief's model file remains and loads with those weights",
        "tests/test_multiworker.py::test_tensorflows_multi_worker_tutorial_runs_unchanged_as_a_cell",
    ),
    Example(
        'the same tutorial\'s section "Fault tolerance" (`BackupAndRestore`)',
        "tensorflow.org/tutorials/distribute/multi_worker_with_keras (Apache-2.0)",
        "the cell, worker 1 killed after the second epoch, then the same cell again",
        (
            ("as above; `backup_dir` is a test folder", "tests never write to a shared `/tmp` path"),
            ("the test appends one callback after the tutorial's", "the fault, and a record of the epochs trained"),
        ),
        "the run again trains the third epoch only, from the backup, with identical weights on "
        "both workers; only worker 0 writes the backup",
        "tests/test_multiworker.py::test_backup_and_restore_resumes_the_tutorials_training_after_a_worker_died",
    ),
    Example(
        'Keras\' guide "Multi-GPU distributed training with TensorFlow"',
        "keras.io/guides/distributed_training_with_tensorflow (Apache-2.0)",
        "the whole guide as one `%%kdist --strategy mirrored --devices 2` cell (two logical CPU "
        "devices), its section on fault tolerance included",
        (DATA_LOCAL, ("`num_val_samples` 10000 becomes 512", "of 2048 images, not MNIST's 60000")),
        "its own `MirroredStrategy()` is the run's; both replicas of every variable identical; "
        "the loss fell; the second `run_training()` restored the first's checkpoint",
        "tests/test_corpus.py::test_keras_tensorflow_guide_as_a_mirrored_cell",
    ),
    Example(
        'Keras\' guide "Multi-GPU distributed training with JAX"',
        "keras.io/guides/distributed_training_with_jax (Apache-2.0)",
        "the whole guide as one `%%kdist --strategy mirrored --devices 2` cell under "
        "`KERAS_BACKEND=jax` (two CPU devices)",
        (DATA_LOCAL,),
        "its own mesh spans the run's devices; both device copies of every variable identical; "
        "the trained model's loss under half an untrained one's. (Its `jax.device_put` of Keras "
        "variables, which JAX 0.12 refuses, works inside kdist's cells: "
        "`kdist_magics.strategies.frameworks.compat_jax.device_put_takes_keras_variables`)",
        "tests/test_corpus.py::test_keras_jax_guide_as_a_mirrored_cell",
    ),
    Example(
        'Keras\' guide "Multi-GPU distributed training with PyTorch"',
        "keras.io/guides/distributed_training_with_torch (Apache-2.0)",
        "the whole guide as a `%%kdist --strategy multiworker --np 2` cell under "
        "`KERAS_BACKEND=torch`, then as a script with `%kdist run`; its "
        "`torch.multiprocessing.start_processes(...)` runs `per_device_launch_fn` on each rank",
        (
            DATA_LOCAL,
            (
                "the CPU in place of CUDA: `num_gpu = 2` (not `torch.cuda.device_count()`), the `cpu` "
                "device, `gloo` for `nccl`, no `torch.cuda.set_device`, DDP without `device_ids`",
                CPU,
            ),
        ),
        "identical weights on both ranks (the test records the DDP model), the trained model's "
        "loss at least a quarter below an untrained one's, each rank ran `per_device_launch_fn` once, with "
        "its `LOCAL_RANK`",
        "tests/test_launcher_code.py::test_a_torchrun_script_runs_twice_as_a_cell_and_with_kdist_run",
    ),
    Example(
        "PyTorch's example `multigpu_torchrun.py` (DDP tutorial series), with a Keras model",
        "github.com/pytorch/examples, distributed/ddp-tutorial-series (BSD-3-Clause)",
        "`%kdist run --strategy multiworker --np 2 multigpu_torchrun.py 4 2`, then again with "
        "`6 2`, which resumes from its snapshot",
        (
            (
                "the model: a Keras model (`keras.Sequential`, Dense 20 -> 4) for `torch.nn.Linear(20, 1)`",
                'the corpus is about Keras code (the example says "load your model")',
            ),
            (
                "data: its `datautils.MyTrainDataset` draws random targets; here 4 classes a linear "
                "model can learn, the same on every rank",
                "a falling loss is checked",
            ),
            ("`lr` 1e-3 becomes 1e-1", "a few epochs of CI time"),
            (
                "the CPU in place of CUDA: `gloo` for `nccl`, the `cpu` device, DDP without "
                "`device_ids`, no `pin_memory`",
                CPU,
            ),
        ),
        'identical weights on both ranks, the loss fell, the second launch printed "Resuming '
        'training from snapshot" and trained only the epochs left',
        "tests/test_launcher_code.py::test_a_torchrun_script_runs_twice_as_a_cell_and_with_kdist_run",
    ),
    Example(
        "a torchrun-style script (written for the test in torchrun's idiom)",
        "this repository",
        "twice in a row as a `multiworker` cell under `KERAS_BACKEND=torch`, then `%kdist run ... train.py --epochs 4`",
        (),
        "identical weights on both ranks each time, falling loss, torchrun's variables, "
        "`sys.argv`, `--pull` of the script's globals; a script raising on rank 1 is named",
        "tests/test_launcher_code.py::test_a_torchrun_script_runs_twice_as_a_cell_and_with_kdist_run",
    ),
    Example(
        "Horovod's Keras example `tensorflow2_keras_mnist.py`",
        "github.com/horovod/horovod, examples/tensorflow2 (Apache-2.0)",
        "its 2 ranks under Horovod's own launch (a rendezvous, one process each), and with "
        "`%kdist run --strategy horovod --np 4`",
        (
            ("data: a local MNIST-shaped `.npz` (scikit-learn's digits)", NO_NETWORK),
            ("8 samples' worth of steps and 2 epochs (not 500 and 24)", "CI's time"),
            (
                "`compile()` without `experimental_run_tf_function`; checkpoints are `.keras` files",
                "Keras 3 has neither",
            ),
            (
                "two lines before it, `kdist_magics.keras_horovod.install()`",
                "what kdist does on an engine (Horovod's own launch has no kdist); under `%kdist run` it is a no-op",
            ),
        ),
        "identical weights on every rank, the loss fell, the averaged metrics agree, rank 0's "
        "checkpoint loads with the weights",
        "tests/test_horovod_elastic.py::test_horovods_keras_examples_run_with_kdist_run",
    ),
    Example(
        "Horovod's elastic Keras example `tensorflow2_keras_mnist_elastic.py`",
        "github.com/horovod/horovod, examples/elastic/tensorflow2 (Apache-2.0)",
        "`%kdist run --strategy horovod --np 4 --min-np 2 hvd_keras_mnist_elastic.py`",
        (
            DATA_LOCAL,
            ("16 steps' worth of data and 3 epochs (not 500 and 24)", "CI's time"),
            (
                "`compile()` without `experimental_run_tf_function`; checkpoints are `.keras` files; "
                "the reset callback assigns `optimizer.learning_rate`",
                "Keras 3 has neither "
                "`experimental_run_tf_function`, `.h5` checkpoints of this kind, `optimizer.lr` nor "
                "`backend.set_value`",
            ),
            ("`--use-mixed-precision`'s branch for TensorFlow before 2.4 is left out", "TensorFlow 2.16+"),
        ),
        "identical weights on every rank, the loss fell over the epochs, the state committed "
        "every batch (`hvd.elastic.KerasState`), rank 0's checkpoints written",
        "tests/test_horovod_elastic.py::test_horovods_keras_examples_run_with_kdist_run",
    ),
)


def corpus_source(name: str) -> str:
    return (CORPUS_DIR / name).read_text()


# -- fast tier ---------------------------------------------------------------------------------
def test_every_example_names_a_test_that_exists_and_every_change_a_reason():
    for example in CORPUS:
        path, name = example.test.split("::")
        assert f"def {name}(" in (Path(__file__).parent.parent / path).read_text(), example.test
        assert all(what and why for what, why in example.changes), example.name


def test_every_corpus_line_that_differs_is_marked():
    """Each corpus file says where it differs from the original (``# corpus:``), and each of
    those files is named by an example of the list."""
    for path in CORPUS_DIR.glob("*.py"):
        text = path.read_text()
        if path.name in ("mnist_local.py", "datautils.py", "__init__.py"):
            continue  # the data, which replaces the originals' downloads
        assert "not copied" in text.split("\n\n")[0], path.name
        assert "# corpus:" in text, path.name


def test_the_tables_of_what_runs_unchanged_come_from_the_corpus():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "corpus_table", Path(__file__).parent.parent / "scripts" / "corpus_table.py"
    )
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    stale = table.stale()
    assert not stale, f"run scripts/corpus_table.py: {stale} differ from tests/test_corpus.py's CORPUS"


# -- kernel tier: the guides that run in the notebook's process -----------------------------------
def run_guide(tmp_path: Path, name: str, probe: str, env: dict, unset: tuple = ()) -> dict:
    """The corpus file ``name`` as one ``%%kdist --strategy mirrored --devices 2`` cell in a
    fresh Python whose folder holds the corpus' local data (as a newcomer puts it), then
    ``probe`` (filling ``out``) where it passed; ``out["err"]``: what it raised, or None."""
    from conftest import run_in_fresh_shell

    shutil.copy(CORPUS_DIR / "mnist_local.py", tmp_path)
    r = run_in_fresh_shell(
        f"import os\nos.chdir({str(tmp_path)!r})\n"
        f"value, err = attempt('--strategy mirrored --devices 2 --no-dashboard', {corpus_source(name)!r})\n"
        "out['err'] = None if err is None else repr(err)\n"
        "if err is None:\n" + textwrap.indent(textwrap.dedent(probe), "    "),
        env,
        unset=unset,
    )
    assert r["err"] is None, r["err"] + r["_stdout"][-3000:] + r["_stderr"][-3000:]
    return r


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.timeout(500)
def test_keras_tensorflow_guide_as_a_mirrored_cell(tmp_path):
    r = run_guide(
        tmp_path,
        "keras_tf_guide.py",
        """
        import numpy as np, tensorflow as tf
        ns = ip.user_ns
        s = ns["strategy"]
        out["strategy"] = [type(s).__name__, s.num_replicas_in_sync]
        out["spread"] = [float(max(np.abs(v.numpy() - w.value.values[0].numpy()).max() for v in w.value.values))
                         for w in ns["model"].weights]
        out["copies"] = sorted({len(w.value.values) for w in ns["model"].weights})
        rec = kdist_magics.last_run()
        out["losses"] = [m["loss"] for m in rec.metrics if m.get("kind") == "epoch" and "loss" in m]
        out["status"] = rec.status
    """,
        dict(KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert r["strategy"] == ["MirroredStrategy", 2] and r["copies"] == [2] and r["status"] == "done"
    assert max(r["spread"]) == 0.0  # the two replicas of every variable are the same
    losses = r["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0] / 2, losses  # fit(2) + run_training twice
    printed = r["_stdout"]
    assert "Number of devices: 2" in printed and "Creating a new model" in printed
    assert "Restoring from ./ckpt/ckpt-1.keras" in printed  # the second run_training resumed
    assert "Mixing different" not in printed + r["_stderr"]


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.timeout(500)
def test_keras_jax_guide_as_a_mirrored_cell(tmp_path):
    r = run_guide(
        tmp_path,
        "keras_jax_guide.py",
        """
        import numpy as np, jax, keras
        ns = ip.user_ns
        state = jax.tree_util.tree_leaves(ns["train_state"])
        out["devices"] = sorted({len(a.sharding.device_set) for a in state})
        out["spread"] = max(float(np.abs(np.asarray(s.data) - np.asarray(a.addressable_shards[0].data)).max())
                            for a in state for s in a.addressable_shards)
        (x, y), _ = __import__("mnist_local").load_data()
        x = np.expand_dims(x.astype("float32"), -1)[:512]
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        out["trained"] = float(loss(y[:512], ns["model"].predict(x, verbose=0)))
        out["untrained"] = float(loss(y[:512], ns["get_model"]().predict(x, verbose=0)))
    """,
        dict(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2"),
        unset=("XLA_FLAGS",),
    )
    assert r["devices"] == [2] and r["spread"] == 0.0  # replicated on both devices, identical
    assert r["trained"] < r["untrained"] / 2, (r["trained"], r["untrained"])
    assert "Running on 2 devices" in r["_stdout"] and "Epoch 1 loss:" in r["_stdout"]
