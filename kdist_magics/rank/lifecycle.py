"""Code that runs on the engines (one process per rank). Importable without TF.

The kernel calls these functions through ipyparallel ``apply``; the cell itself
runs as an ordinary ``execute`` so it behaves like a ``%%px`` cell (namespace
kept, output and tracebacks rendered by the engine's IPython).

Telemetry travels to the kernel over IOPub through :mod:`kdist_magics.rank.feed`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Any

from .feed import Feed

THREAD_VARS = ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS")

_run: dict[str, Any] = {}  # state of the run in progress on this engine
_engine: dict[str, Any] = {}  # state for this engine's lifetime (kept across runs)


def thread_env(threads: int, ranks_here: int = 1) -> dict[str, str]:
    """The thread variables for one of ``ranks_here`` ranks on this host with ``threads``
    intra-op threads (set before TensorFlow starts): OMP the same, inter-op ``min(2, threads)``,
    but 2 where the ranks outnumber the cores (``benchmarks/threads.py``, 4 ranks on 2 cores:
    inter-op 1 came 3-8 % behind 2 in two runs; with one core per rank 1 was as fast or faster)."""
    env = {var: str(threads) for var in THREAD_VARS}
    env["TF_NUM_INTEROP_THREADS"] = str(2 if ranks_here > cpu_count() else min(2, threads))
    return env


def prepare(
    env: dict[str, str],
    threads: int | None = None,
    cwd: str | None = None,
    gpu: tuple[int, int, str] | None = None,
    ranks_here: int = 1,
) -> dict[str, Any]:
    """Set environment variables before the cell (and before TF is first imported here).

    ``threads``: intra-op threads for this rank, one of ``ranks_here`` on this host
    (inter-op threads follow, :func:`thread_env`).
    ``gpu``: ``(local_rank, local_size, KDist.rank_gpus)``: which of this host's GPUs the rank
    sees (:func:`kdist_magics.cluster.placement.gpu_env`, from the GPUs visible when the engine
    started). Returns what the kernel shows in the record: pid, host, whether TF was already
    loaded (then thread settings no longer apply until the engines restart), the rank's GPU
    (or ``gpu_error``). ``cwd``: the notebook's working directory (engines on the kernel's
    host follow it).
    """
    import socket
    import sys

    from ..cluster.placement import TooFewGPUs, gpu_env, visible_gpus

    os.environ.update({k: str(v) for k, v in env.items()})
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)  # relative paths in the cell mean what they mean in the notebook
    tf_loaded = "tensorflow" in sys.modules
    if threads and not tf_loaded:
        os.environ.update(thread_env(threads, ranks_here))
    out = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "tf_loaded": tf_loaded,
        "threads": os.environ.get("TF_NUM_INTRAOP_THREADS"),
    }
    if gpu is not None:
        if "host_gpus" not in _engine:  # what the engine saw before kdist chose for it
            _engine["host_gpus"] = visible_gpus(os.environ)
        host_gpus = _engine["host_gpus"]
        try:
            chosen = gpu_env(host_gpus, *gpu, host=out["host"])
        except TooFewGPUs as exc:
            out["gpu_error"] = str(exc)
        else:
            os.environ.update(chosen)
            out["gpu"] = chosen.get("CUDA_VISIBLE_DEVICES")
    return out


def cpu_count() -> int:
    """CPUs this engine may use (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def threads_per_rank(ranks_here: int, chosen: int | None = 0) -> int:
    """Intra-op threads for one of ``ranks_here`` ranks on this host: ``chosen``
    (``KDist.threads_per_rank``) when set, otherwise this host's cores shared by the ranks
    (the rule ``benchmarks/threads.py`` measured; see docs/performance/index.md)."""
    return chosen or max(1, cpu_count() // max(1, ranks_here))


def begin(
    rank: int,
    telemetry: bool = True,
    interval: float = 0.25,
    checkpoint: str | None = None,
    freeze_gc: bool = True,
    tf_info_logs: bool = False,
    helper_nice: int = 0,
    probe: tuple[int, float | None] | None = None,
) -> dict[str, Any]:
    """Before the cell: telemetry around ``fit``, a checkpoint callback (rank 0 saves), TF's INFO
    lines quiet (see :mod:`kdist_magics.watch.tf_logs`); the engine's helper threads (IOPub,
    heartbeat, control, telemetry) ``helper_nice`` below the main thread, which runs the cell
    (:mod:`kdist_magics.cluster.priority`). ``probe``: ``(steps, batch_scale)`` for
    ``%kdist scale``'s runs (:func:`kdist_magics.watch.telemetry.attached`)."""
    from ..watch.tf_logs import quiet_info

    from IPython import get_ipython

    end(flush=False)  # a previous run that was interrupted before its end()
    shell = get_ipython()
    stack = contextlib.ExitStack()
    if freeze_gc:
        stack.enter_context(gc_frozen())
    stack.enter_context(quiet_info(not tf_info_logs))
    feed = Feed(rank, interval)
    _run.update(stack=stack, feed=feed, rank=rank)
    if shell is not None:
        shell.events.register("pre_run_cell", feed.arm)
        shell.events.register("post_run_cell", feed.disarm)
        stack.callback(shell.events.unregister, "pre_run_cell", feed.arm)
        stack.callback(shell.events.unregister, "post_run_cell", feed.disarm)
    if telemetry:
        from ..watch.sampling import sampling
        from ..watch.telemetry import attached

        stop_after, batch_scale = probe or (None, None)
        stack.enter_context(attached(feed.sink, rank=rank, stop_after=stop_after, batch_scale=batch_scale))
        stack.enter_context(sampling(feed.sink, rank=rank))
    if checkpoint:
        stack.enter_context(_checkpointing(checkpoint, rank))
    lowered = []
    if helper_nice:
        from ..cluster.priority import lower_helpers

        lowered = lower_helpers(helper_nice)
    return {"rank": rank, "pid": os.getpid(), "lowered": lowered}


@contextlib.contextmanager
def gc_frozen():
    """Within the block, Python's cyclic GC leaves alone every object that existed before it.

    A warm engine (TensorFlow, Keras, IPython, earlier runs) or a notebook kernel holds
    several hundred thousand long-lived objects; every full collection walks all of
    them (~0.2 s here), and on a Horovod rank that stall also stalls every peer at the
    next allreduce. ``gc.freeze()`` moves them out of the collector's sight for the
    run; objects made during the run are collected as usual. ``gc.unfreeze()`` at the
    end gives them back, so cyclic garbage among them is collected later, not leaked.
    """
    import gc

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def end(flush: bool = True) -> dict[str, Any]:
    """After the cell: undo :func:`begin` and publish the remaining rows."""
    from IPython import get_ipython

    stack, feed = _run.pop("stack", None), _run.pop("feed", None)
    _run.clear()
    if stack is not None:
        try:
            stack.close()
        except Exception:
            pass
    if feed is None:
        return {"seq": 0}
    feed.close()
    if flush:
        shell = get_ipython()
        feed.flush(parent=dict(shell.display_pub.parent_header) if shell is not None else None)
    return {"seq": feed.seq}


def _atomic_checkpoint(path: str, write: bool = True):
    """A Keras callback saving the model to ``path`` after each epoch, atomically: it writes
    a temporary ``.keras`` file and renames it, so a Stop (SIGINT) in the middle of a save
    leaves the previous epoch's checkpoint intact instead of a truncated archive. A model
    sharded over JAX processes is gathered first on every process (:mod:`.gather`); only the
    process told to ``write`` saves."""
    import keras

    class AtomicCheckpoint(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            from .gather import save

            tmp = f"{path[: -len('.keras')]}.saving-{os.getpid()}.keras"
            try:
                save(self.model, tmp, write)
                if not write:
                    return
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                raise

    return AtomicCheckpoint()


def _saves_collectively() -> bool:
    """True inside TensorFlow's MultiWorkerMirroredStrategy, where saving a model reads its
    variables with collective ops: every worker must save, or rank 0 waits in a collective
    the others never join (TF's rule: other workers save to a temporary path)."""
    tf = sys.modules.get("tensorflow")
    if tf is None or not tf.distribute.has_strategy():
        return False
    return type(tf.distribute.get_strategy()).__name__ in ("CollectiveAllReduceStrategy", "MultiWorkerMirroredStrategy")


@contextlib.contextmanager
def _checkpointing(directory: str, rank: int = 0):
    """Every ``fit`` inside saves the model to ``directory/last.keras`` after each epoch, on
    rank 0; under MultiWorkerMirroredStrategy the other ranks save alongside, to a scratch
    folder removed afterwards; elsewhere they only take part in gathering a model sharded over
    JAX processes."""
    import keras

    if rank == 0:
        os.makedirs(directory, exist_ok=True)
    original = keras.Model.fit
    scratch = tempfile.TemporaryDirectory(prefix="kdist-checkpoint-") if rank else None

    def fit(model, *args, **kwargs):
        __tracebackhide__ = True  # not in the user's traceback
        callbacks = list(kwargs.pop("callbacks", None) or [])
        if rank == 0 or _saves_collectively():
            folder = directory if rank == 0 else scratch.name
            callbacks.append(_atomic_checkpoint(os.path.join(folder, "last.keras")))
        else:  # a model sharded over JAX processes is gathered on every process (gather.save)
            callbacks.append(_atomic_checkpoint(os.path.join(directory, "last.keras"), write=False))
        return original(model, *args, callbacks=callbacks, **kwargs)

    fit.__wrapped__ = original
    keras.Model.fit = fit
    try:
        yield
    finally:
        keras.Model.fit = original
        if scratch is not None:
            scratch.cleanup()
