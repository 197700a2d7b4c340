"""Fast tier: `make test`'s account (tests/account.py, scripts/test_account.py) from a real pytest
session on a tiny suite, with clusters counted by kdist's own hook (no engine is started)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

from conftest import ROOT

TINY = """
import os, time, pytest
from types import SimpleNamespace
from kdist_magics.cluster import launch


def test_fast_one():
    assert 1 + 1 == 2


@pytest.mark.engines
def test_starts_two_clusters():
    for owned in (True, False):
        launch.log_start(SimpleNamespace(owned=owned, n=2))
    time.sleep(0.2)


@pytest.mark.kernel
def test_fails():
    assert False
"""


def test_a_session_writes_tiers_slowest_tests_and_clusters_and_the_script_prints_them(tmp_path):
    (tmp_path / "test_tiny.py").write_text(TINY)
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "def pytest_configure(config):\n"
        "    from pathlib import Path\n    from account import Account\n"
        "    config.pluginmanager.register(Account(Path('out')), 'kdist-account')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KDIST_CLUSTER_LOG"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-o",
            "addopts=",
            "test_tiny.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout[-2000:]  # one test fails on purpose
    acc = json.loads((tmp_path / "out" / "account.json").read_text())
    assert set(acc["tiers"]) == {"fast", "engines", "kernel"}
    assert acc["tiers"]["engines"]["tests"] == 1 and acc["tiers"]["engines"]["seconds"] >= 0.2
    assert acc["clusters"]["started"] == 2 and acc["clusters"]["owned"] == 1
    assert list(acc["clusters"]["by_test"]) == ["test_tiny.py::test_starts_two_clusters"]
    assert acc["slowest"][0]["test"] == "test_tiny.py::test_starts_two_clusters"
    assert {r["test"]: r["outcome"] for r in acc["slowest"]}["test_tiny.py::test_fails"] == "failed"

    (tmp_path / "steps.tsv").write_text("set-up .venv\t180\t0\nsuite in .venv\t1500\t1\n")
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "test_account.py"),
            "steps.tsv",
            "out/account.json",
            "missing/account.json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "set-up .venv" in out and "3.0 min" in out and "25.0 min  (exit 1)" in out
    assert "engine clusters started: 2 (1 owned by kdist, 1 attached)" in out
    assert "test_tiny.py::test_fails  [failed]" in out
    assert "no account at missing/account.json: that suite did not run" in out


def test_the_cluster_log_never_fails_a_run(monkeypatch, tmp_path):
    from kdist_magics.cluster import launch

    monkeypatch.setenv("KDIST_CLUSTER_LOG", str(tmp_path / "no" / "such" / "folder" / "log"))
    launch.log_start(SimpleNamespace(owned=True, n=2))  # a folder that is not there: no error
    monkeypatch.setenv("KDIST_CLUSTER_LOG", str(tmp_path / "log"))
    launch.log_start(SimpleNamespace(owned=False, n=3))
    row = json.loads((tmp_path / "log").read_text())
    assert row["owned"] is False and row["n"] == 3 and row["pid"] == os.getpid()
