"""The engines' link, measured: an all-reduce of the model's gradient bytes between them.

Through the collective the cell's strategy uses where kdist can reach it (Horovod's,
``torch.distributed``'s, XLA's across JAX's processes, ``MultiWorkerMirroredStrategy``'s), timed on
every rank at the end of the probed ``fit`` by :mod:`.collectives` and sent in the probe's row
(:func:`from_ranks` in the kernel, which names it: :data:`HOROVOD`, :data:`TORCH`, :data:`JAX`,
:data:`TF`). Elsewhere kdist's own ring, said in the table's head (:data:`RING`):

kdist's own ring over plain TCP sockets (NumPy arrays, no framework), on the address each
engine's library would listen on (:func:`kdist_magics.cluster.network.engine_address`), so it
runs the same for every strategy and backend: reduce-scatter then all-gather, ``2 (N - 1)``
steps, each rank sending one chunk to the next while it receives one from the previous. Every
rank starts with ``rank + 1`` everywhere, so the result (``N (N + 1) / 2`` everywhere) checks the
ring itself. The seconds of the slowest rank per repeat, median over the repeats, for the
gradient bytes (4 MiB at least, more while they take under 4 times the tiny one) and the least
for a tiny array (the latency) give a :class:`~kdist_magics.scale.model.Link`.

:func:`listen` and :func:`allreduce` run on the engines; :func:`measure` in the kernel.
"""

from __future__ import annotations

import statistics
from typing import Any

_ring: dict[str, Any] = {}

#: how the link was timed (the table's head says it)
HOROVOD, RING = "Horovod's all-reduce", "kdist's TCP ring"
TORCH = "torch.distributed's all-reduce, {backend}"
JAX = "XLA's all-reduce across jax.distributed's processes, {platform}"
TF = "MultiWorkerMirroredStrategy's all-reduce"

#: bytes of the tiny all-reduce that measures latency (one float32 per rank and more)
TINY = 64


def listen(mode: str) -> str:
    """Open this engine's listening socket for the ring; ``host:port``."""
    from ..cluster.network import engine_address, join, listening

    close()
    address = engine_address(mode)
    server = _ring["server"] = listening(address, 8)  # (room for a stray connection or two)
    return join(address, server.getsockname()[1])


def close() -> None:
    for key in ("server", "right", "left"):
        sock = _ring.pop(key, None)
        if sock is not None:
            sock.close()


#: what a rank says first on its connection to the right: the ring (a digest of its peers) and
#: its rank. A listener takes only its left neighbour's: a stray connection (a TensorFlow, JAX or
#: torch client retrying a port its own server held, now this listener's) is closed, and it
#: waits on (make test, 5 Dec: a 3-rank ring took one for its neighbour)
HELLO = b"kdist-ring "
#: seconds a connection is given to say who it is
HELLO_WAIT = 5.0


def _hello(peers: list[str], rank: int) -> bytes:
    import hashlib

    return HELLO + hashlib.sha256("\n".join(peers).encode()).digest()[:16] + rank.to_bytes(4, "big")


def _connect(peers: list[str], rank: int, timeout: float) -> None:
    import socket

    host, port = peers[(rank + 1) % len(peers)].rsplit(":", 1)
    right = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    right.sendall(_hello(peers, rank))
    left = _accept(_hello(peers, (rank - 1) % len(peers)), timeout)
    for sock in (right, left):
        sock.settimeout(timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _ring.update(right=right, left=left)


def _accept(hello: bytes, timeout: float):
    """The first connection to this rank's listener that says ``hello``, within ``timeout``
    seconds (then ``TimeoutError``, as an accept that waits too long); others are closed."""
    import time

    server = _ring["server"]
    deadline = time.monotonic() + timeout
    while True:
        server.settimeout(max(deadline - time.monotonic(), 0.001))
        sock, _ = server.accept()
        sock.settimeout(min(HELLO_WAIT, max(deadline - time.monotonic(), 0.001)))
        said = b""
        try:
            while len(said) < len(hello) and (more := sock.recv(len(hello) - len(said))):
                said += more
        except OSError:  # silent or reset: not the neighbour
            pass
        if said == hello:
            return sock
        sock.close()


def _exchange(send, recv_into) -> None:
    """Send ``send`` to the right while receiving into ``recv_into`` from the left."""
    import threading

    sender = threading.Thread(target=_ring["right"].sendall, args=(memoryview(send).cast("B"),))
    sender.start()
    view = memoryview(recv_into).cast("B")
    got = 0
    while got < len(view):
        n = _ring["left"].recv_into(view[got:])
        if not n:
            raise ConnectionError("the ring's left neighbour closed its connection")
        got += n
    sender.join()


def _ring_allreduce(data, n: int, rank: int) -> None:
    import numpy as np

    chunks = np.array_split(data, n)
    scratch = np.empty_like(chunks[0])
    for k in range(n - 1):  # reduce-scatter
        send, recv = chunks[(rank - k) % n], chunks[(rank - k - 1) % n]
        buf = scratch[: len(recv)]
        _exchange(np.ascontiguousarray(send), buf)
        recv += buf
    for k in range(n - 1):  # all-gather
        send, recv = chunks[(rank + 1 - k) % n], chunks[(rank - k) % n]
        _exchange(np.ascontiguousarray(send), recv)


def allreduce(peers: list[str], rank: int, nbytes: int, repeats: int, timeout: float = 60.0) -> dict[str, Any]:
    """On an engine: ``repeats`` ring all-reduces of ``nbytes`` and of :data:`TINY` bytes; the
    seconds of each, and whether the sums were right."""
    import time

    import numpy as np

    n = len(peers)
    _connect(peers, rank, timeout)
    try:
        out: dict[str, Any] = {"big": [], "tiny": [], "right": True}
        for key, size in (("tiny", TINY), ("big", nbytes)):
            for _ in range(repeats + 1):  # the first is a warm-up
                data = np.full(max(size // 4, n), rank + 1, dtype=np.float32)
                start = time.perf_counter()
                _ring_allreduce(data, n, rank)
                out[key].append(time.perf_counter() - start)
                out["right"] = out["right"] and bool(np.all(data == n * (n + 1) / 2))
            out[key] = out[key][1:]
        return out
    finally:
        close()


#: the link's bandwidth is timed on at least this many bytes: below it, an all-reduce is mostly
#: latency, and bytes / (its time less the latency) is noise (a 0.3 MiB model read 271 TB/s)
MIN_BYTES = 4 * 2**20
#: ... and on more, up to this many, while the bytes' all-reduce takes under BIG_OVER_TINY times
#: the tiny one's (a fast link, or a loaded host whose delays swamp 4 MiB)
MAX_BYTES = 64 * 2**20
BIG_OVER_TINY = 4


def _timings(cluster, mode: str, nbytes: int, repeats: int) -> tuple[float, float]:
    """The median seconds of the slowest rank's all-reduce of ``nbytes``, and the least of a
    tiny one's (the latency is a floor: a loaded host's delays only add to it)."""
    engines = list(cluster.engines)
    client = cluster.client
    peers = [client[e.engine_id].apply_sync(listen, mode) for e in engines]
    runs = [
        client[e.engine_id].apply_async(allreduce, peers, rank, int(nbytes), repeats) for rank, e in enumerate(engines)
    ]
    try:
        results = [r.get(timeout=600) for r in runs]
    except KeyboardInterrupt:  # Stop: the engines' ring is interrupted too, then one line
        import signal

        from ..errors import Interrupted
        from ..messages import SCALE_INTERRUPTED

        cluster.signal(signal.SIGINT)
        for r in runs:
            try:
                r.get(timeout=10)
            except BaseException:  # noqa: BLE001 (the interrupted ring's own error)
                pass
        raise Interrupted(SCALE_INTERRUPTED) from None
    if not all(r["right"] for r in results):
        raise RuntimeError("the ring all-reduce between the engines summed wrongly")
    slowest = [max(t) for t in zip(*(r["big"] for r in results))]
    tiny = [max(t) for t in zip(*(r["tiny"] for r in results))]
    return statistics.median(slowest), min(tiny)


def _grown(time_at, nbytes: int) -> tuple[float, float, int]:
    """``time_at(bytes) -> (big, tiny)`` at ``nbytes`` (:data:`MIN_BYTES` at least: a small
    model's bytes would time the latency only), then on 4 times more while the big all-reduce
    takes under :data:`BIG_OVER_TINY` times the tiny one, up to :data:`MAX_BYTES`; the last
    figures and their bytes."""
    nbytes = max(int(nbytes), MIN_BYTES)
    big, tiny = time_at(nbytes)
    while big < BIG_OVER_TINY * tiny and nbytes < MAX_BYTES:
        nbytes = min(4 * nbytes, MAX_BYTES)
        big, tiny = time_at(nbytes)
    return big, tiny, nbytes


def from_ranks(rows: list[dict[str, Any]], n: int, hosts: int = 1):
    """The :class:`~kdist_magics.scale.model.Link` the ranks timed with the cell's own
    collective (:mod:`.collectives`' figures, in each probe row's ``link``); None where any
    rank has no such figure."""
    from dataclasses import replace

    from .model import link_from

    timed = [r.get("link") for r in rows]
    if len(timed) < n or not all(timed):
        return None
    if not all(t["right"] for t in timed):
        raise RuntimeError(f"{timed[0].get('via', HOROVOD)} between the engines summed wrongly")
    big, tiny = max(t["big_s"] for t in timed), max(t["tiny_s"] for t in timed)
    return replace(link_from(big, timed[0]["nbytes"], tiny, n, hosts), via=timed[0].get("via", HOROVOD))


def measure(cluster, mode: str, nbytes: int, repeats: int = 3, hosts: int = 1):
    """In the kernel: the :class:`~kdist_magics.scale.model.Link` between ``cluster``'s
    engines (all of them, in their order), through kdist's ring."""
    from dataclasses import replace

    from .model import link_from

    big, tiny, nbytes = _grown(lambda size: _timings(cluster, mode, size, repeats), nbytes)
    return replace(link_from(big, nbytes, tiny, len(list(cluster.engines)), hosts), via=RING)
