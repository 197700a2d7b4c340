"""The one place kdist's words live, and the one rule for its own lines in a notebook: ``say()``.

The words of ``--strategy sharded``, ``--launcher slurm``, ``--launcher ray``, ``--push``, an
elastic run and ``%kdist scale`` are in :mod:`.sharded`, :mod:`.slurm`, :mod:`.ray`, :mod:`.push`,
:mod:`.elastic` and :mod:`.scale` beside this module, imported here: every word is
``kdist_magics.messages.NAME``.

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
    return (
        f"{n} telemetry batch{'' if n == 1 else 'es'} lost in transit: curves and last_run() "
        f"have gaps there (training was not affected)"
    )


def died_after(deaths: dict[int, str]) -> str:
    """An engine ended after the cell had run on every rank: the cell's work stands."""
    what = "; ".join(f"rank {r} {how}" for r, how in sorted(deaths.items()))
    return f"{what} after the cell had run on every rank; engines restart with the next %%kdist cell"


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


def straggler(rank: int, ratio: float, own_s: float, others_s: float, cpu_percent: float | None) -> str:
    """A rank clearly slower than the others (dashboard and ``last_run().summary()``)."""
    cpu = f", CPU {cpu_percent:.0f} %" if cpu_percent is not None else ""
    return (
        f"rank {rank}: steps {ratio:.1f}x the others' median ({own_s * 1e3:.0f} ms vs "
        f"{others_s * 1e3:.0f} ms of its own work per step){cpu}"
    )


def tensorboard_line(directory: str) -> str:
    return f"writing every rank's metrics for TensorBoard to {directory}/rank<N> (%tensorboard --logdir {directory})"


# -- %kdist start -----------------------------------------------------------------------
def warm_started(n: int, strategy: str, modules: tuple[str, ...]) -> str:
    what = f" and importing {', '.join(modules)} there" if modules else ""
    return (
        f"starting {n} {strategy} engines in the background{what}; the first %%kdist "
        f"--strategy {strategy} cell uses them (%kdist status says how far it got)"
    )


def warm_waiting(n: int) -> str:
    return f"waiting for the {n} engines %kdist start is warming..."


def warm_used(n: int, ready_for: float) -> str:
    return f"using the {n} engines %kdist start warmed (ready {ready_for:.0f} s before this cell)"


def warm_failed(error: str) -> str:
    return f"%kdist start did not finish ({error}); starting the engines now"


#: what stays open to other local users, per engine strategy (docs: guide/shared-hosts.md)
EXPOSED = {
    "horovod": "the ranks' Gloo pairs",
    "multiworker": "TensorFlow's gRPC workers",
    "jax": "the JAX coordinator and Gloo pairs",
    "torch": "torch's TCPStore and Gloo pairs",
}


def shared_host(uids: list[int], exposed: str, no_namespace: str | None = None) -> str:
    """Other users are here and the engines share their loopback: the private network is off
    (``no_namespace`` None) or this host gives none (``no_namespace`` says why)."""
    who = ", ".join(str(u) for u in uids[:5]) + (" ..." if len(uids) > 5 else "")
    mend = (
        f"this host gives kdist no private network ({no_namespace}): for a private run use a "
        f"container or an exclusive node"
        if no_namespace
        else "KDist.private_network = True (the default) gives the engines a network of their own"
    )
    return (
        f"other users have processes on this host (uid {who}): kdist's own listeners serve "
        f"only you, but {exposed} accept connections from anyone here; {mend} "
        f"(docs: User guide, Shared hosts)"
    )


#: the example data (kdist_magics.datasets) without scikit-learn, which ships the digits
NO_SKLEARN = (
    "the example data (scikit-learn's digits, bundled with scikit-learn, no download) "
    "needs scikit-learn, which is not installed here. Install it with: "
    "pip install scikit-learn"
)


def missing_prerequisites(missing: dict[str, str]) -> str:
    """What a notebook's first cell says when something it needs is missing: one line per
    thing, each with the one command that fixes it ({what: command})."""
    lines = [f"this notebook needs {len(missing)} thing{'s' if len(missing) != 1 else ''} this environment lacks:"]
    lines += [f"  - {what}: {command}" for what, command in missing.items()]
    return "\n".join(lines)


def cell_timed_out(seconds: float) -> str:
    """An in-kernel cell stopped by ``--timeout`` (the engines' words: errors.RunTimedOut)."""
    return (
        f"the run exceeded --timeout {seconds:g} s, so kdist interrupted the cell; "
        f"the kernel is ready for the next cell"
    )


def backend_changed(strategy: str, before: str, now: str) -> str:  # engines that follow it
    return (
        f"Keras' backend is now {now} (it was {before} for the running {strategy} engines): "
        f"starting new engines for {now}"
    )


def ranks_changed(n: int, had: int, attached: bool) -> str:  # another N on running engines
    return f"{n} rank{'s' if n != 1 else ''} requested; " + (
        f"taking {n} of the attached cluster's engines (had {had})"
        if attached
        else f"restarting the engines (had {had})"
    )


def restarting_engines(why: str) -> str:
    return f"restarting the engines ({why})"


def interrupted_start(n: int) -> str:  # Stop while engines started: nothing is left of them
    return f"Stop: the start of {n} engine{'s' if n != 1 else ''} was cut short; nothing it started is left"


def interrupted(stopped: list[int]) -> str:  # the one line after Stop during an engine run
    return (
        f"Stop: {len(stopped)} rank{'s' if len(stopped) != 1 else ''} stopped; what the cell "
        f"made so far stays on the ranks (and in last_run())"
    )


#: under the dashboard's curves: what a point of a training curve is
CURVES_NOTE = (
    "training curves: at each step, Keras' running mean over the epoch so far (as its "
    "progress bar shows), so a line steps down where an epoch begins; hollow points: "
    "validation, once per epoch"
)
#: a finished run's dashboard when its cell trained nothing (no fit() reported a step)
TRAINED_NOTHING = "finished: this cell trained nothing (no fit())"
#: the run's status where it never began (StrategyUnavailable: "The cell did not run.")
NOT_RUN = "not run"


def no_layout(strategy: str, status: str) -> str:  # last_run().layout() with none to show
    return (
        f"layout(): this run was {strategy}; only --strategy sharded runs have a layout"
        if strategy != "sharded"
        else f"layout(): this sharded run ({status}) built no model to lay out"
    )


def pull_not_global(name: str, script: str) -> str:  # %kdist run --pull of a main()'s local
    return (
        f"--pull {name}: {script} never binds '{name}' at its top level, and only a script's "
        f"globals travel back (a main()'s locals end with it): make it a global (`global "
        f"{name}` in main(), or return it) to pull it"
    )


def one_tpu_chip(device: str) -> str:  # --strategy tpu on Colab's one chip (v5e-1, v6e-1)
    return (
        f"one TPU chip ({device}) is one replica: the cell runs on it as it would without "
        f"kdist; splitting batches needs several chips (Kaggle's v5e-8)"
    )


def push_missing(name: str) -> str:  # a rank's NameError for a name the notebook has
    return (
        f"'{name}' is in the notebook, not on the engines: add --push {name} to the %%kdist "
        f"line (each engine is a process of its own and sees only what --push sends)"
    )


def run_chose(strategy: str, script: str) -> str:
    """``%kdist run`` with no --strategy: a launcher script runs on engines."""
    why = "it imports horovod" if strategy == "horovod" else "a launcher script runs on engine ranks"
    return (
        f"%kdist run: no --strategy given, so {script} runs under --strategy {strategy} ({why}); "
        f"--strategy chooses another"
    )


def torch_code_other_backend(backend: str) -> str:
    """torch.distributed code under multiworker on another Keras backend."""
    return (
        f"this code uses torch.distributed, but Keras' backend here is {backend}: --strategy "
        f"multiworker sets torch's launcher variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) "
        f"under KERAS_BACKEND=torch only. Set os.environ['KERAS_BACKEND'] = 'torch' before "
        f"anything imports Keras (or restart the kernel with it). The cell did not run."
    )


#: ``%kdist`` line commands and what each does: the line magic's help (``%kdist?``), its usage
#: error and the docs' reference are all made from this table
LINE_COMMANDS = {
    "start": "start the engines for the options given (the options a %%kdist cell takes) and "
    "import the strategy's framework there, in the background; the first cell finds "
    "them warm (%kdist status says how far it got)",
    "run": "run an existing script on every rank as __main__, with its own sys.argv: "
    "%kdist run --strategy multiworker --np 2 train.py --epochs 3 (%kdist run? says more)",
    "status": "what each strategy holds (engines, warming), the last run's summary, and whether "
    "the private network and the same-user check are on",
    "stop": "stop the controller, the engines and every other process kdist started, by pid",
    "restart": "stop everything kdist started, as stop does; the next cell starts new engines",
    "advise": "show --strategy auto's reasoning as a table (criterion, observation, consequence), "
    "the deciding row marked; takes the options a %%kdist cell takes",
    "scale": "will more devices help? probe the last %%kdist cell that trained at 1, 2, ... ranks "
    "(up to its --np, or the --np given), measure the link, predict more; "
    "kdist_magics.last_scale() holds the table (%%kdist scale [options] probes its own cell)",
}


def line_help() -> str:
    """The ``%kdist`` line magic's help text (what ``%kdist?`` shows), one entry per command."""
    import textwrap

    width = max(len(name) for name in LINE_COMMANDS)
    rows = "\n".join(
        textwrap.fill(text, 88, initial_indent=f"  {name:<{width}}  ", subsequent_indent=" " * (width + 4))
        for name, text in LINE_COMMANDS.items()
    )
    usage = " | ".join(
        f"{name} [options]"
        if name in ("start", "advise", "scale")
        else "run [options] script.py [args]"
        if name == "run"
        else name
        for name in LINE_COMMANDS
    )
    return f"%kdist {usage}\n\n{rows}\n\nExample: %kdist start --strategy horovod --np 4 (then write the first cell).\n"


# -- code written for a launcher (torchrun, TF_CONFIG, jax.distributed), inside a run -------
def launcher_mismatch(
    call: str,
    given: str,
    run: str,
    option: str,
    otherwise: str = "leave the argument out (the run's own group is set up already and this call joins it)",
) -> str:
    """A framework's own set-up call asks for something other than the run it is in."""
    return f"{call} asks for {given}, but this kdist run has {run}: {option}, or {otherwise}"


# -- the words of one component each, imported from here as every other --------------------
from .elastic import resized_note, resized_summary, too_few_left, went_on_without, world_resized  # noqa: E402
from .push import push_no_shm_room, push_report, push_too_big  # noqa: E402, F401
from .sharded import (  # noqa: E402
    mesh_unreadable,
    model_axis_too_big,
    mesh_not_dividing,
    mesh_for_devices,
    sharded_not_on,
    built_outside_mesh,
    mesh_reused,
    mesh_chosen,
    mesh_why_fits,
    mesh_why_unknown,
    mesh_why_too_big,
    layout_missing_axis,
    layout_not_divisible,
    layout_keys_unused,
    layout_per_device,
    logical_devices_share_cores,
)
from .slurm import (  # noqa: E402
    SLURM_ENDED,
    SLURM_STEP_CANCELLED,
    slurm_ended,
    slurm_submitting,
    slurm_refused,
    slurm_queued,
    slurm_gave_up,
    slurm_interrupted,
    slurm_ended_early,
    slurm_loopback,
    phase_queue,
    unresolved_hosts,
)
from .ray import (  # noqa: E402
    RAY_MISSING,
    ray_actor_ended,
    ray_asks_token,
    ray_engine_ended,
    ray_given_back,
    ray_no_cluster,
    ray_node_died,
    ray_placing,
    ray_unplaceable,
)
from .scale import (  # noqa: E402
    BATCH_UNKNOWN,
    LINK_FITTED,
    LINK_NONE,
    SCALE_COMM_INFERRED,
    more_hosts_said,
    SCALE_INTERRUPTED,
    SCALE_NOTHING_TRAINED,
    SPLIT_LEGEND_LIVE,
    SPLIT_LEGEND_PROBED,
    SPLIT_LEGEND_TIMED,
    SPLIT_LIVE,
    SPLIT_OTHER_RUN,
    SPLIT_PROBED,
    SPLIT_TIMED,
    SPLIT_TITLE,
    SPLIT_UNTIMED,
    auto_from_probe,
    auto_not_worth_it,
    contention,
    scale_attached_once,
    scale_cannot_probe,
    scale_all_engines,
    scale_fewer_engines,
    scale_one_device,
    scale_too_few_engines,
    scale_quoted,
    scale_trained_nothing,
)


# -- kdist_magics.datasets: each rank its own files ----------------------------------------
def too_few_files(found: int, files, positions: int) -> str:
    where = f" matching {str(files)!r}" if isinstance(files, (str, __import__("os").PathLike)) else ""
    return (
        f"{found} files{where} for {positions} data positions: give every rank at least one "
        f"file (split them finer, or run fewer ranks)"
    )


def files_left_out(found: int, positions: int, extra: int) -> str:
    return f"{found} files over {positions} ranks: leaving out the last {extra} so every rank reads as many"


def no_batches(batch_size: int, positions: int) -> str:
    return (
        f"no rank's files hold a whole batch of {batch_size} rows for each of the "
        f"{positions} data positions: give a smaller batch_size or more rows per file"
    )
