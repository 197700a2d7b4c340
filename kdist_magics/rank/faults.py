"""A phase barrier, so that tests can inject a fault at a known phase of an engine run.

Off unless the kernel's environment names a directory in ``KDIST_HOLD_DIR`` (set it before
starting the kernel, or in ``os.environ`` inside it): then, as a run reaches phase P, kdist
looks for the file ``<dir>/P``. When it is there, kdist writes ``<dir>/P.held`` (JSON: the
kernel's pid, the controller's, the engines' launched and registered so far) and waits, with
the kernel's thread, until the file ``<dir>/P`` is removed (at most :data:`AT_MOST` seconds).
The test does its harm meanwhile (kills an engine, stops one, kills the controller or the
kernel, takes a port) and removes the file; what kdist then does is the behaviour under test.

The phases, in a run's order (:data:`PHASES`): ``controller`` (an owned cluster's controller
runs, no engine is launched yet), ``engines`` (engines launched, not yet waited for: they are
registering), ``setup`` (all registered; before the engines are prepared and ``--push`` sends
its values), ``push`` (``--push``'s shared-memory segments are made and named in ``/dev/shm``,
the engines not yet told: only with a large array pushed to this host's engines), ``init``
(the set-up calls are on their way: engines import the framework and meet in its
rendezvous), ``cell`` (the cell was sent to every rank), ``pull`` (the cell is done; before ``--pull`` and
its value), ``finishing`` (before the engines' end-of-run calls); and ``stopping``, outside a
run: ``%kdist stop`` (or a restart, or another ``--np``) is about to end the engines.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

PHASES = ("controller", "engines", "setup", "push", "init", "cell", "pull", "finishing", "stopping")
AT_MOST = 600.0  # a forgotten hold file cannot keep a kernel for ever


def hold(phase: str, cluster: Any = None, **facts: Any) -> None:
    """Wait here while the test's hold file for ``phase`` exists (see the module doc);
    ``facts`` go into the ``.held`` file too (the addresses the ranks are to listen on)."""
    where = os.environ.get("KDIST_HOLD_DIR")
    if not where:
        return
    gate = Path(where) / phase
    if not gate.exists():
        return
    facts = {"phase": phase, "kernel": os.getpid(), **facts, **(cluster.processes() if cluster is not None else {})}
    held = gate.with_name(phase + ".held")
    part = held.with_name(phase + ".held.part")
    part.write_text(json.dumps(facts))
    os.replace(part, held)  # whole or absent: a test reading it never sees half of it
    deadline = time.monotonic() + AT_MOST
    while gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
