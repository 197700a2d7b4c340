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
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["load_digits_split", "build_model", "mnist_like_file", "describe", "gpu_count"]


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
    return keras.Sequential([
        keras.Input((inputs,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(classes),
    ], name="digits_mlp")


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
    np.savez_compressed(path, x_train=to28(x_train), y_train=y_train.astype("uint8"),
                        x_test=to28(x_test), y_test=y_test.astype("uint8"))
    return path


def describe(x, y) -> str:
    """One line about a data set: how many examples, their shape, the classes."""
    classes = np.unique(y)
    return (f"{len(x)} examples of shape {tuple(x.shape[1:])}, {x.dtype}, "
            f"{len(classes)} classes ({classes.min()}..{classes.max()})")


def gpu_count() -> int:
    """NVIDIA GPUs on this machine, found without starting TensorFlow.

    NVML through kdist when ``nvidia-ml-py`` is installed, else ``nvidia-smi -L``;
    0 when neither finds any. ``CUDA_VISIBLE_DEVICES`` is not applied.
    """
    import shutil
    import subprocess

    try:
        from .choose.hardware import detect_gpus

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
