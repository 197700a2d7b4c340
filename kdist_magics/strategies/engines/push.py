"""``--push``: the named values into every engine's namespace, large arrays once per host.

The engines on the kernel's host get each large NumPy array (alone or in tuples, lists and
dicts; a DataFrame's columns) through one shared-memory segment (:mod:`kdist_magics.engine.shared`),
mapped copy-on-write, its name removed from ``/dev/shm`` once every engine has mapped it. On
another host, the value travels once, to that host's first engine, which makes the segments
there for the others. A value pushed again unchanged (the same fingerprint, checked on each
engine too) is bound again from what the engines hold and not sent. Values without such
arrays get the value as ipyparallel sends it. A push larger than the host's free memory is refused
first, in one line with the sizes.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from ...engine import shared
from ...engine.faults import hold
from ...errors import KDistError
from . import waiting

DURING = "while --push sent its values"


def push_values(strategy, cluster, pushed: dict[str, Any], ranks: list[int]) -> None:
    """Every ``--push`` value into every engine of ``cluster`` (see the module doc)."""
    here = socket.gethostname()
    hosts: dict[str, list] = {}
    for e in cluster.engines:
        hosts.setdefault(e.hostname, []).append(e)
    big = {n: v for n, v in pushed.items() if shared.shareable(v)}
    plain = {n: v for n, v in pushed.items() if n not in big}
    check_memory(big if here in hosts else {})
    need = sum(shared.segment_bytes(v) for v in big.values())
    if not os.path.isdir("/dev/shm"):  # no shared memory in the kernel: this host as others
        here = None
    elif here in hosts and (free := shared.room(need)) is not None:
        from ...messages import push_no_shm_room, say

        say(push_no_shm_room(need, free))
        here = None  # this host as others: its first engine finds no room either
    if plain:
        waiting.gather(strategy, [cluster.view().push(plain, block=False)], ranks, 600, DURING)
    if big:
        _share(strategy, cluster, hosts, here, big, ranks)


def check_memory(values: dict[str, Any]) -> None:
    """Refuse, in one line with the sizes, a push whose segments would not fit in free memory."""
    import psutil

    from ...messages import push_too_big

    need = sum(shared.segment_bytes(v) for v in values.values())
    free = psutil.virtual_memory().available
    if need and need > free:
        raise KDistError(push_too_big(need, free))


def sweep(folder: str = "/dev/shm") -> list[str]:
    """Remove segments a kernel that died between making and unnaming them left behind
    (``kdist-<its pid>-*``, that pid gone); the names removed. The guard that follows each
    kernel's cluster does the same as the kernel dies (:func:`~kdist_magics.cluster.lifetime.
    remove_segments`)."""
    from ...cluster.lifetime import remove_segments

    return remove_segments(folder=folder)


def _share(strategy, cluster, hosts: dict[str, list], here, values: dict[str, Any], ranks) -> None:
    """Bind ``values`` on every engine, one copy per host: this host's engines through
    segments the kernel makes, another host's through segments its first engine makes from
    the one transfer it gets; unchanged values bound again from what each engine holds."""
    sweep()
    prints = {name: shared.fingerprint(value) for name, value in values.items()}
    held = getattr(strategy, "shared_prints", {})
    ids = [e.engine_id for group in hosts.values() for e in group]
    again = {n: p for n, p in prints.items() if held.get(n) == p}
    needs = {name: set(ids) for name in values if name not in again}  # name -> engines
    if again:  # unchanged since the last push: each engine binds what it holds
        view = cluster.view(ids)
        for eid, names in zip(ids, waiting.gather(strategy, [view.apply_async(shared.rebind, again)],
                                                  ranks, 600, DURING)[0]):
            for name in names:  # this engine's copy is gone or was written to
                needs.setdefault(name, set()).add(eid)
    for name in sorted(needs):
        for host, group in hosts.items():
            wanted = [e.engine_id for e in group if e.engine_id in needs[name]]
            if not wanted:
                continue
            if host == here:
                _send(strategy, cluster.view(wanted), name, values[name], prints[name], ranks)
            else:
                _send_remote(strategy, cluster, wanted, name, values[name], prints[name], ranks)
    strategy.shared_prints = {**held, **prints}


def _send_remote(strategy, cluster, ids: list[int], name: str, value, print_: str, ranks) -> None:
    """Another host's engines ``ids``: the value travels once, to the first; it copies the large
    arrays into segments there, the others map them, and the first removes their names (also
    when a step fails: what it made, it unnames)."""
    first, rest = cluster.client[ids[0]], ids[1:]
    try:
        desc = waiting.gather(strategy, [first.apply_async(shared.host_share, name, value, print_,
                                                           bool(rest))], ranks, 600, DURING)[0]
        if rest and desc is not None:
            waiting.gather(strategy, [cluster.view(rest).apply_async(shared.attach, name, desc, print_)],
                           ranks, 600, DURING)
        elif rest:  # no shared memory on that host: each engine its own copy, as before
            waiting.gather(strategy, [cluster.view(rest).push({name: value}, block=False)],
                           ranks, 600, DURING)
    finally:
        if rest:
            try:
                first.apply_sync(shared.unname)
            except Exception:  # that engine is gone: its guard removes its names
                pass


def _send(strategy, view, name: str, value, print_: str, ranks) -> None:
    """One segment per large array of ``value``, mapped by every engine, then unnamed."""
    made: list[Any] = []
    try:
        desc = shared.describe(value, lambda nbytes: shared.new_segment(made, nbytes))
        hold("push", strategy.cluster, segments=[mem.name for mem in made])
        waiting.gather(strategy, [view.apply_async(shared.attach, name, desc, print_)], ranks,
                       600, DURING)
    finally:
        for mem in made:  # mapped by every engine now (or never will be): the names go
            shared.drop(mem)
