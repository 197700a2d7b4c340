"""The one rule for kdist's own lines in a notebook: ``say()``.

Jupyter shows a cell's stderr in the error style (red), so where a ``kdist:`` line goes says how
serious it is. News -- what kdist does for the user and why ("starting 2 engines...",
"restarting the engines (an engine died)", "auto chose ...", "leaving out the last 1 of 257
samples") -- goes to **stdout**. Only a warning, something the user should act on or may be
surprised by later ("the run stopped mid-way; ... may be out of step"), goes to **stderr**.
Errors are exceptions (:mod:`kdist_magics.errors`), never printed lines.
"""

from __future__ import annotations

import sys

PREFIX = "kdist: "


def say(text: str, *, warn: bool = False) -> None:
    """Write ``kdist: <text>`` as one line: to stdout, or to stderr when ``warn``."""
    lead = text[: len(text) - len(text.lstrip("\n"))]  # a leading newline ends a progress bar first
    stream = sys.stderr if warn else sys.stdout
    stream.write(f"{lead}{PREFIX}{text.lstrip(chr(10))}\n")
    stream.flush()


def lost_batches(n: int) -> str:
    """The words for telemetry batches that did not arrive: the record's summary, the dashboard's
    static view and its live widget (which gets them in its state) all use these."""
    return (f"{n} telemetry batch{'' if n == 1 else 'es'} lost in transit: curves and last_run() "
            f"have gaps there (training was not affected)")


def world_resized(before: int, after: int) -> str:
    """An elastic run's size change, as the summary, the dashboard and the progress line say it."""
    return f"world size {before} \u2192 {after}"


def went_on_without(lost: dict[int, str], size: int, before: int) -> str:
    """The line kdist prints when an elastic run re-forms without ranks ``lost`` ({rank: how})."""
    what = "; ".join(f"rank {r} {how}" for r, how in sorted(lost.items()))
    return (f"{what}: going on with {size} ranks ({world_resized(before, size)}) from the last "
            f"commit; the next cell starts a full set of engines")


def too_few_left(size: int, min_np: int) -> str:
    return f"only {size} ranks left, fewer than --min-np {min_np}"


def died_after(deaths: dict[int, str]) -> str:
    """An engine ended after the cell had run on every rank: the cell's work stands."""
    what = "; ".join(f"rank {r} {how}" for r, how in sorted(deaths.items()))
    return f"{what} after the cell had run on every rank; engines restart with the next %%kdist cell"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)}"


def resized_summary(before: int, after: int, resizes: list[dict]) -> str:
    """What an elastic run's size changes were, for ``last_run().summary()``."""
    gone = sorted(r for e in resizes for r in e["lost"])
    came = sorted(r for e in resizes for r in e.get("added", []))
    what = [f"lost {_ranks(gone)}"] * bool(gone) + [f"{_ranks(came)} joined"] * bool(came)
    return f"{world_resized(before, after)} ({'; '.join(what)})"


def resized_note(before: int, resizes: list[dict]) -> str:
    """The dashboard's line for an elastic run whose size changed."""
    gone = sorted(r for e in resizes for r in e["lost"])
    came = sorted(r for e in resizes for r in e.get("added", []))
    parts = [f"{_ranks(gone)} lost; the others went on from the last commit"] * bool(gone)
    parts += [f"{_ranks(came)} joined at a commit"] * bool(came)
    return f"elastic: {world_resized(before, resizes[-1]['size'])}, " + "; ".join(parts)


# -- the phases of a run, as the dashboard and last_run().phases name them ----------------
def phase_engines(n: int) -> str:
    return f"starting {n} engine{'' if n == 1 else 's'}"


def registered(k: int, n: int) -> str:
    return f"{k} of {n} registered"


def phase_setup(what: str) -> str:
    return f"setting up {what}"


PHASE_CELL = "running the cell"
PHASE_TRAINING = "training"
PHASE_FINISHING = "finishing"


def straggler(rank: int, ratio: float, own_s: float, others_s: float,
              cpu_percent: float | None) -> str:
    """A rank clearly slower than the others (dashboard and ``last_run().summary()``)."""
    cpu = f", CPU {cpu_percent:.0f} %" if cpu_percent is not None else ""
    return (f"rank {rank}: steps {ratio:.1f}x the others' median ({own_s * 1e3:.0f} ms vs "
            f"{others_s * 1e3:.0f} ms of its own work per step){cpu}")


def tensorboard_line(directory: str) -> str:
    return (f"writing every rank's metrics for TensorBoard to {directory}/rank<N> "
            f"(%tensorboard --logdir {directory})")


# -- %kdist start -----------------------------------------------------------------------
def warm_started(n: int, strategy: str, modules: tuple[str, ...]) -> str:
    what = f" and importing {', '.join(modules)} there" if modules else ""
    return (f"starting {n} {strategy} engines in the background{what}; the first %%kdist "
            f"--strategy {strategy} cell uses them (%kdist status says how far it got)")


def warm_waiting(n: int) -> str:
    return f"waiting for the {n} engines %kdist start is warming..."


def warm_used(n: int, ready_for: float) -> str:
    return f"using the {n} engines %kdist start warmed (ready {ready_for:.0f} s before this cell)"


def warm_failed(error: str) -> str:
    return f"%kdist start did not finish ({error}); starting the engines now"


#: what stays open to other local users, per engine strategy (README: "On a shared host")
EXPOSED = {"horovod": "the ranks' Gloo pairs", "multiworker": "TensorFlow's gRPC workers",
           "jax": "the JAX coordinator and Gloo pairs", "torch": "torch's TCPStore and Gloo pairs"}


def shared_host(uids: list[int], exposed: str, no_namespace: str | None = None) -> str:
    """Other users are here and the engines share their loopback: the private network is off
    (``no_namespace`` None) or this host gives none (``no_namespace`` says why)."""
    who = ", ".join(str(u) for u in uids[:5]) + (" ..." if len(uids) > 5 else "")
    mend = (f"this host gives kdist no private network ({no_namespace}): for a private run use a "
            f"container or an exclusive node" if no_namespace else
            "KDist.private_network = True (the default) gives the engines a network of their own")
    return (f"other users have processes on this host (uid {who}): kdist's own listeners serve "
            f"only you, but {exposed} accept connections from anyone here; {mend} "
            f"(README: On a shared host)")


# -- --launcher slurm ---------------------------------------------------------------------
SLURM_ENDED = {"CANCELLED": "the Slurm job was cancelled", "TIMEOUT": "the Slurm job reached its time limit",
               "NODE_FAIL": "its node failed (Slurm: NODE_FAIL)", "PREEMPTED": "the Slurm job was preempted",
               "OUT_OF_MEMORY": "the Slurm job ran out of memory", "DEADLINE": "the Slurm job missed its deadline"}


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
    return (f"Slurm job {job} was still {words} after --timeout {seconds:g} s; kdist cancelled it. "
            f"The cell did not run")


def slurm_ended_early(job: str, how: str, log: str) -> str:
    return f"Slurm job {job} ended before its engines registered: {how}" + (f". Its output:\n{log}" if log else "")


def slurm_loopback(address: str) -> str:
    return (f"--launcher slurm: the controller would listen on {address}, which no node reaches; set "
            f"%config KDist.bind_address = '<this host's address on the cluster network>'")


def phase_queue(n: int) -> str:
    return f"waiting in Slurm's queue for {n} engine{'' if n == 1 else 's'}"


def unresolved_hosts(problems: dict[tuple[int, str], list[str]]) -> str:
    """Ranks that cannot resolve their peers' hostnames (``{(rank, host): [names]}``)."""
    what = "; ".join(f"rank {r} on {host} cannot resolve {', '.join(names)}"
                     for (r, host), names in sorted(problems.items()))
    return (f"{what}. Horovod's Gloo finds each rank by its hostname: every node must resolve every "
            f"node's name (DNS or /etc/hosts). The cell did not run")
