"""What the in-kernel strategies share about Keras' backend and devices.

One rule for "which backend is Keras on" (:func:`keras_backend`, used by the advisor, the
strategy table and every strategy), the check that a strategy can drive it, and the default
number of logical CPU devices for data parallelism on a machine without accelerators.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Mapping

from ...errors import StrategyUnavailable, no_tensorflow

#: replicas on a CPU-only machine when neither --devices nor KDist.devices is given
CPU_DEFAULT_DEVICES = 2


def keras_backend(env: Mapping[str, str] | None = None) -> str:
    """Keras' backend, without importing Keras: the loaded Keras's own answer; else what Keras
    would choose when imported: ``KERAS_BACKEND``, then ``keras.json`` under ``KERAS_HOME``
    (default ``~/.keras``), then ``tensorflow``."""
    keras = sys.modules.get("keras")
    if keras is not None:
        try:
            return keras.backend.backend()
        except Exception:  # a Keras still importing
            pass
    env = os.environ if env is None else env
    if env.get("KERAS_BACKEND"):
        return env["KERAS_BACKEND"]
    home = env.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            return str(json.load(f).get("backend") or "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def tensorflow_installed() -> bool:
    """Whether TensorFlow can be imported here (without importing it)."""
    if "tensorflow" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        return False


def require_tensorflow(what: str) -> None:
    """StrategyUnavailable, in one line naming the fix, where ``what`` (a TensorFlow path: "--strategy
    horovod") is asked for and TensorFlow is not installed; checked before anything starts."""
    if not tensorflow_installed():
        raise no_tensorflow(what, keras_backend())


def check_backend(strategy: str) -> str:
    """The Keras backend, or StrategyUnavailable when ``strategy`` cannot drive it (on Keras'
    tensorflow backend: TensorFlow must be installed)."""
    backend = keras_backend()
    if backend not in ("tensorflow", "jax"):
        raise StrategyUnavailable(
            f"--strategy {strategy} drives Keras on tensorflow or jax; this kernel's Keras runs on "
            f"{backend} (set KERAS_BACKEND before importing keras). The cell did not run."
        )
    if backend == "tensorflow":
        require_tensorflow(f"--strategy {strategy} on Keras' tensorflow backend")
    return backend
