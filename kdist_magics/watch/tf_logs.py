"""TensorFlow's Python INFO lines, quiet inside kdist cells unless asked for; and its C++
start-up lines, quiet when kdist is what starts TensorFlow in the kernel.

A ``MirroredStrategy`` fit logs dozens of INFO lines through the ``tensorflow`` logger
("Reduce to /job:localhost/... then broadcast to (...)", "Collective all_reduce tensors: ...")
in an interactive session (TF then sets its logger to INFO with a stdout handler, at its
first log call). They tell a user nothing, so for a kdist cell's duration a filter on that
logger drops records below WARNING; ``%config KDist.tf_info_logs = True`` keeps them.
Warnings and errors always show. A filter, not a level: TF sets the level itself when it
first logs, which may be inside the cell; it never touches filters. TensorFlow need not
be imported: the filter goes on the logger by name, which TF's own logger then is.

TensorFlow's import writes C++ lines to the process's stderr before it reads
``TF_CPP_MIN_LOG_LEVEL`` ("WARNING: All log messages before absl::InitializeLog() is called
are written to STDERR" and "oneDNN custom operations are on ..." twice each, at any level), and
the CPU instruction list after it (hidden at level 1). ipykernel forwards that file descriptor
into the cell, 6-9 red lines in a notebook's first TensorFlow cell. While the extension is
loaded, whatever first imports TensorFlow in the kernel (an in-kernel strategy, ``--pull`` of a
Keras model, a plain cell's ``import keras``, which on JAX imports TensorFlow where it is
installed, too) does so with those known lines dropped and anything else TensorFlow writes then
passed on (:func:`quiet_tensorflow_imports`). While a cell runs in the kernel, the one C++
warning ``fit()`` under tf.distribute writes every run (:data:`RUN_NOISE`) is dropped the same
way. Engines start with ``TF_CPP_MIN_LOG_LEVEL=1``
(:mod:`kdist_magics.cluster.follow`). ``%config KDist.tf_info_logs = True`` keeps them all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from typing import Iterator

LOGGER = "tensorflow"
#: TensorFlow's C++ start-up lines (TF 2.16-2.21) that tell a notebook user nothing
START_UP_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|port\.cc:\d+\] oneDNN custom operations are on"
    r"|cpu_feature_guard\.cc:\d+\]|^To enable the following instructions: .*rebuild TensorFlow"
    r"|Memory patch applied"
)


def _warnings_and_above(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


#: lines TensorFlow's C++ writes while an in-kernel strategy trains that tell a user nothing
#: (W lines, shown at any level but 2; TensorFlow 2.16-2.21): Keras' data adapter under
#: tf.distribute feeds fit() from a Python generator, which "will not be optimized"; and, now and
#: then, as an epoch's iterator over the replicas is dropped with a batch still in flight, the
#: cancelled read's "Local rendezvous is aborting" and the op it names on the next line
RUN_NOISE = re.compile(
    START_UP_NOISE.pattern
    + r"|dataset\.cc:\d+\] Input of GeneratorDatasetOp::Dataset will not be optimized"
    + r"|local_rendezvous\.cc:\d+\] Local rendezvous is aborting with status: "
    + r"(CANCELLED|OUT_OF_RANGE)\b.*(GetNextFromShard|End of sequence)"
    + r"|^\s*\[\[\{\{node MultiDeviceIteratorGetNextFromShard\}\}\]\]\s*$"
)


@contextlib.contextmanager
def quiet_info(quiet: bool = True, stderr: bool = False) -> Iterator[None]:
    """Within the block, the ``tensorflow`` logger passes WARNING and above only (when ``quiet``);
    with ``stderr`` (a cell that runs in this process), the process's stderr also drops
    :data:`RUN_NOISE` lines, passing everything else on at once."""
    if not quiet:
        yield
        return
    logger = logging.getLogger(LOGGER)
    logger.addFilter(_warnings_and_above)
    try:
        with _lines_dropped(RUN_NOISE) if stderr else contextlib.nullcontext():
            yield
    finally:
        logger.removeFilter(_warnings_and_above)


@contextlib.contextmanager
def _start_up_lines_dropped() -> Iterator[None]:
    """TensorFlow's import, its :data:`START_UP_NOISE` dropped (:func:`_lines_dropped`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # read once, as TF starts
    with _lines_dropped(START_UP_NOISE):
        yield


@contextlib.contextmanager
def _lines_dropped(noise: "re.Pattern[str]") -> Iterator[None]:
    """The process's stderr (file descriptor 2) goes through a filter for the block: a thread
    passes every line on at once but those ``noise`` matches (at once: a crash meanwhile, such
    as an abort inside TensorFlow's import, still shows its last words)."""
    import threading

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no file descriptor 2 to borrow
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump() -> None:
        rest = b""
        while chunk := os.read(read_end, 65536):
            *lines, rest = (rest + chunk).split(b"\n")
            kept = [ln for ln in lines if not noise.search(ln.decode(errors="replace"))]
            if kept:
                os.write(saved, b"\n".join(kept) + b"\n")
        if rest and not noise.search(rest.decode(errors="replace")):
            os.write(saved, rest)

    thread = threading.Thread(target=pump, name="kdist-tf-start-up-lines", daemon=True)
    thread.start()
    try:
        yield
    finally:
        os.dup2(saved, 2)  # the pipe's last writer closed: the thread reads to its end
        thread.join(timeout=5)
        os.close(read_end)
        if not thread.is_alive():
            os.close(saved)


class _QuietLoader:
    """TensorFlow's own loader, its start-up lines dropped as it executes the package."""

    def __init__(self, loader, quiet):
        self._loader, self._quiet = loader, quiet

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        if not self._quiet():
            return self._loader.exec_module(module)
        with _start_up_lines_dropped():
            self._loader.exec_module(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: TensorFlow's own
        return getattr(self._loader, name)


class _QuietTensorFlowImport:
    """A meta path finder: the first ``import tensorflow`` runs with its start-up lines dropped."""

    def __init__(self, quiet):
        self.quiet = quiet

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow" or not self.quiet():
            return None
        spec = None
        for finder in [f for f in sys.meta_path if f is not self]:  # as the import system would
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, self.quiet)
        return spec


def quiet_tensorflow_imports(quiet, install: bool = True) -> None:
    """(Un)install the finder that makes TensorFlow's first import in this process quiet while
    ``quiet()`` is true (the extension: ``not KDist.tf_info_logs``)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietTensorFlowImport)]
    if install:
        sys.meta_path.insert(0, _QuietTensorFlowImport(quiet))
