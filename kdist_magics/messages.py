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


#: what stays open to other local users, per engine strategy (docs: guide/shared-hosts.md)
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
            f"(docs: User guide, Shared hosts)")


#: the example data (kdist_magics.datasets) without scikit-learn, which ships the digits
NO_SKLEARN = ("the example data (scikit-learn's digits, bundled with scikit-learn, no download) "
              "needs scikit-learn, which is not installed here. Install it with: "
              "pip install scikit-learn")


def missing_prerequisites(missing: dict[str, str]) -> str:
    """What a notebook's first cell says when something it needs is missing: one line per
    thing, each with the one command that fixes it ({what: command})."""
    lines = [f"this notebook needs {len(missing)} thing{'s' if len(missing) != 1 else ''} "
             f"this environment lacks:"]
    lines += [f"  - {what}: {command}" for what, command in missing.items()]
    return "\n".join(lines)


def cell_timed_out(seconds: float) -> str:
    """An in-kernel cell stopped by ``--timeout`` (the engines' words: errors.RunTimedOut)."""
    return (f"the run exceeded --timeout {seconds:g} s, so kdist interrupted the cell; "
            f"the kernel is ready for the next cell")


def backend_changed(strategy: str, before: str, now: str) -> str:  # engines that follow it
    return (f"Keras' backend is now {now} (it was {before} for the running {strategy} engines): "
            f"starting new engines for {now}")


def interrupted_start(n: int) -> str:  # Stop while engines started: nothing is left of them
    return f"Stop: the start of {n} engine{'s' if n != 1 else ''} was cut short; nothing it started is left"


def interrupted(stopped: list[int]) -> str:  # the one line after Stop during an engine run
    return (f"Stop: {len(stopped)} rank{'s' if len(stopped) != 1 else ''} stopped; what the cell "
            f"made so far stays on the ranks (and in last_run())")


#: under the dashboard's curves: what a point of a training curve is (issue 49.8)
CURVES_NOTE = ("training curves: at each step, Keras' running mean over the epoch so far (as its "
               "progress bar shows), so a line steps down where an epoch begins; hollow points: "
               "validation, once per epoch")
#: a finished run's dashboard when its cell trained nothing (no fit() reported a step)
TRAINED_NOTHING = "finished: this cell trained nothing (no fit())"
#: the run's status where it never began (StrategyUnavailable: "The cell did not run.")
NOT_RUN = "not run"


def push_missing(name: str) -> str:  # a rank's NameError for a name the notebook has
    return (f"'{name}' is in the notebook, not on the engines: add --push {name} to the %%kdist "
            f"line (each engine is a process of its own and sees only what --push sends)")


def run_chose(strategy: str, script: str) -> str:
    """``%kdist run`` with no --strategy: a launcher script runs on engines (issue 49.4)."""
    why = "it imports horovod" if strategy == "horovod" else "a launcher script runs on engine ranks"
    return (f"%kdist run: no --strategy given, so {script} runs under --strategy {strategy} ({why}); "
            f"--strategy chooses another")


def torch_code_other_backend(backend: str) -> str:
    """torch.distributed code under multiworker on another Keras backend (issue 49.3)."""
    return (f"this code uses torch.distributed, but Keras' backend here is {backend}: --strategy "
            f"multiworker sets torch's launcher variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) "
            f"under KERAS_BACKEND=torch only. Set os.environ['KERAS_BACKEND'] = 'torch' before "
            f"anything imports Keras (or restart the kernel with it). The cell did not run.")


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
}


def line_help() -> str:
    """The ``%kdist`` line magic's help text (what ``%kdist?`` shows), one entry per command."""
    import textwrap

    width = max(len(name) for name in LINE_COMMANDS)
    rows = "\n".join(textwrap.fill(text, 88, initial_indent=f"  {name:<{width}}  ",
                                    subsequent_indent=" " * (width + 4))
                      for name, text in LINE_COMMANDS.items())
    usage = " | ".join(f"{name} [options]" if name in ("start", "advise") else
                        "run [options] script.py [args]" if name == "run" else name for name in LINE_COMMANDS)
    return (f"%kdist {usage}\n\n{rows}\n\n"
            "Example: %kdist start --strategy horovod --np 4 (then write the first cell).\n")



# -- code written for a launcher (torchrun, TF_CONFIG, jax.distributed), inside a run -------
def launcher_mismatch(call: str, given: str, run: str, option: str,
                      otherwise: str = "leave the argument out (the run's own group is set up "
                                       "already and this call joins it)") -> str:
    """A framework's own set-up call asks for something other than the run it is in."""
    return f"{call} asks for {given}, but this kdist run has {run}: {option}, or {otherwise}"



# -- --strategy sharded (strategies/sharded/strategy.py, mesh.py, strategies/sharded/layout.py) -----------
def _mesh(mesh) -> str:
    return f"{mesh[0]},{mesh[1]}"


def mesh_unreadable(text) -> str:
    return (f"--mesh: {text!r} is not a mesh; give D,M (data axis D, model axis M, whole "
            f"numbers >= 1), e.g. --mesh 2,2")


def model_axis_too_big(mesh, places: int, what: str) -> str:
    return (f"--mesh {_mesh(mesh)}: a model axis of {mesh[1]} is more than the {places} devices "
            f"{what} gives; give M <= {places}")


def mesh_not_dividing(mesh, places: int, what: str) -> str:
    need = "a multiple of" if what.startswith("--np") else "equal to"
    return (f"--mesh {_mesh(mesh)} has {mesh[0] * mesh[1]} places, not {need} the {places} "
            f"{'processes' if what.startswith('--np') else 'devices'} {what} gives; "
            f"D x M must be {need} {places}")


def mesh_for_devices(mesh, devices: int) -> str:
    return (f"--mesh {_mesh(mesh)} has {mesh[0] * mesh[1]} places for the {devices} devices this "
            f"run has; D x M must equal {devices}. The cell did not run.")


def sharded_not_on(backend: str) -> str:
    """--strategy sharded under a Keras backend other than JAX."""
    return (f"--strategy sharded needs Keras on JAX (Keras 3.15 shards a model with "
            f"keras.distribution.ModelParallel on JAX only); this kernel's Keras runs on {backend}: "
            f"restart the kernel with KERAS_BACKEND=jax, or keep {backend} and use --strategy "
            f"mirrored (a full copy of the model per device). The cell did not run.")


def built_outside_mesh(names: list[str], devices: int) -> str:
    """A sharded cell would use a model built before it, outside its mesh (issue 49.2)."""
    which = ", ".join(f"'{n}'" for n in names)
    return (f"{which} {'was' if len(names) == 1 else 'were'} built before this cell, outside "
            f"--strategy sharded: {'its' if len(names) == 1 else 'their'} weights live on one "
            f"device, and JAX cannot mix them with the mesh's {devices} devices. Build the model "
            f"inside the %%kdist --strategy sharded cell (a model built before only helps kdist "
            f"choose the mesh). The cell did not run.")


def mesh_reused(mesh, devices: int) -> str:
    """A sharded cell without --mesh on the devices of an earlier one keeps its mesh."""
    return (f"mesh {_mesh(mesh)} over {devices} devices, as the previous sharded cell on them "
            f"chose; --mesh D,M chooses another")


def mesh_chosen(mesh, devices: int, why: str) -> str:
    return (f"mesh {_mesh(mesh)} over {devices} devices (data axis {mesh[0]}, model axis "
            f"{mesh[1]}): {why}; --mesh D,M chooses another")


def mesh_why_fits(model: str, share: str, device: str) -> str:
    return f"the smallest model axis whose share of {model} ({share} per device) fits one device ({device})"


def mesh_why_unknown() -> str:
    return "no built model in the namespace to measure, so the model axis takes every device"


def mesh_why_too_big(model: str, share: str, device: str) -> str:
    return (f"{model} does not fit one device ({device}) even sharded over every device "
            f"({share} each): expect out-of-memory")


def layout_missing_axis(path: str, axes, names) -> str:
    return (f"kdist: the layout of {path} names mesh axis {axes!r}, but the mesh has only "
            f"{', '.join(map(repr, names))}")


def layout_not_divisible(path: str, shape, dim: int, axis: str, size: int) -> str:
    return (f"kdist: {path} {tuple(shape)}: dimension {dim} ({shape[dim]}) does not split over "
            f"mesh axis {axis!r} of {size}; give a layout or a mesh whose axis divides it")


def layout_keys_unused(keys: list[str], example: str | None) -> str:
    shown = ", ".join(repr(k) for k in keys)
    hint = f" (a variable path here: {example!r})" if example else ""
    return (f"LayoutMap key{'s' if len(keys) > 1 else ''} {shown} matched no variable, so those "
            f"variables stay replicated; keys must match the whole path (re.fullmatch){hint}")



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


def layout_per_device(weight_bytes: int, optimizer_bytes: int) -> str:
    """A sharded run's share of the model on each device (the dashboard, ``layout()``)."""
    from .choose.facts import human_bytes

    return (f"per device: weights {human_bytes(weight_bytes)}, "
            f"optimizer state {human_bytes(optimizer_bytes)}")


def slurm_interrupted(job: str, words: str) -> str:
    return f"interrupted: kdist cancelled Slurm job {job} ({words})"


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
