"""kdist's words for ``--launcher slurm`` (cluster/slurm_engines.py, cluster/slurm.py). Imported
through :mod:`kdist_magics.messages`."""

from __future__ import annotations


SLURM_ENDED = {
    "CANCELLED": "the Slurm job was cancelled",
    "TIMEOUT": "the Slurm job reached its time limit",
    "NODE_FAIL": "its node failed (Slurm: NODE_FAIL)",
    "PREEMPTED": "the Slurm job was preempted",
    "OUT_OF_MEMORY": "the Slurm job ran out of memory",
    "DEADLINE": "the Slurm job missed its deadline",
}


SLURM_STEP_CANCELLED = "the Slurm job step was cancelled"


def slurm_ended(state: str | None) -> str:
    """How a job's engines ended, from the job's final state (None: Slurm no longer knows it)."""
    if state is None:
        return "the Slurm job has ended (Slurm no longer lists it)"
    return SLURM_ENDED.get(state, f"the Slurm job ended ({state})")


def slurm_submitting(n: int, controller: str) -> str:
    return f"submitting {n} engines as a Slurm job (the controller listens on {controller})..."


def slurm_refused(reason: str) -> str:
    return f"Slurm refused the engines' job: {reason}"


def slurm_queued(job: str, words: str, waited: float) -> str:
    """The queue phase's detail and ``%kdist status``: ``job 12 PENDING: Resources, 40 s``."""
    return f"Slurm job {job} {words}, waited {waited:.0f} s"


def slurm_gave_up(job: str, words: str, seconds: float) -> str:
    return f"Slurm job {job} was still {words} after --timeout {seconds:g} s; kdist cancelled it. The cell did not run"


def slurm_interrupted(job: str, words: str) -> str:
    return f"interrupted: kdist cancelled Slurm job {job} ({words})"


def slurm_ended_early(job: str, how: str, log: str) -> str:
    return f"Slurm job {job} ended before its engines registered: {how}" + (f". Its output:\n{log}" if log else "")


def slurm_loopback(address: str) -> str:
    return (
        f"--launcher slurm: the controller would listen on {address}, which no node reaches; set "
        f"%config KDist.bind_address = '<this host's address on the cluster network>'"
    )


def phase_queue(n: int) -> str:
    return f"waiting in Slurm's queue for {n} engine{'' if n == 1 else 's'}"


def unresolved_hosts(problems: dict[tuple[int, str], list[str]]) -> str:
    """Ranks that cannot resolve their peers' hostnames (``{(rank, host): [names]}``)."""
    what = "; ".join(
        f"rank {r} on {host} cannot resolve {', '.join(names)}" for (r, host), names in sorted(problems.items())
    )
    return (
        f"{what}. Horovod's Gloo finds each rank by its hostname: every node must resolve every "
        f"node's name (DNS or /etc/hosts). The cell did not run"
    )
