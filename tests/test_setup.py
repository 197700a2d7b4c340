"""Fast tier: the set-up commands the README promises (dry runs; `make test` itself runs the rest)."""

import os
import shutil
import subprocess

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def dry_run(target: str) -> str:
    out = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_lab_sets_up_then_serves_notebooks_on_loopback():
    commands = dry_run("lab")
    assert "scripts/setup.sh" in commands
    assert "jupyter lab --notebook-dir=notebooks" in commands and "--ServerApp.ip=127.0.0.1" in commands
    # as root (containers, CI machines) Jupyter refuses to start without --allow-root
    assert ("--allow-root" in commands) == (os.geteuid() == 0)


def test_make_test_sets_up_with_the_browser_then_runs_pytest():
    commands = dry_run("test")
    assert "KDIST_REQUIRE_HOROVOD=1 bash scripts/setup.sh --browser" in commands and "-m pytest" in commands


def test_make_test_runs_again_on_colabs_stack():
    lines = dry_run("test").splitlines()
    colab = [i for i, ln in enumerate(lines) if "scripts/setup.sh --env colab" in ln]
    runs = [i for i, ln in enumerate(lines) if ".venv-colab/bin/python -m pytest" in ln]
    assert colab and runs and colab[0] < runs[0], lines
    # the classic-Notebook (ipywidgets 7) browser test runs there, and no Horovod test
    assert "or classic" in lines[runs[0]] and "not horovod" in lines[runs[0]]
    assert "test-output/colab" in lines[runs[0]]  # its artefacts beside, not over, the main run's


def test_ci_calls_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make lab" in readme


def test_every_tier_isolates_ipython_and_jupyter_state_with_one_helper(tmp_path, monkeypatch):
    from kernel_driver import STATE_DIRS, isolated_env

    monkeypatch.setenv("KERAS_BACKEND", "jax")
    env = isolated_env(tmp_path / "a", PYTHONUNBUFFERED="1")
    for var, sub in STATE_DIRS:
        assert env[var] == str(tmp_path / "a" / sub) and (tmp_path / "a" / sub).is_dir()
    assert env["KERAS_BACKEND"] == "jax" and env["PYTHONUNBUFFERED"] == "1"  # a default, kept
    assert "KERAS_BACKEND" not in isolated_env(tmp_path / "b", keras_backend=None)  # notebooks
    monkeypatch.delenv("KERAS_BACKEND")
    assert isolated_env(tmp_path / "c")["KERAS_BACKEND"] == "tensorflow"
    target = {"HOME": "/nowhere"}
    assert isolated_env(tmp_path / "d", env=target) is target and target["IPYTHONDIR"].startswith(str(tmp_path))
    # and this very test process runs isolated (conftest used the same helper)
    assert not os.environ["IPYTHONDIR"].startswith(os.path.expanduser("~/.ipython"))
