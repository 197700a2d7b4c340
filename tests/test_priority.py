"""kdist's helpers run below the ranks' CPU priority (fast tier: real threads of this process)."""

from __future__ import annotations

import os
import threading

import pytest

from kdist_magics.cluster import priority
from kdist_magics.cluster.follow import command

pytestmark = pytest.mark.skipif(not hasattr(os, "setpriority"), reason="Linux/Unix thread nice values")


def _thread(name: str):
    started, stop = threading.Event(), threading.Event()

    def body():
        started.set()
        stop.wait(30)

    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    started.wait(5)
    return t, stop


def test_lower_raises_one_threads_nice_value_only():
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t, stop = _thread("kdist-test")
    try:
        assert priority.lower(t.native_id, by=5)
        assert priority.nice_of(t.native_id) == min(19, main + 5)
        assert priority.nice_of(threading.get_native_id()) == main  # the caller keeps its own
        assert priority.lower(t.native_id, by=0) is False  # 0: leave priorities alone
    finally:
        stop.set()


def test_lower_helpers_takes_helpers_by_name_and_leaves_the_main_and_user_threads():
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    helper, stop1 = _thread("kdist-feed")
    iopub, stop2 = _thread("IOPub")
    user, stop3 = _thread("my-data-loader")
    try:
        lowered = priority.lower_helpers(by=4)
        assert {"kdist-feed", "IOPub"} <= set(lowered) and "my-data-loader" not in lowered
        assert priority.nice_of(helper.native_id) == min(19, main + 4)
        assert priority.nice_of(iopub.native_id) == min(19, main + 4)
        assert priority.nice_of(user.native_id) == main
        assert priority.nice_of(threading.get_native_id()) == main
    finally:
        for stop in (stop1, stop2, stop3):
            stop.set()


def test_the_controller_command_carries_its_nice_value():
    cmd = command("ipyparallel.controller", pid=os.getpid(), started=1.0, nice=10)
    assert cmd[2:5] == ["kdist_magics.cluster.follow", "--nice", "10"]
    assert "--nice" not in command("ipyparallel.engine", pid=os.getpid(), started=1.0)
