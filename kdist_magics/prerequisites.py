"""A notebook's first code cell: is everything it needs here? Found without importing it.

    from kdist_magics.prerequisites import check
    check("tensorflow", "sklearn", "horovod")   # raises MissingPrerequisites, naming the fix

Nothing here imports TensorFlow, JAX or torch (a notebook's ``--devices`` cell must still be
the first TensorFlow use), so each need is looked up with :func:`importlib.util.find_spec`
and, for Horovod, by the library file its TensorFlow part builds. ``backend:NAME`` checks
that Keras will run on NAME: ``KERAS_BACKEND`` says so, or Keras already runs on it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from .errors import KDistError


class MissingPrerequisites(KDistError):
    """Something a notebook needs is not installed (or not built); the message names the fix."""


def _python() -> str:
    return sys.executable or "python"


#: need -> (what is missing when it is not found, the one command that fixes it)
def _fixes() -> dict[str, tuple[str, str]]:
    py = _python()
    return {
        "tensorflow": ("TensorFlow is not installed", f'{py} -m pip install "tensorflow-cpu>=2.16" "keras>=3.5"'),
        "keras": ("Keras 3 is not installed", f'{py} -m pip install "keras>=3.5"'),
        "sklearn": ("scikit-learn (the example data) is not installed", f"{py} -m pip install scikit-learn"),
        "pandas": ("pandas (last_run().to_pandas) is not installed", f"{py} -m pip install pandas"),
        "matplotlib": ("matplotlib (last_run().plot) is not installed", f"{py} -m pip install matplotlib"),
        "jax": ("JAX is not installed", f'{py} -m pip install "jax[cpu]"'),
        "torch": (
            "PyTorch is not installed",
            f"{py} -m pip install torch --index-url https://download.pytorch.org/whl/cpu",
        ),
        "ray": ("Ray is not installed (--launcher ray)", f"{py} -m pip install 'kdist_magics[ray]'"),
        "horovod": (
            "Horovod is not built (its TensorFlow part)",
            f"{py} -m kdist_magics.strategies.horovod.build   (6-11 minutes; make lab does it too)",
        ),
    }


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def horovod_built() -> bool:
    """Horovod is installed with its TensorFlow library built (``horovod/tensorflow/mpi_lib*``),
    found on disk: importing ``horovod.tensorflow`` would start TensorFlow."""
    spec = importlib.util.find_spec("horovod") if _found("horovod") else None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if any((Path(folder) / "tensorflow").glob("mpi_lib*")):
            return True
    return False


def _backend_problem(name: str) -> tuple[str, str] | None:
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "backend"):
        running = keras.backend.backend()
        if running != name:
            return (
                f"Keras already runs on {running} in this kernel, not {name}",
                "restart the kernel and run this notebook from the top",
            )
        return None
    wanted = os.environ.get("KERAS_BACKEND", "tensorflow")
    if wanted != name:
        return (
            f"KERAS_BACKEND is {wanted!r}, not {name!r}",
            f'os.environ["KERAS_BACKEND"] = "{name}" before Keras is imported',
        )
    return None


def missing(*needs: str) -> dict[str, str]:
    """{what is missing: the command that fixes it} for ``needs`` (empty when all are here)."""
    fixes = _fixes()
    found: dict[str, str] = {}
    for need in needs:
        if need.startswith("backend:"):
            problem = _backend_problem(need.split(":", 1)[1])
            if problem:
                found[problem[0]] = problem[1]
            continue
        if need not in fixes:
            raise ValueError(f"unknown prerequisite {need!r}; known: {', '.join(fixes)}, backend:NAME")
        here = horovod_built() if need == "horovod" else _found(need)
        if not here:
            found[fixes[need][0]] = fixes[need][1]
    return found


def check(*needs: str) -> None:
    """Raise :class:`MissingPrerequisites` naming each missing need and its fix; else say
    in one line that everything is here."""
    from .messages import missing_prerequisites, say

    lacking = missing(*needs)
    if lacking:
        raise MissingPrerequisites(missing_prerequisites(lacking))
    say(f"prerequisites found: {', '.join(needs)}")
