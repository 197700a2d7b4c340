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
    assert "scripts/setup.sh --browser" in commands and "-m pytest" in commands


def test_ci_calls_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make lab" in readme
