"""Elastic states waiting for word of a host change (``hvd.elastic.run`` registers them).

Horovod tells its ranks of added or removed hosts through a notification service that
listens on every rank. kdist's kernel tells them through the run's abort line instead
(see ``strategies.horovod``), which calls :func:`hosts_updated`; the states raise
``HostsUpdatedInterrupt`` at their next commit, all ranks at the same one.
"""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_states: list = []


def register(state) -> None:
    with _lock:
        if state not in _states:
            _states.append(state)


def unregister(state) -> None:
    with _lock:
        if state in _states:
            _states.remove(state)


def hosts_updated(added: bool = True) -> int:
    """Tell every registered state that hosts were added (or removed); how many were told."""
    from horovod.runner.elastic.worker import HostUpdateResult

    result = HostUpdateResult.added if added else HostUpdateResult.removed
    stamp = int(time.time() * 1000)
    with _lock:
        states = list(_states)
    for state in states:
        state.on_hosts_updated(stamp, result)
    return len(states)
