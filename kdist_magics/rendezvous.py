"""Horovod's own rendezvous and host assignment, bound to one address.

Horovod's ``RendezvousServer.start`` binds every interface. kdist runs the same
server class (``RendezvousHTTPServer`` with Horovod's handler) on the address
it is given: loopback for a local cluster, an address every engine can reach
for an attached one. Rank, local rank and cross rank come from Horovod's
``get_host_assignments`` over the engines' hostnames, so engines that share a
host share a local-rank space exactly as under ``horovodrun``.
"""

from __future__ import annotations

import socket
import threading
from collections import OrderedDict
from typing import Sequence


def assign(hostnames: Sequence[str]):
    """Horovod slots for processes on ``hostnames`` (one entry per engine, in engine order).

    Returns a list of ``SlotInfo``, index i for engine i.
    """
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    counts: "OrderedDict[str, int]" = OrderedDict()
    for host in hostnames:
        counts[host] = counts.get(host, 0) + 1
    slots = get_host_assignments([HostInfo(h, n) for h, n in counts.items()], len(hostnames))
    by_host: dict[str, list] = {}
    for slot in slots:
        by_host.setdefault(slot.hostname, []).append(slot)
    return [by_host[host].pop(0) for host in hostnames]


class Rendezvous:
    """A Horovod (Gloo) rendezvous for one run; ``env(i)`` is engine i's environment."""

    def __init__(self, hostnames: Sequence[str], address: str = "127.0.0.1", iface: str = "lo"):
        self.hostnames = list(hostnames)
        self.address = address
        self.iface = iface
        self.slots = assign(self.hostnames)
        self._httpd = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None
        self.abort_line: AbortLine | None = None

    def start(self) -> int:
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self._httpd = RendezvousHTTPServer((self.address, 0), RendezvousHandler, 0)
        self.port = self._httpd.server_address[1]
        self._httpd.init(self.slots)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kdist-rendezvous",
                                        daemon=True)
        self._thread.start()
        self.abort_line = AbortLine(self.address)
        return self.port

    def env(self, index: int, iface: str | None = None) -> dict[str, str]:
        """The HOROVOD_* and Gloo variables for engine ``index`` (set before ``hvd.init()``)."""
        if self.port is None:
            raise RuntimeError("Rendezvous.start() first")
        slot = self.slots[index]
        return {
            "HOROVOD_HOSTNAME": slot.hostname,
            "HOROVOD_RANK": str(slot.rank),
            "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.address,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": iface or self.iface,
        }

    def stop(self) -> None:
        if self.abort_line is not None:
            self.abort_line.close()
            self.abort_line = None
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


class AbortLine:
    """A one-way line from the kernel to every rank of a run, for "abort your collectives".

    A rank blocked in a collective whose peer failed never returns to Python; a thread
    on each rank (``strategies.horovod._watch_abort``) connects here before the cell starts and
    blocks reading: it costs nothing while training runs (no polling, no wake-ups).
    :meth:`abort` writes one byte to every rank; :meth:`close` hangs up, which ends
    the watchers. The kernel side has no thread: connections wait in the listen
    backlog until :meth:`abort` or :meth:`close` accepts them.
    """

    def __init__(self, address: str = "127.0.0.1"):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.bind((address, 0))
        self._sock.listen(256)
        self._sock.setblocking(False)
        self.address = address
        self.port: int = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []

    def _accept_waiting(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # BlockingIOError: nobody else is waiting
                return
            conn.setblocking(True)
            self._conns.append(conn)

    def abort(self) -> int:
        """Tell every connected rank to abort; returns how many were told."""
        self._accept_waiting()
        told = 0
        for conn in self._conns:
            try:
                conn.sendall(b"!")
                told += 1
            except OSError:  # that rank is gone already
                pass
        return told

    def close(self) -> None:
        if self._sock is None:
            return
        self._accept_waiting()
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass
        self._conns = []
        self._sock.close()
        self._sock = None
