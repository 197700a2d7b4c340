"""``--launcher slurm``: an owned cluster whose engines are one Slurm job.

kdist starts the controller on this host (as for a local cluster, ending with the kernel),
listening on ``KDist.bind_address`` (an address every node reaches), and submits the engines
through ipyparallel's Slurm launcher with a batch script of its own (:data:`BATCH`: one
``srun`` task per engine; ``--partition/--time/--account/--gres`` and ``--sbatch`` go on the
``sbatch`` command line). kdist owns the job: it watches it with ``squeue`` (ipyparallel 9.2
never polls a batch job, so a job that waits or ends would go unseen), shows the queue as a
phase, cancels it on ``%kdist stop``, a restart, an interrupt, the kernel's exit and, through
a guard process (:func:`.slurm.start_guard`), the kernel's death. A job's end names its
engines' deaths (``rank 1 on node2: the Slurm job was cancelled``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
import subprocess
import time
import uuid

from ipyparallel.cluster.launcher import SlurmEngineSetLauncher
from traitlets import List, Unicode

from . import slurm
from . import launch
from .cluster import EngineCluster
from .lifetime import process_tree
from ..errors import ClusterError
from ..messages import (
    SLURM_STEP_CANCELLED,
    phase_engines,
    phase_queue,
    slurm_ended,
    slurm_ended_early,
    slurm_gave_up,
    slurm_interrupted,
    slurm_loopback,
    slurm_queued,
    slurm_refused,
)

#: the engines' batch script (ipyparallel fills in the braces); TensorFlow's C++ INFO lines off
#: unless the kernel's environment sets them (as for local engines: cluster/follow.py)
BATCH = """#!/bin/sh
#SBATCH --job-name=kdist-engines
#SBATCH --ntasks={n}
#SBATCH --output={output_file}
#SBATCH --export=ALL
export TF_CPP_MIN_LOG_LEVEL="${{TF_CPP_MIN_LOG_LEVEL:-1}}"
srun --kill-on-bad-exit=0 {program_and_args}
"""
#: what slurmstepd writes to the job's output when ``scancel JOB.STEP`` ends the engines' step
STEP_CANCELLED = re.compile(r"\*\*\* STEP \S+ ON \S+ CANCELLED AT")
LOOK_EVERY = 1.0  # seconds between squeue looks while the job waits, and while it runs


class SlurmEngines(SlurmEngineSetLauncher):
    """ipyparallel's Slurm engine launcher with kdist's batch script, its ``sbatch`` options on
    the command line (ipyparallel 9.2 ignores its ``options`` trait), the script kept in the
    profile folder (not the notebook's), and Slurm's own words when ``sbatch`` refuses."""

    batch_template = Unicode(BATCH)
    sbatch_args = List(Unicode())
    #: each engine as ``python -m kdist_magics.cluster.slurm engine ...`` (ipyparallel's engine
    #: run as it is), so its command line says kdist started it (:data:`.lifetime.STARTED`)
    engine_cmd = List([sys.executable, "-m", "kdist_magics.cluster.slurm", "engine"], config=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_file = os.path.join(self.profile_dir, "log", f"kdist-{self.cluster_id}.sbatch")
        self.output_file = os.path.join(self.profile_dir, "log", f"kdist-{self.cluster_id}.out")

    def find_args(self):
        return ["sbatch", *self.sbatch_args, self.batch_file]

    def _run_command(self, command, **kwargs):
        done = subprocess.run(
            command, capture_output=True, text=True, env=kwargs.get("env"), timeout=slurm.COMMAND_TIMEOUT
        )
        if done.returncode != 0 and command[0] == "sbatch":
            raise ClusterError(slurm_refused(slurm.refusal(done.stderr)))
        return done.stdout


class SlurmCluster(EngineCluster):
    """An owned :class:`~.cluster.EngineCluster` whose engines are a Slurm job (see module doc).

    ``options``: :class:`~.slurm.SlurmOptions`; ``queue_timeout``: seconds the job may wait in
    the queue (None: as long as Slurm keeps it; the run's ``--timeout``)."""

    launcher = "slurm"

    loopback = False  # the ranks are on the job's nodes

    def __init__(
        self,
        n: int,
        options: slurm.SlurmOptions,
        ip: str,
        start_timeout: float = 120.0,
        queue_timeout: float | None = None,
        controller_nice: int = 0,
    ):
        super().__init__(n, ip=ip, start_timeout=start_timeout, controller_nice=controller_nice)
        self.options = options
        self.queue_timeout = queue_timeout
        self.job: str | None = None
        self.job_state: slurm.JobState | None = None
        self.submitted = 0.0
        self._guard: subprocess.Popen | None = None
        self._given_up = False
        self._last_look = 0.0
        self.news = None  # how kdist tells the user what it does (the run's ``say``)

    def _before_start(self) -> None:
        if ipaddress.ip_address(self.ip).is_loopback:
            raise ClusterError(slurm_loopback(self.ip))
        self._given_up = False

    def _start_owned(self) -> None:
        """The controller here, the engines a Slurm job (:class:`SlurmEngines`), waited for in
        the queue."""
        import ipyparallel as ipp

        self.cluster_id = self.cluster_id or f"kdist-{uuid.uuid4().hex[:10]}"
        self.cluster = ipp.Cluster(
            n=self.n,
            cluster_id=self.cluster_id,
            controller_ip=self.ip,
            controller_args=launch.heartbeat_args(),
            log_level=40,
            shutdown_atexit=True,
            engines=SlurmEngines,
            config=launch.config(self.controller_nice),
        )
        self.cluster.start_controller_sync()
        self._exits.attach(self.cluster)
        self._pids_started |= set(self._process_tree_pids())
        self.cluster.start_engines_sync(sbatch_args=self.options.args())
        self._submitted(self._launcher().job_id)
        self.client = self.cluster.connect_client_sync()
        self._wait_in_queue()

    def _interrupted_start(self) -> None:
        """Stop, and say what became of the job (submitted, pending, running)."""
        job, state = self.job, self.job_state
        self.stop()
        if job is not None and self.news is not None:
            self.news(slurm_interrupted(job, state.words() if state is not None else "submitted"))

    def _start_failed(self, exc: Exception) -> ClusterError:
        return launch.start_failed(self, exc, "as a Slurm job")

    def _after_start(self) -> None:
        self._pids_started = set(self._process_tree_pids())  # the engines' pids are the nodes'

    def _launcher(self):
        return next(iter(self.cluster.engines.values()))

    def _submitted(self, job: str) -> None:
        self.job, self.submitted = str(job), time.monotonic()
        self._guard = slurm.start_guard(self.job)

    def _wait_in_queue(self) -> None:
        """Until Slurm runs the job: each look's state and reason to :attr:`on_detail`; the job
        ending, ``queue_timeout`` or :meth:`give_up` end the wait with an error."""
        queued = False
        while True:
            state = self.job_state = slurm.job_state(self.job)
            waited = time.monotonic() - self.submitted
            if state is None or state.ended:
                raise ClusterError(slurm_ended_early(self.job, slurm_ended(state and state.state), self._output()))
            if not state.waiting:
                if queued and self.on_phase is not None:  # the queue phase ends: engines start
                    self.on_phase(phase_engines(self.n))
                return
            if not queued and self.on_phase is not None:
                self.on_phase(phase_queue(self.n))
            queued = True
            if self.on_detail is not None:
                self.on_detail(slurm_queued(self.job, state.words(), waited))
            if self._given_up:
                raise ClusterError("stopped while the Slurm job waited in the queue")
            if self.queue_timeout is not None and waited >= self.queue_timeout:
                raise ClusterError(slurm_gave_up(self.job, state.words(), self.queue_timeout))
            time.sleep(LOOK_EVERY)

    def give_up(self) -> None:
        self._given_up = True

    def _output(self) -> str:
        try:
            with open(self._launcher().output_file, errors="replace") as f:
                return f.read()[-1500:].strip()
        except (OSError, StopIteration, AttributeError):
            return ""

    def _starting_trouble(self) -> str | None:
        if trouble := super()._starting_trouble():
            return trouble
        if self._given_up:
            return "stopped while the engines registered"
        if (how := self._job_ended()) is not None:
            return slurm_ended_early(self.job, how, self._output())
        return None

    def _job_ended(self) -> str | None:
        """How the job ended (:func:`.messages.slurm_ended`), or None while it runs; squeue is
        asked at most every :data:`LOOK_EVERY` s."""
        if self.job is None:
            return None
        now = time.monotonic()
        if now - self._last_look >= LOOK_EVERY or self.job_state is None:
            self._last_look = now
            try:
                self.job_state = slurm.job_state(self.job)
            except OSError:
                return None
            if self.job_state is None:
                return slurm_ended(None)
        if not self.job_state.ended:
            return None
        if self.job_state.state in ("FAILED", "COMPLETED") and STEP_CANCELLED.search(self._output()):
            return SLURM_STEP_CANCELLED  # the batch script went on after its srun was cancelled
        return slurm_ended(self.job_state.state)

    def dead(self, settle: bool = False) -> dict[int, str]:
        if (how := self._job_ended()) is not None:
            return {e.engine_id: f"on {e.hostname}: {how}" for e in self.engines}
        return super().dead(settle)

    def signal(self, signum: int, engine_ids=None) -> None:
        """As for any cluster, unless the job has ended: ipyparallel would wait for ever for
        engines that cannot answer."""
        if self._job_ended() is None:
            super().signal(signum, engine_ids)

    def kill(self, engine_ids=None) -> None:
        """The engines are the job's: cancel it (the next cell submits a new one)."""
        if self.job is not None:
            slurm.cancel(self.job)

    def _local(self, engine) -> bool:
        from .machine import same_machine

        return same_machine(engine)

    def _gone_words(self, engine) -> str:
        return (
            f"on {engine.hostname} left the cluster (its controller unregistered it: it ended, "
            f"or stopped answering ipyparallel's heartbeat; Slurm job {self.job})"
        )

    def _process_tree_pids(self) -> list[int]:
        """The controller's processes only: the engines run on the job's nodes."""
        pid = self.processes()["controller"]
        return sorted(process_tree({pid})) if pid else []

    def stop(self) -> None:
        """Cancel the job (and wait until Slurm has ended it), then stop the controller."""
        job, self.job = self.job, None
        if job is not None:
            slurm.cancel(job)
            slurm.gone(job)
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.kill()
            guard.wait()
        self.engines = []
        super().stop()

    def status(self) -> dict:
        facts = super().status()
        if self.job is not None:
            state = self.job_state
            words = state.words() if state is not None else "submitted"
            if state is not None and state.waiting:
                words = slurm_queued(self.job, words, time.monotonic() - self.submitted)
            else:
                words = f"Slurm job {self.job} {words}" + (f" on {state.nodes}" if state and state.nodes else "")
            facts["slurm"] = words
        return facts


def submit(n: int, ctx, news) -> SlurmCluster:
    """The run's Slurm cluster, not yet started (``news``: how kdist tells what it does)."""
    from ..messages import slurm_submitting

    address = ctx.options.bind_address
    news(slurm_submitting(n, address))
    cluster = SlurmCluster(
        n, ctx.spec.slurm, ip=address, queue_timeout=ctx.spec.timeout, controller_nice=ctx.options.helper_nice
    )
    cluster.news = news
    return cluster
