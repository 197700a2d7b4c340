"""Slurm's commands as kdist uses them: submit (``sbatch``), look (``squeue``), cancel (``scancel``).

Nothing here knows about ipyparallel: :mod:`.slurm_engines` builds the engines' job from these.
Every command runs with a bound (:data:`COMMAND_TIMEOUT`), so a slurmctld that does not answer
is an error, not a hung kernel. ``python -m kdist_magics.cluster.slurm guard PID STARTED JOB`` is the
process that cancels a job when the kernel that owns it ends (even by SIGKILL).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

COMMAND_TIMEOUT = 30.0  # seconds any Slurm command may take
#: job states in which Slurm has started nothing yet, and in which it has ended the job
WAITING = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SUSPENDED")
ENDED = (
    "CANCELLED",
    "COMPLETED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "REVOKED",
    "SPECIAL_EXIT",
)


@dataclass(frozen=True)
class SlurmOptions:
    """What a ``--launcher slurm`` run passes to ``sbatch``: the named options and the free-form
    ``--sbatch`` words, in that order (Slurm takes the last of a repeated option)."""

    partition: str | None = None
    time: str | None = None
    account: str | None = None
    gres: str | None = None
    extra: tuple[str, ...] = ()

    def args(self) -> list[str]:
        named = [
            f"--{k}={v}"
            for k, v in (
                ("partition", self.partition),
                ("time", self.time),
                ("account", self.account),
                ("gres", self.gres),
            )
            if v
        ]
        return named + list(self.extra)

    @classmethod
    def of(cls, partition=None, time=None, account=None, gres=None, sbatch=None) -> "SlurmOptions":
        words = (sbatch or "").strip()
        if len(words) > 1 and words[0] == words[-1] and words[0] in "'\"":
            words = words[1:-1]  # IPython's magic arguments keep a quoted value's quotes
        return cls(partition or None, time or None, account or None, gres or None, tuple(shlex.split(words)))


@dataclass(frozen=True)
class JobState:
    """One ``squeue`` line: the state ("PENDING"), the reason ("Resources", "None"), the nodes."""

    state: str
    reason: str
    nodes: str

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def words(self) -> str:
        """``PENDING: Resources``; the state alone when Slurm gives no reason."""
        return self.state if self.reason in ("", "None", "(null)") else f"{self.state}: {self.reason}"


def run(argv: list[str]) -> subprocess.CompletedProcess:
    """A Slurm command, its output captured; a missing program or no answer is an OSError."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise OSError(
            f"`{' '.join(argv[:2])}` did not answer within {COMMAND_TIMEOUT:g} s (is slurmctld running?)"
        ) from exc


def refusal(stderr: str) -> str:
    """Slurm's own reason from a failed ``sbatch``'s stderr: its first ``error:`` line, as
    ``sbatch`` wrote it (``invalid partition specified: nope``), less the words every refusal
    starts with when it is the only line (``Batch job submission failed: ``)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.split("error:", 1)[1].strip() for line in lines if "error:" in line]
    first = (errors or lines or ["sbatch failed without saying why"])[0]
    return first.removeprefix("Batch job submission failed: ")


def job_state(job: str) -> JobState | None:
    """The job as ``squeue`` has it (finished jobs too, while Slurm keeps them: MinJobAge), or
    None once Slurm no longer knows it."""
    done = run(["squeue", "-h", "-t", "all", "-j", str(job), "-o", "%T|%r|%N"])
    line = done.stdout.strip().splitlines()[:1]
    if done.returncode != 0 or not line:
        return None
    state, reason, nodes = (line[0].split("|") + ["", ""])[:3]
    return JobState(state.strip(), reason.strip(), nodes.strip())


def cancel(job: str) -> None:
    """``scancel`` the job (a job already gone is no error)."""
    try:
        run(["scancel", str(job)])
    except OSError:
        pass


def gone(job: str, within: float = 15.0) -> bool:
    """Wait until ``squeue`` no longer lists the job as pending, running or completing."""
    deadline = time.monotonic() + within
    while True:
        try:
            state = job_state(job)
        except OSError:  # slurmctld does not answer: nothing more to learn here
            return False
        if state is None or state.ended:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)


def guard(pid: int, started: float, job: str) -> None:
    """Cancel ``job`` when process ``pid`` (created at ``started``: the kernel) ends; return on
    its own once the job has ended."""
    from .lifetime import alive

    while alive(pid, started):
        time.sleep(2.0)
        state = job_state(job)
        if state is None or state.ended:
            return
    cancel(job)


def start_guard(job: str) -> subprocess.Popen:
    """A process of its own session that cancels ``job`` when this process ends."""
    import os

    import psutil

    me = psutil.Process(os.getpid())
    return subprocess.Popen(
        [sys.executable, "-m", "kdist_magics.cluster.slurm", "guard", str(me.pid), repr(me.create_time()), str(job)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def engine(args: list[str]) -> None:
    """An engine on a job's node: ipyparallel's, run here as ``__main__`` so the process's
    command line names this module (every process kdist starts does:
    :data:`~.lifetime.STARTED`)."""
    import runpy

    sys.argv = ["ipyparallel.engine", *args]
    runpy.run_module("ipyparallel.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":  # pragma: no cover - run as the guard process, or an engine
    if sys.argv[1:2] == ["engine"]:
        engine(sys.argv[2:])
    elif sys.argv[1:2] == ["guard"]:
        guard(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
