"""Fast tier: the session check that nothing kdist started is left (tests/leftovers.py) sees an
orphan, reads every kdist command line, and leaves alone what another live kernel follows."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import leftovers


def test_the_followed_process_is_read_from_every_kind_of_kdist_command_line():
    follow = [sys.executable, "-m", "kdist_magics.cluster.follow"]
    assert leftovers.followed(follow + ["12", "3.5", "ipyparallel.engine"]) == (12, 3.5)
    assert leftovers.followed(follow + ["--netns", "7", "--nice", "10", "12", "3.5", "m"]) == (12, 3.5)
    assert leftovers.followed(
        follow + ["--preload", "tensorflow", "--threads", "1", "--ranks", "2", "12", "3.5", "ipyparallel.engine"]
    ) == (12, 3.5)
    assert leftovers.followed(follow + ["--guard", "12", "3.5", "99", "--group"]) == (12, 3.5)
    holder = [sys.executable, "-m", "kdist_magics.cluster.namespace", "12", "3.5"]
    assert leftovers.followed(holder) == (12, 3.5)
    slurm = [sys.executable, "-m", "kdist_magics.cluster.slurm"]
    assert leftovers.followed(slurm + ["guard", "12", "3.5", "4711"]) == (12, 3.5)  # a job's guard
    assert leftovers.followed(slurm + ["engine", "--file=x.json"]) is None  # on a node: follows nobody
    assert leftovers.followed([sys.executable, "-c", "pass"]) is None


def _lookalike(followed_pid: int, started: float, env=None) -> subprocess.Popen:
    """A process whose command line is a kdist follower's (it only sleeps)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "kdist_magics.cluster.follow",
            str(followed_pid),
            repr(started),
            "m",
        ],
        env=env,
    )


def test_an_orphan_is_found_and_a_live_kernels_process_of_another_session_is_not():
    import psutil

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    me = psutil.Process()
    orphan = _lookalike(gone.pid, time.time() - 5)
    other_session = _lookalike(me.pid, me.create_time(), env={**os.environ, "KDIST_CLUSTER_LOG": "/elsewhere.log"})
    this_session = _lookalike(
        me.pid,
        me.create_time(),
        env={
            **os.environ,
            "KDIST_CLUSTER_LOG": "/this-session.log",
            "PYTEST_CURRENT_TEST": "tests/test_x.py::test_y (call)",
        },
    )
    try:
        time.sleep(0.5)
        found = {p["pid"]: p["test"] for p in leftovers.kdist_processes("/this-session.log")}
        assert orphan.pid in found and this_session.pid in found
        assert found[this_session.pid] == "tests/test_x.py::test_y"  # the test that started it
        assert other_session.pid not in found  # another session's, following a live process
    finally:
        for p in (orphan, other_session, this_session):
            p.kill()
            p.wait()


def test_every_python_m_kdist_starts_is_a_kind_the_check_counts():
    """The check counts the kinds in kdist_magics.cluster.lifetime.STARTED: every module kdist
    starts as ``python -m`` (in an argument list, or a launcher's engine command) is there, so a
    new launcher cannot be forgotten."""
    import re
    from pathlib import Path

    from kdist_magics.cluster.lifetime import STARTED

    package = Path(leftovers.__file__).resolve().parents[1] / "kdist_magics"
    started = set()
    for path in package.rglob("*.py"):
        started |= set(re.findall(r'"-m",\s*"(kdist_magics\.[\w.]+)"', path.read_text()))
    assert started, "no python -m found: the pattern no longer reads the code"
    assert started <= set(STARTED), sorted(started - set(STARTED))
    assert {"kdist_magics.cluster.slurm", "kdist_magics.cluster.follow"} <= started


def test_the_last_look_counts_only_this_runs_processes():
    """make test's last look (python tests/leftovers.py) reads KDIST_TEST_RUN: a process of
    this run is named, another run's (or another user's kdist) is not."""
    import psutil

    me = psutil.Process()
    ours = _lookalike(me.pid, me.create_time(), env={**os.environ, leftovers.RUN: "run-a"})
    theirs = _lookalike(me.pid, me.create_time(), env={**os.environ, leftovers.RUN: "run-b"})
    slurm = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "kdist_magics.cluster.slurm", "engine", "--file=x"],
        env={**os.environ, leftovers.RUN: "run-a"},
    )
    try:
        time.sleep(0.5)
        found = {p["pid"] for p in leftovers.kdist_processes(None, "run-a")}
        assert ours.pid in found and slurm.pid in found and theirs.pid not in found
    finally:
        for p in (ours, theirs, slurm):
            p.kill()
            p.wait()


def test_names_get_the_same_grace_as_processes(monkeypatch, tmp_path):
    """A /dev/shm name whose maker is ending an instant before the session ends is not a
    leftover while it goes within the grace: the check looks again, as for processes."""
    looks = []

    def names():
        looks.append(1)
        return ["kdist-999999-0a1b"] if len(looks) < 3 else []

    monkeypatch.setattr(leftovers, "namespaces", lambda: [])
    monkeypatch.setattr(leftovers, "segments", names)
    monkeypatch.setattr(leftovers, "kdist_processes", lambda log, run=None: [])
    monkeypatch.setattr(leftovers.time, "sleep", lambda s: None)

    class Session:
        exitstatus = 0
        config = type("C", (), {"pluginmanager": type("P", (), {"get_plugin": lambda self, n: None})()})()

    session = Session()
    leftovers.Leftovers().pytest_sessionfinish(session, 0)
    assert session.exitstatus == 0 and len(looks) == 3  # gone on the third look: not failed
