"""One fault at one phase of a ``%%kdist`` engine run, through a real kernel.

Strategies: ``horovod``, ``multiworker`` (TensorFlow), ``jax`` and ``torch`` (multiworker
with the kernel's ``KERAS_BACKEND`` set to that). Shared by ``tests/test_fault_matrix.py`` (which asserts the outcomes) and
``benchmarks/failure_times.py --matrix`` (which prints them with their times). kdist's
phase barrier (:mod:`kdist_magics.rank.faults`) holds the kernel at the phase; the fault is done
to the processes the barrier names; the hold is released; then: what the cell gave back
and how fast, which of the processes kdist started are left, and whether the next cell
works.

Faults: ``engine-kill`` (SIGKILL the last engine), ``engine-stop`` (SIGSTOP it),
``controller-kill``, ``kernel-kill`` (SIGKILL the kernel), ``kernel-restart`` (the
notebook's "Restart kernel": a shutdown request, then a new kernel), ``port-taken``
(another process listens on a port the run chose for its workers before they bind it).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kernel_driver import PRELUDE, Kernel, alive, isolated_env, kernel_helpers, push_names, wait_gone

FAULTS = ("engine-kill", "engine-stop", "controller-kill", "kernel-kill", "kernel-restart", "port-taken")
KERNEL_FAULTS = ("kernel-kill", "kernel-restart")
GONE_WITHIN = 10.0  # a kernel that is gone takes its processes within this
CASE_BOUND = 120.0  # a case whose cell has not ended this long after the fault hangs

#: the cell of the ``stopping`` phase (held as it is about to end the engines)
STOP = "%kdist stop"
#: the cell each strategy runs: short, and its last line tells the next cell works
CELLS = {
    "horovod": (
        "%%kdist --strategy horovod --np 2 --no-dashboard --pull kd_r\n"
        "import time; time.sleep(1.5)\nkd_r = hvd.rank()\nhvd.size()"
    ),
    "multiworker": (
        "%%kdist --strategy multiworker --np 2 --no-dashboard --pull kd_r\n"
        "import time; time.sleep(1.5)\nkd_r = strategy.cluster_resolver.task_id\n"
        "strategy.num_replicas_in_sync"
    ),
    "jax": (
        "%%kdist --strategy multiworker --np 2 --no-dashboard --pull kd_r --push kd_big\n"  # KERAS_BACKEND=jax
        "import time, jax; time.sleep(1.5)\nkd_r = jax.process_index()\njax.process_count()"
    ),
    "torch": (
        "%%kdist --strategy multiworker --np 2 --no-dashboard --pull kd_r\n"  # KERAS_BACKEND=torch
        "import time, torch.distributed as dist; time.sleep(1.5)\nkd_r = dist.get_rank()\n"
        "dist.get_world_size()"
    ),
}
#: the kernel's Keras backend per strategy key (multiworker follows it)
BACKENDS = {"horovod": "tensorflow", "multiworker": "tensorflow", "jax": "jax", "torch": "torch"}


KILLED = "was killed by SIGKILL"
FROZEN = "was stopped (SIGSTOP) for 10 s"
CTRL = "the ipyparallel controller was killed by SIGKILL (killed: out of memory, or kill -9)"

#: Horovod's rank 0 aborted by Gloo after its peer died, while its values came back
GLOO_ABORT = (
    "RankDied",
    "After the cell, while its values came back: ",
    "rank 0 was killed by SIGABRT",
    "The cell had run on every rank",
)

#: strategy -> (phase, fault) -> what the cell must give: an error's name and words its
#: message must have, or "ok" (it carries on, with the right result); a list: any one of
#: those. A rank killed while Horovod is up may take the other with it (Gloo aborts, SIGABRT):
#: both are named then.
EXPECTED = {
    "horovod": {
        ("controller", "controller-kill"): ("ClusterError", "the controller was killed by SIGKILL"),
        ("engines", "engine-kill"): (
            "ClusterError",
            f"{KILLED} (killed: out of memory, or kill -9) before it registered",
        ),
        ("engines", "engine-stop"): ("ClusterError", f"{FROZEN}"),
        ("engines", "controller-kill"): ("ClusterError", "the controller was killed by SIGKILL"),
        # named where kdist meets it: preparing the engines, or reaching one already unregistered
        ("setup", "engine-kill"): ("RankDied", f"rank 1 {KILLED}", "The cell did not run"),
        ("init", "engine-kill"): ("RankDied", "While Horovod started: ", f"rank 1 {KILLED}"),
        ("init", "engine-stop"): ("RankDied", "While Horovod started: ", f"rank 1 {FROZEN}"),
        ("init", "controller-kill"): ("ControllerDied", f"While Horovod started: {CTRL}. The cell did not run"),
        ("cell", "engine-kill"): ("RankDied", f"rank 1 {KILLED}"),
        ("cell", "engine-stop"): ("RankDied", f"rank 1 {FROZEN}"),
        # rank 0 alone sends the values back; the next cell restarts. Horovod is still up on rank 0
        # here, and its Gloo loop may abort it (SIGABRT) once rank 1 is gone: then that is named
        ("pull", "engine-kill"): ["ok", GLOO_ABORT],
        ("pull", "engine-stop"): "ok",
        ("pull", "controller-kill"): (
            "ControllerDied",
            f"After the cell, while its values came back: {CTRL}. The cell had run on every rank",
        ),
        ("finishing", "engine-kill"): ["ok", GLOO_ABORT],
        ("finishing", "engine-stop"): "ok",
        ("finishing", "controller-kill"): ("ControllerDied", "After the cell, while its values came back"),
        # %kdist stop itself: it ends what it finds (a stopped engine too), whatever is already gone
        ("stopping", "engine-stop"): "ok",
        ("stopping", "controller-kill"): "ok",
    },
    "multiworker": {
        ("setup", "port-taken"): ("KDistError", "creating MultiWorkerMirroredStrategy failed: rank 1"),
        # its set-up may have finished when the hold ends: then the death is seen as the run begins
        ("init", "engine-kill"): ("RankDied", f"rank 1 {KILLED}", "The cell did not run"),
        ("cell", "engine-stop"): ("RankDied", f"rank 1 {FROZEN}"),
        ("init", "controller-kill"): ("ControllerDied", CTRL, "The cell did not run"),
        ("stopping", "engine-kill"): "ok",
    },
    "jax": {  # --pull and the value run on every rank under JAX (saving is a collective there)
        # rank 0 binds the coordinator's port (chosen free on its engine) in set-up: first, cold
        # (JAX raises "Failed to start RPC server" there, or crashes: both are named)
        ("setup", "port-taken"): [
            ("KDistError", "joining jax.distributed failed: rank 0: "),
            ("RankDied", "While jax.distributed started: rank 0 was killed by SIGSEGV"),
        ],
        # --push's segment is named in /dev/shm: an engine dies before mapping it (the name goes)
        ("push", "engine-kill"): ("RankDied", f"rank 1 {KILLED}", "The cell did not run"),
        ("init", "engine-kill"): ("RankDied", f"rank 1 {KILLED}", "The cell did not run"),
        ("init", "engine-stop"): ("RankDied", f"rank 1 {FROZEN}", "The cell did not run"),
        ("init", "controller-kill"): ("ControllerDied", CTRL, "The cell did not run"),
        ("pull", "engine-kill"): (
            "RankDied",
            "After the cell, while its values came back: ",
            f"rank 1 {KILLED}",
            "The cell had run on every rank",
        ),
    },
    "torch": {
        ("init", "engine-kill"): ("RankDied", f"rank 1 {KILLED}", "The cell did not run"),
        ("init", "engine-stop"): ("RankDied", f"rank 1 {FROZEN}", "The cell did not run"),
        ("init", "controller-kill"): ("ControllerDied", CTRL, "The cell did not run"),
        ("pull", "engine-kill"): "ok",  # rank 0 alone sends the values back
        # no port-taken case: rank 0 opens the store's socket before its port is told to anyone
    },
}

#: cases ``make test`` leaves to the tests that already do them (tests/test_horovod_engines.py:
#: a rank dying, a frozen rank, the controller killed, mid-cell) or to a case of the same code
#: path (each costs the next cell a restart); the benchmark runs them all
COVERED_ELSEWHERE = {
    ("horovod", "cell", "engine-kill"),
    ("horovod", "cell", "engine-stop"),
    ("horovod", "cell", "controller-kill"),
    # the same wait for a stopped engine as at --pull, ten seconds more CI
    ("horovod", "finishing", "engine-stop"),
    # the same wait in set-up (waiting.setup_results) as Horovod's at init
    ("jax", "init", "engine-stop"),
    ("torch", "init", "engine-stop"),
}

#: (strategy, phase, fault) with the kernel as the victim: nothing may be left 10 s later
KERNEL_CASES = [
    ("horovod", "controller", "kernel-kill"),
    ("horovod", "engines", "kernel-kill"),
    ("horovod", "init", "kernel-kill"),
    ("horovod", "cell", "kernel-restart"),
    # the kernel dies with --push's segment named: its cluster's guard removes it
    ("jax", "push", "kernel-kill"),
    ("multiworker", "init", "kernel-restart"),
]
#: kernel cases ``make test`` leaves to the benchmark: a restart is the same for every strategy
KERNEL_CASES_BENCH_ONLY = {("multiworker", "init", "kernel-restart")}


class Holds:
    """The test's side of :mod:`kdist_magics.rank.faults`: arm a phase, wait for it, release it."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def arm(self, phase: str) -> None:
        (self.dir / f"{phase}.held").unlink(missing_ok=True)
        (self.dir / phase).touch()

    def wait(self, phase: str, timeout: float = 300) -> dict:
        held = self.dir / f"{phase}.held"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if held.exists():
                try:
                    return json.loads(held.read_text())
                except ValueError:  # being written
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"kdist never reached phase {phase!r}")

    def release(self, phase: str) -> None:
        (self.dir / phase).unlink(missing_ok=True)


@dataclass
class Outcome:
    strategy: str
    phase: str
    fault: str
    error: str | None = None  # the cell's error: "RankDied: rank 1 was killed ..."
    lines: int = 0  # lines of that error's rendering (one named line is wanted)
    ok: bool = False  # the cell completed (the run carried on)
    to_outcome_s: float | None = None  # from the fault to the cell's error or end
    left: list = field(default_factory=list)  # processes kdist started still alive afterwards
    gone_s: float | None = None  # kernel faults: until the kernel's processes were all gone
    next_ok: bool | None = None  # the next cell (in the same kernel, or the restarted one)
    note: str = ""

    def row(self) -> str:
        what = (
            "the kernel went; its processes followed"
            if self.fault in KERNEL_FAULTS
            else "carried on"
            if self.ok
            else (self.error or "?")
        )
        took = f"{self.to_outcome_s:.1f} s" if self.to_outcome_s is not None else "-"
        if self.gone_s is not None:
            took = f"gone in {self.gone_s:.1f} s"
        return (
            f"{self.strategy:<11} {self.phase:<10} {self.fault:<15} {took:>13}  "
            f"next cell {'ok' if self.next_ok else 'FAILED' if self.next_ok is False else '-'}"
            f"  left {len(self.left)}  {what[:110]}"
        )


def new_kernel(tmp: Path, strategy: str = "horovod") -> tuple[Kernel, Holds]:
    holds = Holds(tmp / "holds")
    env = isolated_env(tmp / "home", KDIST_HOLD_DIR=str(holds.dir), KERAS_BACKEND=BACKENDS[strategy])
    k = Kernel(cwd=tmp, env=env)
    if strategy in PRELUDE:
        k.check(PRELUDE[strategy])
    return k, holds


def segments_gone(pid: int, within: float) -> list[str]:
    deadline = time.monotonic() + within
    while push_names(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return push_names(pid)


def victim(facts: dict) -> int | None:
    """The process an engine fault is done to: the last engine (registered, else launched)."""
    pids = facts.get("engines") or facts.get("launched") or []
    return pids[-1] if pids else None


def started(k: Kernel) -> set[int]:
    """Every process below the kernel (controller, engines, nannies, guards)."""
    return set(k.tree()) - {k.pid}


def run_case(
    strategy: str, phase: str, fault: str, tmp: Path, k: Kernel | None = None, holds: Holds | None = None
) -> tuple[Outcome, Kernel | None]:
    """Run one case; the kernel is returned for reuse (None when the fault ended it).

    A kernel handed in must have no hold armed; its engines may be warm (the phases up to
    ``engines`` need a cold start: pass none, or one after ``%kdist stop``).
    """
    out = Outcome(strategy, phase, fault)
    if k is None:
        k, holds = new_kernel(tmp, strategy)
    cell = STOP if phase == "stopping" else CELLS[strategy]
    if phase == "push":  # changed, so it is sent (an unchanged value is not: no segment then)
        k.check("kd_big = kd_big + 1")
    holds.arm(phase)
    msg_id = k.send(cell)
    facts = holds.wait(phase)
    before = started(k)  # (the kernel remembers every process seen so far)
    t_fault = time.time()
    taken = None
    try:
        if fault in ("engine-kill", "engine-stop"):
            pid = victim(facts)
            if pid is None:
                out.note = "no engine at this phase"
            else:
                os.kill(pid, signal.SIGKILL if fault == "engine-kill" else signal.SIGSTOP)
        elif fault == "controller-kill":
            os.kill(facts["controller"], signal.SIGKILL)
        elif fault == "port-taken":
            taken = take_worker_port(facts)
            out.note = f"took {taken.getsockname()}" if taken else "no port chosen at this phase"
        elif fault == "kernel-kill":
            k.kill()
        elif fault == "kernel-restart":
            holds.release(phase)  # the kernel answers its shutdown request from another thread
            k.tree()
            old = started(k) | {k.pid}
            k.km.restart_kernel(now=False)
            out.gone_s = _gone(old, out)
            k.pid = k.km.provisioner.process.pid
            k.kc.wait_for_ready(timeout=180)
            k.check("%load_ext kdist_magics")
            out.next_ok = _next_ok(k, strategy, out)
            return out, k
        if fault == "kernel-kill":
            out.gone_s = _gone(k.seen_pids - {k.pid}, out)
            out.left += segments_gone(k.pid, GONE_WITHIN)
            k.cleanup()  # (by pid) whatever a failing case left
            return out, None
        holds.release(phase)
        res = k.wait_for(msg_id, timeout=CASE_BOUND)
        if phase == "stopping":  # what it stopped must be gone, the harmed process too
            out.left, _ = wait_gone(before, GONE_WITHIN)
        out.to_outcome_s = (res.messages[-1]["received"] if res.messages else time.time()) - t_fault
        if res.ok:
            out.ok = True
        else:
            err = res.errors[0] if res.errors else {"ename": "?", "evalue": res.text[-300:], "traceback": []}
            out.error = f"{err['ename']}: {err['evalue']}"
            out.lines = len([ln for ln in err.get("traceback", []) if ln.strip()])
        out.next_ok = _next_ok(k, strategy, out)
        out.left += push_names(k.pid)  # nothing of --push stays named once the cell is over
        return out, k
    finally:
        holds.release(phase)
        if taken is not None:
            taken.close()


def _gone(pids: set[int], out: Outcome) -> float:
    left, waited = wait_gone(pids, GONE_WITHIN)
    out.left = left
    return waited


def _next_ok(k: Kernel, strategy: str, out: Outcome) -> bool:
    res = k.execute(CELLS[strategy], timeout=300)
    if not res.ok:
        out.note += f" next cell: {res.text[-300:]}"
    return res.ok and "2" in res.text


def take_worker_port(facts: dict) -> "Taken | None":
    """Listen on the port the last rank was given (multiworker's TF_CONFIG) before it binds:
    on the engines' own loopback, inside their private network when they have one."""
    addresses = facts.get("addresses") or []
    if not addresses:
        return None
    host, port = addresses[-1].rsplit(":", 1)
    return Taken(host, int(port), facts.get("netns"))


class Taken:
    """A socket listening on ``(host, port)``, held by a child process that first joins the
    network namespace of holder ``netns`` (or stays on the host's without one)."""

    CODE = (
        "import socket, sys, time\n"
        "from kdist_magics.cluster.namespace import enter\n"
        "if sys.argv[3] != 'None':\n    enter(int(sys.argv[3]))\n"
        "s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()\n"
        "print('listening', flush=True); time.sleep(3600)"
    )

    def __init__(self, host: str, port: int, netns: int | None):
        import subprocess
        import sys

        self.address = (host, port)
        self.process = subprocess.Popen(
            [sys.executable, "-c", self.CODE, host, str(port), str(netns)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        if line.strip() != "listening":
            self.close()
            raise RuntimeError(f"could not take {self.address}: {self.process.stderr.read()[-500:]}")

    def getsockname(self) -> tuple[str, int]:
        return self.address

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdout.close()
        self.process.stderr.close()


def run_strategy(strategy: str, table: dict, tmp: Path, skip=frozenset()):
    """Every case of ``table`` (``EXPECTED[strategy]``) in one kernel, in order: yields
    ``(Outcome, expected)``, leaving out the cases in ``skip``; a cold start (``%kdist stop``)
    before the phases that need one.
    Ends by checking ``%kdist stop`` leaves nothing (AssertionError otherwise)."""
    k, holds = new_kernel(tmp, strategy)
    try:
        warm = False
        for (phase, fault), expected in table.items():
            if (strategy, phase, fault) in skip:
                continue
            if phase in ("controller", "engines") and warm:
                k.check("%kdist stop")
            out, k = run_case(strategy, phase, fault, tmp, k, holds)
            warm = True
            yield out, expected
        left = leftovers(k)
        assert not left, f"left after %kdist stop: {described(left)}"
    finally:
        k.shutdown()
        k.cleanup()


def described(pids) -> list[str]:
    """Each pid with its command line (for a failure's message)."""
    import psutil

    out = []
    for pid in pids:
        try:
            out.append(f"{pid}: {' '.join(psutil.Process(pid).cmdline())[:300]}")
        except psutil.Error:
            out.append(f"{pid}: gone")
    return out


def leftovers(k: Kernel) -> list[int]:
    """Processes below the kernel once ``%kdist stop`` has run: none should be, but Python's
    own resource tracker, which lives as long as the kernel (``kernel_driver.kernel_helpers``)."""
    k.check("%kdist stop")
    pids = started(k)
    left, _ = wait_gone(pids - kernel_helpers(pids), 60)
    return left


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="kdist-faults-"))


__all__ = [
    "FAULTS",
    "CELLS",
    "EXPECTED",
    "KERNEL_CASES",
    "COVERED_ELSEWHERE",
    "Holds",
    "Outcome",
    "run_case",
    "run_strategy",
    "new_kernel",
    "leftovers",
    "alive",
    "scratch",
]
