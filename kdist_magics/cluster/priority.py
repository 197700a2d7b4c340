"""kdist's helpers run below the ranks' CPU priority, so they never take a rank's core.

On a machine where the ranks use every core, whatever runs beside them competes for it: the
kernel's dashboard and sampler threads, the ipyparallel controller (with its schedulers), and
inside each engine its IOPub, heartbeat and control threads and kdist's telemetry feed and
sampler. Linux gives every thread its own nice value, so these get ``HELPER_NICE`` (10: a
tenth of a nice-0 thread's share when they compete) while the threads that train keep theirs:
the engine's main thread, which runs the cell, and every thread TensorFlow, JAX, torch or
Horovod start natively (they never appear in :func:`threading.enumerate`, so nothing here
touches them). Raising one's own nice value needs no privilege; nothing here lowers one.
Elsewhere (no ``os.setpriority``) these are no-ops.
"""

from __future__ import annotations

import os
import threading

#: nice value added to kdist's helper threads and the controller (``%config KDist.helper_nice``)
HELPER_NICE = 10
#: Python threads of an engine that are helpers by their names (ipykernel's IOPub and Control,
#: ipyparallel's nanny watch, kdist's feed and sampler); zmq's devices (the heartbeat) by type
HELPER_THREADS = ("IOPub", "Heartbeat", "Control", "WatchParent", "kdist-")


def lower(tid: int | None = None, by: int = HELPER_NICE) -> bool:
    """Add ``by`` to the nice value of thread ``tid`` (default: the calling thread), at most 19.
    False where the platform cannot, or the thread is gone."""
    if by <= 0 or not hasattr(os, "setpriority"):
        return False
    tid = tid or threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        if now >= min(19, by):
            return True  # already this low (a helper's child thread inherits it)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + by))
        return True
    except OSError:
        return False


def nice_of(tid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)
    except (AttributeError, OSError):
        return None


def lower_helpers(by: int = HELPER_NICE) -> list[str]:
    """In an engine: lower every Python thread but the main one (which runs the cell) whose
    name marks it as a helper; the names of the threads lowered."""
    main = threading.main_thread()
    done = []
    for thread in threading.enumerate():
        if thread is main or thread.native_id is None:
            continue
        name = thread.name or ""
        owner = getattr(getattr(thread, "_target", None), "__self__", None)
        zmq_device = type(owner).__module__.startswith("zmq.devices")
        if (name.startswith(HELPER_THREADS) or zmq_device) and lower(thread.native_id, by):
            done.append(name)
    return done
