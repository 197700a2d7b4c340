"""A notebook's first cell: kdist_magics.prerequisites names what is missing and the one
command that fixes it, without importing TensorFlow, JAX or torch. Fast tier."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kdist_magics import prerequisites
from kdist_magics.prerequisites import MissingPrerequisites, check, missing


def test_a_missing_package_is_named_with_its_install_command(monkeypatch):
    real = prerequisites._found
    monkeypatch.setattr(prerequisites, "_found", lambda m: m != "torch" and real(m))
    lacking = missing("torch", "sklearn")
    assert list(lacking) == ["PyTorch is not installed"]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in lacking["PyTorch is not installed"]
    with pytest.raises(MissingPrerequisites) as err:
        check("torch")
    text = "".join(err.value._render_traceback_())
    assert "PyTorch is not installed" in text and "pip install torch" in text and "Traceback" not in text


def test_horovod_counts_as_built_only_with_its_tensorflow_library(monkeypatch, tmp_path):
    package = tmp_path / "horovod"
    (package / "tensorflow").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "horovod", raising=False)
    assert not prerequisites.horovod_built()  # installed, but its TensorFlow part not built
    assert "kdist_magics.strategies.horovod.build" in missing("horovod")["Horovod is not built (its TensorFlow part)"]
    (package / "tensorflow" / "mpi_lib.cpython-313-x86_64-linux-gnu.so").write_bytes(b"")
    assert prerequisites.horovod_built() and missing("horovod") == {}


def test_the_backend_is_checked_from_the_environment_before_keras_starts(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.delitem(sys.modules, "keras", raising=False)
    lacking = missing("backend:jax")
    assert list(lacking) == ["KERAS_BACKEND is 'tensorflow', not 'jax'"]
    assert 'os.environ["KERAS_BACKEND"] = "jax"' in lacking["KERAS_BACKEND is 'tensorflow', not 'jax'"]
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert missing("backend:jax") == {}
    with pytest.raises(ValueError, match="unknown prerequisite"):
        missing("tensorflw")


def test_checking_imports_no_framework():
    probe = (
        "import sys; from kdist_magics.prerequisites import missing; "
        "missing('tensorflow', 'jax', 'torch', 'horovod', 'sklearn', 'backend:tensorflow'); "
        "bad = [m for m in ('tensorflow', 'keras', 'jax', 'torch') if m in sys.modules]; "
        "assert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
