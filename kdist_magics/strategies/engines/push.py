"""``--push``: the named values into every engine's namespace, large arrays once per host.

The engines on the kernel's machine get each large NumPy array (alone or in tuples, lists and
dicts; a DataFrame's columns) through one shared-memory segment (:mod:`kdist_magics.rank.shared`),
mapped copy-on-write, its name removed from ``/dev/shm`` once every engine has mapped it. On
another machine, the value travels once, to that machine's first engine, which makes the segments
there for the others. "The same machine" is the engines' :func:`~kdist_magics.cluster.machine.
machine_id` (host name, boot id, ``/dev/shm``), never the host name alone.

A value is skipped only when it is unchanged: its XXH3-128 fingerprint (every byte, shape, dtype,
memory order) is the one the engines got last, and each engine's copy is unwritten; then each
engine binds again what it holds. Every copy a push will make is counted before anything is
sent: one per machine through segments, one per engine where segments cannot be used, and
another machine's free memory is asked there; a push that does not fit is refused in one line
with the sizes. What became of each value ("shared", "sent", "unchanged, not sent") is returned,
and the run's record keeps it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ...cluster.machine import machine_id
from ...rank import shared
from ...rank.faults import hold
from ...errors import KDistError
from ...messages import push as words
from . import waiting

DURING = "while --push sent its values"


@dataclass
class Host:
    """One machine's engines and how a push reaches them."""

    name: str  # its host name, as a user reads it
    engines: list  # EngineInfo, in engine order
    here: bool  # the kernel's machine
    segments: bool = True  # whether its engines map shared memory (else a copy each)
    free: int | None = None  # its free memory, bytes (asked before anything is sent there)
    need: int = 0  # bytes this push's copies take there

    def copies(self, count: int) -> int:
        """Copies of a value that ``count`` engines here need: one in segments (two for a
        moment on another machine, whose first engine copies what it got into them); one each
        without segments."""
        if not self.segments:
            return count
        return 1 if self.here or count == 1 else 2


@dataclass
class Plan:
    """A push worked out before anything is sent."""

    hosts: list[Host]
    values: dict[str, Any]  # name -> value with arrays for segments
    prints: dict[str, str] = field(default_factory=dict)
    needs: dict[str, set] = field(default_factory=dict)  # name -> engine ids to send to


def push_values(run) -> dict[str, str]:
    """Every ``--push`` value of ``run`` (an :class:`~.run.EngineRun`) into every engine of its
    cluster (see the module doc); what became of each, by name in the order given."""
    cluster, pushed, ranks = run.cluster, run.pushed, run.ranks
    big = {n: v for n, v in pushed.items() if shared.shareable(v)}
    plain = {n: v for n, v in pushed.items() if n not in big}
    outcomes = {name: words.SENT for name in pushed}
    hosts = group(cluster.engines)
    plan = Plan(hosts, big)
    if big:
        sweep()
        plan.prints = {name: shared.fingerprint(value) for name, value in big.items()}
        plan.needs = _to_send(run, cluster, plan, ranks)
        _count(run, cluster, plan, ranks)
    if plain:
        waiting.gather(run, [cluster.view().push(plain, block=False)], ranks, 600, DURING)
    for name in pushed:
        if name in big:
            outcomes[name] = _send_value(run, cluster, plan, name, ranks)
    return outcomes


def group(engines) -> list[Host]:
    """The engines by machine (their machine id, else host name), the kernel's first."""
    here = machine_id()
    by: dict[str, Host] = {}
    for e in engines:
        key = getattr(e, "machine", "") or e.hostname
        if key not in by:
            by[key] = Host(e.hostname, [], here=(key == here))
        by[key].engines.append(e)
    return sorted(by.values(), key=lambda h: not h.here)


def _to_send(run, cluster, plan: Plan, ranks) -> dict[str, set]:
    """Which engines need each value: all, but where it is unchanged since the last push and
    an engine's copy is unwritten (that engine binds it again: :func:`shared.rebind`)."""
    held = cluster.held_prints
    ids = [e.engine_id for h in plan.hosts for e in h.engines]
    again = {n: p for n, p in plan.prints.items() if held.get(n) == p}
    needs = {name: set(ids) for name in plan.values if name not in again}
    if again:
        view = cluster.view(ids)
        answers = waiting.gather(run, [view.apply_async(shared.rebind, again)], ranks, 600, DURING)[0]
        for eid, names in zip(ids, answers):
            for name in names:  # this engine's copy is gone or was written to
                needs.setdefault(name, set()).add(eid)
    return needs


def _count(run, cluster, plan: Plan, ranks) -> None:
    """Each copy the push will make, against each machine's free memory (another machine's
    asked there, on its first engine); refused in one line before anything is sent."""
    import psutil

    for host in plan.hosts:
        wanted = {name: [e for e in host.engines if e.engine_id in plan.needs.get(name, ())] for name in plan.values}
        nbytes = {name: shared.segment_bytes(plan.values[name]) for name, es in wanted.items() if es}
        total = sum(nbytes.values())
        if not total:
            continue
        if host.here:
            host.free = psutil.virtual_memory().available
            host.segments = os.path.isdir("/dev/shm") and _shm_room(total)
        else:
            first = cluster.client[host.engines[0].engine_id]
            host.free, host.segments = waiting.gather(
                run, [first.apply_async(shared.host_room, total)], ranks, 60, DURING
            )[0]
        host.need = sum(n * host.copies(len(wanted[name])) for name, n in nbytes.items())
        if host.need > host.free:
            copies = max(host.copies(len(es)) for es in wanted.values() if es)
            raise KDistError(words.push_too_big(host.need, host.free, None if host.here else host.name, copies))


def _shm_room(nbytes: int) -> bool:
    """Whether this machine's ``/dev/shm`` holds ``nbytes`` more; said in one line where not."""
    from ...messages import say

    free = shared.room(nbytes)
    if free is not None:
        say(words.push_no_shm_room(nbytes, free))
    return free is None


def _send_value(run, cluster, plan: Plan, name: str, ranks) -> str:
    """``name`` to the engines that need it, host by host; what became of it."""
    wanted_all = plan.needs.get(name, set())
    if not wanted_all:
        return words.UNCHANGED
    said = []
    for host in plan.hosts:
        wanted = [e.engine_id for e in host.engines if e.engine_id in wanted_all]
        if not wanted:
            continue
        value, print_ = plan.values[name], plan.prints[name]
        if host.here and host.segments:
            _send(run, cluster.view(wanted), name, value, print_, ranks)
            said.append(words.SHARED)
        elif host.here:  # no room in /dev/shm: each engine its own copy
            _copies(run, cluster.view(wanted), name, value, print_, ranks)
            said.append(words.SENT)
        else:
            shared_there = _send_remote(run, cluster, wanted, name, value, print_, ranks, host.segments)
            said.append(words.SHARED if shared_there else words.SENT)
    cluster.held_prints[name] = plan.prints[name]
    what = words.SHARED if words.SHARED in said else words.SENT
    count = len(wanted_all)
    total = sum(len(h.engines) for h in plan.hosts)
    return what if count == total else f"{what} to {count} of {total} engines (the others held it unchanged)"


def sweep(folder: str = "/dev/shm") -> list[str]:
    """Remove segments a kernel that died between making and unnaming them left behind
    (``kdist-<its pid>-*``, that pid gone); the names removed. The guard that follows each
    kernel's cluster does the same as the kernel dies (:func:`~kdist_magics.cluster.lifetime.
    remove_segments`)."""
    from ...cluster.lifetime import remove_segments

    return remove_segments(folder=folder)


def _send_remote(run, cluster, ids: list[int], name: str, value, print_: str, ranks, segments: bool) -> bool:
    """Another machine's engines ``ids``: the value travels once, to the first; it copies the
    large arrays into segments there, the others map them, and the first removes their names
    (also when a step fails: what it made, it unnames). Whether the others share its copy."""
    first, rest = cluster.client[ids[0]], ids[1:]
    desc = None
    try:
        desc = waiting.gather(
            run,
            [first.apply_async(shared.host_share, name, value, print_, bool(rest) and segments)],
            ranks,
            600,
            DURING,
        )[0]
        if rest and desc is not None:
            waiting.gather(run, [cluster.view(rest).apply_async(shared.attach, name, desc, print_)], ranks, 600, DURING)
        elif rest:  # no shared memory on that machine: each engine its own copy
            _copies(run, cluster.view(rest), name, value, print_, ranks)
    finally:
        if rest:
            try:
                first.apply_sync(shared.unname)
            except Exception:  # that engine is gone: its guard removes its names
                pass
    return bool(rest) and desc is not None


def _copies(run, view, name: str, value, print_: str, ranks) -> None:
    """Each engine of ``view`` its own copy of ``value`` (as ipyparallel sends it), held under
    ``print_`` so an unchanged push binds it again once the engine has hashed it."""
    waiting.gather(run, [view.push({name: value}, block=False)], ranks, 600, DURING)
    waiting.gather(run, [view.apply_async(shared.hold_as_sent, name, print_)], ranks, 60, DURING)


def _send(run, view, name: str, value, print_: str, ranks) -> None:
    """One segment per large array of ``value``, mapped by every engine, then unnamed."""
    made: list[Any] = []
    try:
        desc = shared.describe(value, lambda nbytes: shared.new_segment(made, nbytes))
        hold("push", run.cluster, segments=[mem.name for mem in made])
        waiting.gather(run, [view.apply_async(shared.attach, name, desc, print_)], ranks, 600, DURING)
    finally:
        for mem in made:  # mapped by every engine now (or never will be): the names go
            shared.drop(mem)
