"""Small, offline example data for the notebooks, the README and the docs.

Everything here works without a network: scikit-learn ships the digits data set
(1,797 handwritten digits, 8x8 pixels, 10 classes) inside its own package, so
this module needs scikit-learn (``pip install scikit-learn``; the ``lab`` extra
has it) and nothing else. Importing it imports neither TensorFlow nor Keras.

    from kdist_magics.datasets import load_digits_split, build_model
    (x_train, y_train), (x_test, y_test) = load_digits_split()
    model = build_model()

``mnist_like_file()`` writes an MNIST-shaped copy (28x28 images, ``x_train`` /
``y_train`` / ``x_test`` / ``y_test`` in one ``.npz``) under ``data/`` for
notebooks that want to show the usual ``np.load("mnist.npz")`` pattern, still
offline.

Data that does not fit in the notebook: each rank reads its own files.
``shard_files(pattern)`` gives this process its part of the files (by its place on the data
axis: its Horovod or torch.distributed rank, its MultiWorkerMirroredStrategy task, its JAX
process's position on the mesh's data axis, so processes that share a position read the same
files in the same order), and ``npz_shards(files, batch_size)`` reads them as a Keras
``PyDataset`` with the same number of batches on every rank (``write_npz_shards`` writes such
files from arrays).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = [
    "load_digits_split",
    "build_model",
    "mnist_like_file",
    "describe",
    "gpu_count",
    "data_position",
    "shard_files",
    "npz_shards",
    "write_npz_shards",
]


def load_digits_split(test_fraction: float = 0.2, seed: int = 0, flat: bool = True):
    """Digits as float32 in [0, 1]: ``(x_train, y_train), (x_test, y_test)``.

    ``flat=True`` gives rows of 64 pixels (for Dense layers); ``flat=False``
    gives 8x8x1 images (for Conv2D). Labels are int32 class ids 0..9.
    The split is the same every time (``seed``).
    """
    digits = _sklearn_digits()
    x = (digits.images / 16.0).astype("float32")
    y = digits.target.astype("int32")
    x = x.reshape(len(x), -1) if flat else x[..., None]
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = int(round(len(x) * test_fraction))
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def _sklearn_digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        from .messages import NO_SKLEARN

        raise ImportError(NO_SKLEARN) from None
    return load_digits()


def build_model(hidden: int = 32, inputs: int = 64, classes: int = 10, seed: int = 0):
    """A tiny classifier: 64 pixels -> Dense(hidden, relu) -> Dense(10 logits).

    Call it *inside* a strategy's scope (a ``%%kdist`` cell does that for you)
    so its variables are created where the strategy wants them.
    """
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((inputs,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(classes),
        ],
        name="digits_mlp",
    )


def mnist_like_file(folder: str | Path = "data", name: str = "digits28.npz") -> Path:
    """Write digits as 28x28 uint8 images in MNIST's ``.npz`` layout; return the path.

    Each 8x8 digit is scaled up 3x (24x24) and padded by 2 pixels, like MNIST's
    centred 20x20 digits in a 28x28 frame. Written once, then reused.
    """
    path = Path(folder) / name
    if path.exists():
        return path
    (x_train, y_train), (x_test, y_test) = load_digits_split(flat=False)

    def to28(x):
        big = np.kron(x[..., 0], np.ones((3, 3), dtype="float32"))  # (n, 24, 24)
        big = np.pad(big, ((0, 0), (2, 2), (2, 2)))
        return (big * 255).round().astype("uint8")

    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path, x_train=to28(x_train), y_train=y_train.astype("uint8"), x_test=to28(x_test), y_test=y_test.astype("uint8")
    )
    return path


def describe(x, y) -> str:
    """One line about a data set: how many examples, their shape, the classes."""
    classes = np.unique(y)
    return (
        f"{len(x)} examples of shape {tuple(x.shape[1:])}, {x.dtype}, "
        f"{len(classes)} classes ({classes.min()}..{classes.max()})"
    )


def gpu_count() -> int:
    """NVIDIA GPUs on this machine, found without starting TensorFlow.

    NVML through kdist when ``nvidia-ml-py`` is installed, else ``nvidia-smi -L``;
    0 when neither finds any. ``CUDA_VISIBLE_DEVICES`` is not applied.
    """
    import shutil
    import subprocess

    try:
        from .hardware import detect_gpus

        found = len(detect_gpus({}))
    except Exception:
        found = 0
    if found or shutil.which("nvidia-smi") is None:
        return found
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


# -- each rank its own files ----------------------------------------------------------------


def data_position() -> tuple[int, int]:
    """``(position, positions)``: which part of the data this process reads, found from what
    runs it (nothing is started to look): a JAX process under a Keras distribution over several
    processes, its position on the data axis (``sharded`` with a model axis across processes
    gives every process on one position the same part); Horovod's rank and size; a
    ``torch.distributed`` group's rank and world size; TensorFlow's ``TF_CONFIG`` task among
    the workers (and chief); else ``(0, 1)``, every file."""
    import json
    import os
    import sys

    keras = sys.modules.get("keras")
    if keras is not None and "jax" in sys.modules:
        try:
            dist = keras.distribution.distribution()
        except Exception:  # another backend
            dist = None
        if dist is not None and getattr(dist, "batch_dim_name", None):
            import jax

            if jax.process_count() > 1:
                from .strategies.frameworks.on_jax import data_position as on_mesh

                return on_mesh(dist)
    for name in ("kdist_magics.keras_horovod", "horovod.tensorflow"):
        hvd = sys.modules.get(name)
        if hvd is not None and hvd.is_initialized():
            return hvd.rank(), hvd.size()
    torch_dist = sys.modules.get("torch.distributed")
    if torch_dist is not None and torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_rank(), torch_dist.get_world_size()
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    if config.get("cluster"):
        tasks = [("chief", i) for i in range(len(config["cluster"].get("chief", [])))]
        tasks += [("worker", i) for i in range(len(config["cluster"].get("worker", [])))]
        task = config.get("task", {})
        me = (task.get("type"), int(task.get("index", 0)))
        if me in tasks:
            return tasks.index(me), len(tasks)
    return 0, 1


def shard_files(files, position: int | None = None, positions: int | None = None) -> list[str]:
    """This process's files: every ``positions``-th of ``files`` (a glob pattern, or a list),
    sorted by name, from its ``position`` (:func:`data_position` where not given). Every
    position gets as many files (the last ``len % positions`` are left out, and said); fewer
    files than positions is an error naming both numbers."""
    from .messages import files_left_out, too_few_files, say

    names = _names(files)
    if position is None or positions is None:
        position, positions = data_position()
    if len(names) < positions:
        raise ValueError(too_few_files(len(names), files, positions))
    extra = len(names) % positions
    if extra and position == 0:
        say(files_left_out(len(names), positions, extra))
    return _part(names, position, positions)


def _names(files) -> list[str]:
    """A glob pattern's files (a ``str`` or a path), or a list's, sorted by name."""
    import glob

    if isinstance(files, (str, os.PathLike)):
        return sorted(glob.glob(os.fspath(files)))
    return sorted(os.fspath(f) for f in files)


def _part(names: list[str], position: int, positions: int) -> list[str]:
    return names[: len(names) - len(names) % positions][position::positions]


def write_npz_shards(folder: str | Path, x, y, shards: int, name: str = "part") -> list[Path]:
    """``x`` and ``y`` cut into ``shards`` files ``<name>-00000.npz``, ... (arrays ``x`` and
    ``y`` each, equal sizes but the last) in ``folder``; their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (xs, ys) in enumerate(zip(np.array_split(x, shards), np.array_split(y, shards))):
        path = folder / f"{name}-{i:05d}.npz"
        np.savez(path, x=xs, y=ys)
        paths.append(path)
    return paths


def npz_shards(files, batch_size: int, shuffle_seed: int | None = None):
    """A Keras ``PyDataset`` over this rank's part of ``files`` (a glob pattern or a list of
    ``.npz`` files holding arrays ``x`` and ``y``; the part :func:`shard_files` gives, in
    ``.files``), ``batch_size`` rows a batch within one file (a file's last rows short of a
    batch are left out), one file in memory at a time. With ``shuffle_seed``, each epoch,
    the first included, takes the files in a shuffled order and each file's batches in a
    shuffled order, alike on every rank. Every rank makes the same number of batches, the
    fewest any position's files give: every file's rows are read from its header (not its
    data), so no rank waits at a collective for one that has run out."""
    import keras

    from .messages import no_batches

    every = _names(files)
    position, positions = data_position()
    mine = shard_files(every, position, positions)
    per_file = {f: _npz_rows(f) // batch_size for f in every}
    batches = min(sum(per_file[f] for f in _part(every, p, positions)) for p in range(positions))
    if batches == 0:
        raise ValueError(no_batches(batch_size, positions))

    class NpzShards(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.files, self.epoch, self._open = mine, 0, (None,)
            self.order = _batch_order(mine, per_file, batches, shuffle_seed, 0)

        def __len__(self):
            return batches

        def on_epoch_end(self):
            self.epoch += 1
            self.order = _batch_order(mine, per_file, batches, shuffle_seed, self.epoch)

        def __getitem__(self, i):
            path, k = self.order[i]
            if self._open[0] != path:  # one file's arrays at a time
                with np.load(path) as data:
                    self._open = (path, data["x"], data["y"])
            rows = slice(k * batch_size, (k + 1) * batch_size)
            return self._open[1][rows], self._open[2][rows]

    return NpzShards()


def _batch_order(
    files: list[str], per_file: dict[str, int], batches: int, seed: int | None, epoch: int
) -> list[tuple[str, int]]:
    """The epoch's ``batches`` (file, batch in it): files in order, or shuffled (files, then
    each file's batches) with ``seed`` and ``epoch``; the first ``batches`` of them."""
    rng = np.random.default_rng((seed, epoch)) if seed is not None else None
    order = [files[i] for i in rng.permutation(len(files))] if rng is not None else list(files)
    out = []
    for f in order:
        ks = rng.permutation(per_file[f]) if rng is not None else range(per_file[f])
        out.extend((f, int(k)) for k in ks)
    return out[:batches]


def _npz_rows(path: str) -> int:
    """Rows of the ``x`` array in an ``.npz``, from its header (the data is not read)."""
    import zipfile

    from numpy.lib import format as npy

    with zipfile.ZipFile(path) as z, z.open("x.npy") as f:
        major, _ = npy.read_magic(f)
        header = npy.read_array_header_1_0 if major == 1 else npy.read_array_header_2_0
        return int(header(f)[0][0])
