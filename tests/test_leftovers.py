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
    assert leftovers.followed(follow + ["--preload", "tensorflow", "--threads", "1", "--ranks", "2",
                                        "12", "3.5", "ipyparallel.engine"]) == (12, 3.5)
    assert leftovers.followed(follow + ["--guard", "12", "3.5", "99", "--group"]) == (12, 3.5)
    holder = [sys.executable, "-m", "kdist_magics.cluster.namespace", "12", "3.5"]
    assert leftovers.followed(holder) == (12, 3.5)
    assert leftovers.followed([sys.executable, "-c", "pass"]) is None


def _lookalike(followed_pid: int, started: float, env=None) -> subprocess.Popen:
    """A process whose command line is a kdist follower's (it only sleeps)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "kdist_magics.cluster.follow", str(followed_pid), repr(started), "m"],
                            env=env)


def test_an_orphan_is_found_and_a_live_kernels_process_of_another_session_is_not():
    import psutil

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    me = psutil.Process()
    orphan = _lookalike(gone.pid, time.time() - 5)
    other_session = _lookalike(me.pid, me.create_time(),
                               env={**os.environ, "KDIST_CLUSTER_LOG": "/elsewhere.log"})
    this_session = _lookalike(me.pid, me.create_time(),
                              env={**os.environ, "KDIST_CLUSTER_LOG": "/this-session.log",
                                   "PYTEST_CURRENT_TEST": "tests/test_x.py::test_y (call)"})
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
