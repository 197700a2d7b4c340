"""Nothing kdist starts outlives the test session that started it: a pytest plugin (loaded by
conftest).

At the end of a session it lists the processes kdist started that are still alive -- the
controller, engines and their children (``python -m kdist_magics.cluster.follow ...``: forked
children keep that command line), the follow guards and the private networks' holders
(``kdist_magics.cluster.namespace``) -- and fails the session when any is left once a grace
period has passed, naming each with the test that started it and killing it. A process is this
session's when its environment carries this session's ``KDIST_CLUSTER_LOG``
(:mod:`account`: kernels, engines and their children inherit it), or when the process it
follows is gone (an orphan, whoever started it). The same for network namespaces the tests
made (``ip netns`` names starting ``kdist-``) and shared-memory segments named ``kdist`` in
``/dev/shm``, by the process whose pid their name carries (``kdist-<pid>-...``: the session's
own pytest for a namespace, the kernel for a ``--push`` segment): one named by this session, or
by a process that is gone, is left behind; one whose maker still runs belongs to another session
running beside this one (``make test`` runs three), which checks its own.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from kdist_magics.cluster.lifetime import STARTED, started_kind

#: the modules every process kdist starts runs under: the package's one list, which each
#: launcher's module is in (kdist_magics.cluster.lifetime.STARTED)
MODULES = tuple(STARTED)
GRACE = 60.0  # seconds for processes already ending, and names their makers are removing
#: set by scripts/test.sh for one make test: its last look counts only that run's processes
RUN = "KDIST_TEST_RUN"


def followed(cmdline: list[str]) -> tuple[int, float] | None:
    """``(pid, started)`` of the process a kdist process follows, from its command line (a
    Slurm job's guard: ``guard PID STARTED JOB``; an engine on a Slurm node follows nobody
    here: None)."""
    try:
        rest = cmdline[cmdline.index(started_kind(cmdline)) + 1 :]
        if rest[:1] == ["guard"]:
            rest = rest[1:]
        while rest and rest[0].startswith("--"):  # --guard alone; --netns N, --nice N, ...
            rest = rest[1:] if rest[0] == "--guard" else rest[2:]
        return int(rest[0]), float(rest[1])
    except (ValueError, IndexError):
        return None


def kdist_processes(log: str | None, run: str | None = None) -> list[dict]:
    """This session's kdist processes still alive (see the module doc); with ``run``, those of
    one ``make test`` (their environment's ``KDIST_TEST_RUN``) instead."""
    import psutil

    from kdist_magics.cluster.lifetime import alive

    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE or not any(m in cmd for m in MODULES):
            continue
        try:
            env = proc.environ()
        except psutil.Error:
            env = {}
        target = followed(cmd)
        orphan = target is not None and not alive(*target)
        mine = env.get(RUN) == run if run else (log and env.get("KDIST_CLUSTER_LOG") == log) or orphan
        if mine:
            found.append(
                {
                    "pid": proc.pid,
                    "cmd": " ".join(cmd)[:200],
                    "test": env.get("PYTEST_CURRENT_TEST", "(no test)").rsplit(" (", 1)[0],
                }
            )
    return found


def namespaces() -> list[str]:
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split()[0] for line in out.stdout.splitlines() if line.startswith("kdist-")]


def segments() -> list[str]:
    shm = Path("/dev/shm")
    return sorted(p.name for p in shm.glob("*kdist*")) if shm.is_dir() else []


def maker(name: str) -> int | None:
    """The pid a ``kdist-...`` name carries, if any."""
    for part in name.split("-")[1:]:
        if part.isdigit():
            return int(part)
    return None


def in_use(name: str) -> bool:
    """Made by a process of another session that still runs (see the module doc)."""
    import psutil

    pid = maker(name)
    if pid is None or pid == os.getpid():
        return False
    return psutil.pid_exists(pid)


class Leftovers:
    def __init__(self):
        self.before: set[str] = set()

    def pytest_sessionstart(self, session):
        self.before = set(namespaces()) | set(segments())  # another session's, in use now

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        log = os.environ.get("KDIST_CLUSTER_LOG")
        deadline = time.monotonic() + GRACE
        while True:  # processes and names alike get the grace to go
            left = kdist_processes(log)
            others = [n for n in namespaces() + segments() if n not in self.before and not in_use(n)]
            if not (left or others) or time.monotonic() >= deadline:
                break
            time.sleep(1)
        if not left and not others:
            return
        import psutil

        lines = [f"pid {p['pid']} started by {p['test']}: {p['cmd']}" for p in left]
        lines += [f"{name} (a network namespace or /dev/shm segment)" for name in others]
        for p in left:
            try:
                psutil.Process(p["pid"]).kill()
            except psutil.Error:
                pass
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "kdist left these behind after the session:\n  " + "\n  ".join(lines)
        if reporter is not None:
            reporter.write_sep("=", "left behind", red=True)
            reporter.write_line(text)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def main(argv: list[str]) -> int:
    """``python tests/leftovers.py``: make test's last look. Lists the processes kdist started
    during this ``make test`` (``KDIST_TEST_RUN`` in their environment) still alive once
    ``GRACE`` has passed; exit 1 where any is."""
    run = os.environ.get(RUN)
    if not run:
        print("leftovers: KDIST_TEST_RUN is not set (scripts/test.sh sets it)")
        return 2
    deadline = time.monotonic() + GRACE
    while (left := kdist_processes(None, run)) and time.monotonic() < deadline:
        time.sleep(1)
    for p in left:
        print(f"pid {p['pid']} started by {p['test']}: {p['cmd']}")
    return 1 if left else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
