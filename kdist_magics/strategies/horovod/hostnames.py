"""Whether every engine resolves every engine's hostname (Horovod's Gloo finds its peers by
the hostname each rank reports; a name that does not resolve aborts every rank, which kdist
would otherwise only see as engines leaving the cluster)."""

from __future__ import annotations

from ...errors import KDistError
from ...messages import unresolved_hosts


def _unresolved(names: list[str]) -> list[str]:  # runs on an engine
    import socket

    missing = []
    for name in names:
        try:
            socket.getaddrinfo(name, None)
        except OSError:
            missing.append(name)
    return missing


def check(cluster, ranks: list[int]) -> None:
    """Raise :class:`KDistError` naming each rank (and its host) that cannot resolve a peer's name."""
    names = sorted({e.hostname for e in cluster.engines})
    answers = cluster.view().apply_async(_unresolved, names).get(timeout=60)
    problems = {(rank, e.hostname): missing for rank, e, missing in zip(ranks, cluster.engines, answers) if missing}
    if problems:
        raise KDistError(unresolved_hosts(problems))
