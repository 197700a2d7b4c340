"""Exceptions kdist raises at the user, each rendered the way IPython renders a local error."""

from __future__ import annotations


class KDistError(Exception):
    """Base class of kdist's own errors: a short message, no kdist traceback."""

    def _render_traceback_(self):
        # IPython calls this instead of formatting our frames: the user sees what
        # went wrong in their terms, not the magic's internals.
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class LauncherMismatch(KDistError):
    """Launcher code (``init_process_group``, ``MultiWorkerMirroredStrategy(...)``,
    ``jax.distributed.initialize``) inside a run asks for another world size or rank."""


class ScriptExited(KDistError):
    """A script run with ``%kdist run`` called ``sys.exit`` with a failing status."""


class StrategyUnavailable(KDistError):
    """The chosen strategy cannot run here (no TPU, Horovod missing, ...)."""


class DevicesFixed(StrategyUnavailable):
    """TensorFlow (or JAX) started with another device layout; only a restart changes it."""


#: how to get a TPU, where users are
HOW_TO_GET_A_TPU = (
    "Get a TPU runtime: Colab: Runtime > Change runtime type > TPU; "
    "Kaggle: Settings > Accelerator > TPU; Google Cloud: a TPU VM."
)


def no_tpu(looked: str, detail: str = "") -> StrategyUnavailable:
    """The short error: what was looked for, how to get a TPU, the cell did not run."""
    first = f"--strategy tpu: no TPU found (looked for {looked})" + (f": {detail}" if detail else ".")
    return StrategyUnavailable(f"{first}\n{HOW_TO_GET_A_TPU}\nThe cell did not run.")


def no_tensorflow(what: str, backend: str) -> StrategyUnavailable:
    """A TensorFlow path (``what``: "--strategy horovod") asked for where TensorFlow is not
    installed (Colab's TPU runtime has none): one line, naming what to set or install."""
    fix = (
        "Keras is on its default backend, tensorflow, too: set KERAS_BACKEND=jax (or torch) "
        "before importing keras, or pip install tensorflow"
        if backend == "tensorflow"
        else f"pip install tensorflow, or choose a strategy that runs on Keras' {backend} backend"
    )
    return StrategyUnavailable(
        f"{what} needs TensorFlow, which is not installed here (as on "
        f"Colab's TPU runtime); {fix}. The cell did not run."
    )


def tpu_held(pid: int, command: str, strategy: str = "tpu") -> StrategyUnavailable:
    """The TPU is held by another process (libtpu allows one per host): name it and the fix."""
    return StrategyUnavailable(
        f"--strategy {strategy}: the TPU is held by another process, pid {pid} ({command}): a crashed "
        f"kernel's leftover, or another notebook. libtpu lets one process use it: end that one "
        f"(kill {pid}, or restart the runtime) and run the cell again. The cell did not run."
    )


def initialize_too_late(call: str, why: str) -> StrategyUnavailable:
    """The cell joins a multi-host JAX job after JAX's backend started, which JAX refuses."""
    return StrategyUnavailable(
        f"{call}() must run before JAX starts its backend, and {why}: run it in the first cell "
        f"of a fresh kernel, on its own and without %%kdist (on every host of a multi-host TPU "
        f"slice), then this cell without that line. The cell did not run."
    )


def initialize_again(call: str) -> StrategyUnavailable:
    """The cell joins a multi-host JAX job this kernel has joined already (JAX allows one)."""
    return StrategyUnavailable(
        f"{call}(): this kernel has joined a JAX job already (jax.distributed.initialize ran), "
        f"and JAX joins one per process: remove the line from this cell. The cell did not run."
    )


class CellFailed(KDistError):
    """The cell's own code raised; its traceback has already been shown.

    ``original`` is the user's exception (also ``__cause__``). Rendering this
    error adds nothing, so the notebook shows the user's traceback once and the
    cell is still marked as failed.
    """

    def __init__(self, original: BaseException):
        super().__init__(f"{type(original).__name__}: {original}")
        self.original = original

    def _render_traceback_(self):
        return []


class CellInterrupted(CellFailed):
    """An in-kernel cell the user stopped (the Stop button): its ``KeyboardInterrupt`` has been
    shown as a plain cell's; the run's status is ``interrupted``, as on engines."""

    status = "interrupted"


class Interrupted(KeyboardInterrupt):
    """Stop during an engine run, once every rank was stopped: one line, no kdist frames (a
    ``KeyboardInterrupt``, so code that treats interrupts as such still does)."""

    def _render_traceback_(self):
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class RankFailed(CellFailed):
    """The cell raised on one or more engine ranks.

    ``failures`` maps rank -> the engine's error (ipyparallel ``RemoteError``, with
    ``ename``, ``evalue`` and the engine-side traceback); ``original`` is the first
    failing rank's. Rendered as that rank's own traceback under a line naming the
    rank(s), once, however many ranks raised.
    """

    def __init__(self, failures: dict, stopped: list | None = None):
        first = min(failures)
        err = failures[first]
        super().__init__(err)
        self.failures = dict(failures)
        self.stopped = list(stopped or [])
        self.hint: str | None = None  # a line under the first: what the error means here
        ranks = ", ".join(f"rank {r}" for r in sorted(failures))
        name = getattr(err, "ename", type(err).__name__)
        value = getattr(err, "evalue", str(err))
        self.args = (f"{ranks}: {name}: {value}",)

    def _render_traceback_(self):
        first = min(self.failures)
        err = self.failures[first]
        head = f"\x1b[0;31m{self}\x1b[0m"
        if self.stopped:
            head += f" (stopped {', '.join(f'rank {r}' for r in self.stopped)})"
        if self.hint:
            head += f"\n{self.hint}"
        try:
            # drop ipyparallel's "[1:execute]" header: engine ids are not ranks
            lines = [
                ln
                for ln in err.render_traceback()
                if not (ln.startswith("[") and ln.endswith("]") and ":" in ln and ln[1 : ln.index(":")].isdigit())
            ]
        except Exception:
            lines = [f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', err)}"]
        return [head, f"--- traceback on rank {first} ---", *lines]


class RankDied(KDistError):
    """An engine process ended during the run (segfault, os._exit, OOM kill)."""

    status = "failed"

    def __init__(self, deaths: dict, during: str | None = None, ran: bool = False, owned: bool = True):
        self.deaths = dict(deaths)  # rank -> "was killed by SIGKILL ..."
        what = "; ".join(f"rank {r} {how}" for r, how in sorted(self.deaths.items()))
        then = (
            "engines restart with the next %%kdist cell"
            if owned
            else "restart the cluster's engines (kdist restarts no cluster it did not start), then run the cell again"
        )
        if during:  # outside the cell ("while Horovod started"); ``ran``: after it
            super().__init__(f"{during[0].upper()}{during[1:]}: {what}. {_after(ran)}; {then}.")
        else:
            super().__init__(f"{what}. The run was stopped; {then}.")


class ControllerDied(KDistError):
    """The ipyparallel controller ended during the run: a kdist-started cluster's, or
    (``owned`` False) the controller of a cluster kdist attached to, when it runs on this host."""

    status = "failed"

    def __init__(self, how: str, during: str | None = None, ran: bool = False, owned: bool = True):
        self.how = how
        whose = "the ipyparallel controller" if owned else "the cluster's ipyparallel controller"
        then = (
            "the next %%kdist cell starts a new cluster"
            if owned
            else "start the cluster again (kdist restarts no cluster it did not start), then run the cell again"
        )
        if during:  # outside the cell ("while Horovod started"); ``ran``: after it
            super().__init__(f"{during[0].upper()}{during[1:]}: {whose} {how}. {_after(ran)}; {then}.")
        else:
            super().__init__(
                f"{whose} {how} during the run, so no rank could report any more; "
                f"every rank was stopped. {then[0].upper()}{then[1:]}."
            )


def _after(ran: bool) -> str:
    return "The cell had run on every rank" if ran else "The cell did not run"


class RunTimedOut(KDistError):
    """The run exceeded --timeout."""

    status = "timeout"

    def __init__(self, seconds: float, busy: list):
        self.seconds = seconds
        self.busy = list(busy)
        ranks = ", ".join(f"rank {r}" for r in self.busy) or "no rank"
        super().__init__(f"the run exceeded --timeout {seconds:g} s; still busy: {ranks}. They were stopped.")


class ClusterError(KDistError):
    """The engines could not be started, reached or restarted."""


def _show_cell_failed(shell, etype, value, tb, tb_offset=None):
    """Custom exception handler for :class:`CellFailed`: show nothing when the cell's own
    traceback is already on screen (its rendering is empty), else the usual rendering."""
    if value._render_traceback_():
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    return []


def quiet_cell_failed(shell, install: bool) -> None:
    """A notebook front end shows every ``error`` message a kernel sends, even one with an
    empty traceback, so a CellFailed after the user's own traceback (a syntax error, a
    failing in-kernel cell) would be a second, empty error output. IPython's custom
    exception hook lets such a CellFailed mark the cell as failed without sending one.
    Installed only when no other custom handler is set; removed again on unload."""
    if install and not shell.custom_exceptions:
        shell.set_custom_exc((CellFailed,), _show_cell_failed)
    elif not install and shell.custom_exceptions == (CellFailed,):
        shell.set_custom_exc((), None)
