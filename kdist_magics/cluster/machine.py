"""Which machine a process runs on: what two machines cannot share.

A host name alone is no proof: two containers, two cloud VMs made from one image, or two
hosts of a cluster named ``localhost`` answer the same name. :func:`machine_id` joins the name
with the running kernel's boot id (new at every boot, different on every machine) and the
device of ``/dev/shm`` (a container has a tmpfs of its own there), so two processes with the
same id run on one kernel and see one ``/dev/shm``: what ``--push``'s shared memory and the
local checks of a process (its pid, its exit) need.
"""

from __future__ import annotations

import os
import socket

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def machine_id() -> str:
    """``host/boot-id/shm-device`` of this process (a part it cannot read is left empty)."""
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        shm = str(os.stat("/dev/shm").st_dev)
    except OSError:
        shm = ""
    return f"{socket.gethostname()}/{boot}/{shm}"


def same_machine(engine) -> bool:
    """Whether ``engine`` (an :class:`~.liveness.EngineInfo`) runs on this machine: by its
    :func:`machine_id` where it reported one, else (an engine that did not) by host name."""
    theirs = getattr(engine, "machine", "")
    return theirs == machine_id() if theirs else engine.hostname == socket.gethostname()
