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
from typing import Callable, Sequence

from ...cluster.peers import allowed


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
    """A Horovod (Gloo) rendezvous for one run; ``env(i)`` is engine i's environment.

    ``elastic``: the ranks run with ``HOROVOD_ELASTIC=1`` and :meth:`shrink` re-forms the
    job with the engines still alive (see :class:`ElasticPlan`).
    ``sockets``: where the listening sockets come from (``address`` -> a bound socket): a
    private network's (:meth:`~kdist_magics.cluster.namespace.Namespace.socket`), so that the kernel
    serves on the engines' own loopback; by default bound here.
    """

    def __init__(
        self,
        hostnames: Sequence[str],
        address: str = "127.0.0.1",
        iface: str = "lo",
        elastic: bool = False,
        same_user: bool = True,
        sockets: Callable[[str], socket.socket] | None = None,
    ):
        self.hostnames = list(hostnames)
        self.address = address
        self.iface = iface
        self.slots = assign(self.hostnames)
        self.plan = ElasticPlan(self.hostnames, self.slots) if elastic else None
        self._httpd = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None
        self.abort_line: AbortLine | None = None
        #: serve connections from this user only (kdist_magics.cluster.peers; KDist.same_user_only)
        self.same_user = same_user
        self.sockets = sockets

    def start(self) -> int:
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        handler = RendezvousHandler if self.plan is None else self.plan.handler()
        if self.sockets is None:
            self._httpd = RendezvousHTTPServer((self.address, 0), handler, 0)
        else:
            premade = self.sockets(self.address)

            class Server(RendezvousHTTPServer):  # serves on the socket made in the namespace
                def server_bind(self):
                    self.socket.close()
                    self.socket = premade
                    self.server_address = premade.getsockname()

            self._httpd = Server((self.address, 0), handler, 0)
        self.port = self._httpd.server_address[1]
        self._httpd.init(self.slots)
        if self.same_user:  # socketserver closes a request this refuses, unanswered
            self._httpd.verify_request = lambda request, client_address: allowed(request)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kdist-rendezvous", daemon=True)
        self._thread.start()
        self.abort_line = AbortLine(
            self.address, same_user=self.same_user, sock=self.sockets(self.address) if self.sockets else None
        )
        return self.port

    def env(self, index: int, iface: str | None = None) -> dict[str, str]:
        """The HOROVOD_* and Gloo variables for engine ``index`` (set before ``hvd.init()``)."""
        if self.port is None:
            raise RuntimeError("Rendezvous.start() first")
        slot = self.slots[index]
        return {
            **self.common_env(slot.hostname, iface),
            "HOROVOD_RANK": str(slot.rank),
            "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        }

    def common_env(self, hostname: str, iface: str | None = None) -> dict[str, str]:
        """The variables every rank on ``hostname`` gets, whatever its rank."""
        if self.port is None:
            raise RuntimeError("Rendezvous.start() first")
        return {
            "HOROVOD_HOSTNAME": hostname,
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.address,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": iface or self.iface,
            **({"HOROVOD_ELASTIC": "1"} if self.plan is not None else {}),
        }

    def shrink(self, lost: Sequence[int]) -> dict[int, object]:
        """Re-form an elastic job without engines ``lost`` (indices); ``{engine: new slot}``
        for the engines still in it. Their next ``hvd.init()`` after the failure asks the
        store for their new rank and size and waits until this has answered."""
        if self.plan is None:
            raise RuntimeError("shrink() needs an elastic rendezvous")
        return self.plan.shrink(lost, self._httpd)

    def grow(self, hostname: str) -> tuple[int, str, dict[int, object]]:
        """Re-form an elastic job with one more engine, on ``hostname``: ``(its index, the key
        it asks the store with, {engine: new slot})``. The ranks in the job learn their new
        slot at their next reset; the new engine by asking with the key (``hvd_join``)."""
        if self.plan is None:
            raise RuntimeError("grow() needs an elastic rendezvous")
        index = len(self.plan.hostnames)  # the plan keeps every engine's host, joined ones too
        return (index, join_key(index), self.plan.grow(index, hostname, self._httpd))

    def stop(self) -> None:
        if self.plan is not None:  # a rank still asking is told it is out (the server's close
            self.plan.close()  # waits for every request it is answering)
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


class ElasticPlan:
    """Which engine is which rank in an elastic job, as it shrinks; answers the store's
    ``rank_and_size`` questions (Horovod's scope for them).

    A rank re-initialising after a failure asks with its current ``host:local_rank`` and is
    told its new ``rank,size,local_rank,local_size,cross_rank,cross_size`` (rank -1: not in
    the job any more). The answers of a re-forming are given only once every rank left has
    asked, as Horovod's own driver does: a rank blocked on another survivor (not on the lost
    one) notices the failure only when its Gloo wait times out, and the first ones to ask
    must not be in the new rendezvous already, waiting for it with the same timeout. So a
    question waits (Horovod's store does not retry a missing key here) for the kernel to
    re-form the job and for the others, up to ``wait`` seconds; then the rank is told it is out.

    Until :meth:`started`, the first plan is the answer, at once: a warm engine whose Horovod
    ran before asks too (Horovod takes the re-initialising path after any earlier shutdown).
    Once the run stops (:meth:`close`: too few ranks left, or the run's end), every question
    waiting and any asked later is told "out" at once.
    """

    wait = 120.0
    GONE = b"-1,-1,-1,-1,-1,-1"

    def __init__(self, hostnames: Sequence[str], slots):
        self.hostnames = list(hostnames)
        self.slots = {i: slot for i, slot in enumerate(slots)}  # engines still in the job
        self.sizes = [len(self.slots)]  # the world size after each re-forming
        self._answers = {_key(slot): slot.to_response_string().encode("ascii") for slot in slots}
        self._asked: set[str] = set()  # who is waiting for the next re-forming
        self._open = True  # the answers go out (the first plan; then once all have asked)
        self._closed = False  # the run stops: every rank is out
        self._lock = threading.Condition()

    def started(self) -> None:
        """Every rank has initialised: from now on only a re-forming answers."""
        with self._lock:
            self._answers, self._open = {}, False

    def shrink(self, lost: Sequence[int], httpd) -> dict[int, object]:
        with self._lock:
            old = self.slots
            alive = [i for i in sorted(old) if i not in set(lost)]
            new = dict(zip(alive, assign([self.hostnames[i] for i in alive]))) if alive else {}
            if httpd is not None:
                httpd.init(list(new.values()))  # clears the store: the old addresses go
            self._answers = {_key(old[i]): slot.to_response_string().encode("ascii") for i, slot in new.items()}
            self._open = False
            self.slots = new
            self.sizes.append(len(new))
            self._release()
        return dict(new)

    def grow(self, index: int, hostname: str, httpd) -> dict[int, object]:
        """Take engine ``index`` on ``hostname`` in; it asks with :func:`join_key`."""
        with self._lock:
            self.hostnames.append(hostname)
            old = self.slots
            members = sorted([*old, index])
            new = dict(zip(members, assign([self.hostnames[i] for i in members])))
            if httpd is not None:
                httpd.init(list(new.values()))
            self._answers = {
                (_key(old[i]) if i in old else join_key(i)): slot.to_response_string().encode("ascii")
                for i, slot in new.items()
            }
            self._open = False
            self.slots = new
            self.sizes.append(len(new))
            self._release()
        return dict(new)

    def withdraw(self, key: str) -> None:
        """The run is over before the engine asking with ``key`` could join: tell it it is out."""
        with self._lock:
            self._answers = {key: self.GONE}
            self._open = True
            self._lock.notify_all()

    def close(self) -> None:
        """The job will not re-form again (the run stops): every rank asking is out, at once."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _release(self) -> None:
        if self._answers and set(self._answers) <= self._asked:
            self._open = True
            self._lock.notify_all()

    def answer(self, key: str) -> bytes:
        with self._lock:
            self._asked.add(key)
            self._release()
            # an engine joining waits as long as the ranks take to reach a commit; the kernel
            # lets it go (withdraw) if the run ends first
            timeout = None if key.startswith(JOIN_PREFIX) else self.wait
            self._lock.wait_for(lambda: self._closed or (self._open and key in self._answers), timeout=timeout)
            self._asked.discard(key)
            if self._closed:
                return self.GONE
            answer = self._answers.pop(key, self.GONE) if self._open else self.GONE
            if not self._answers:
                self._open = False  # this re-forming is over; the next one waits again
            return answer

    def handler(self):
        from horovod.runner.http.http_server import RendezvousHandler

        plan = self

        class ElasticHandler(RendezvousHandler):
            def _get_value(self, scope, key):
                if scope == RANK_AND_SIZE:
                    return plan.answer(key)
                return super()._get_value(scope, key)

        return ElasticHandler


RANK_AND_SIZE = "rank_and_size"  # Horovod's HOROVOD_GLOO_GET_RANK_AND_SIZE scope


JOIN_PREFIX = "join-"


def join_key(index: int) -> str:
    """How an engine joining an elastic run asks for its slot (it has no local rank yet)."""
    return f"{JOIN_PREFIX}{index}"


def _key(slot) -> str:
    """How a rank names itself when it asks: its host and its current local rank."""
    return f"{slot.hostname}:{slot.local_rank}"


class AbortLine:
    """A one-way line from the kernel to every rank of a run, for "abort your collectives".

    A rank blocked in a collective whose peer failed never returns to Python; a thread
    on each rank (``strategies.on_engine._watch_abort``) connects here before the cell starts and
    blocks reading: it costs nothing while training runs (no polling, no wake-ups).
    :meth:`abort` writes one byte to every rank; :meth:`close` hangs up, which ends
    the watchers. The kernel side has no thread: connections wait in the listen
    backlog until :meth:`abort` or :meth:`close` accepts them.
    """

    def __init__(self, address: str = "127.0.0.1", same_user: bool = True, sock: socket.socket | None = None):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.same_user = same_user
        if sock is None:  # else one bound already (in a private network: namespace.py)
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.bind((address, 0))
        self._sock = sock
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
            if self.same_user and not allowed(conn):
                conn.close()  # another local user: the line is this user's ranks' only
                continue
            conn.setblocking(True)
            self._conns.append(conn)

    def abort(self) -> int:
        """Tell every connected rank to abort; returns how many were told."""
        return self.tell(b"!")

    def tell(self, what: bytes) -> int:
        """Send one byte to every connected rank (``!``: abort; ``+``: an elastic run takes
        in engines at the next commit); returns how many were told."""
        self._accept_waiting()
        told = 0
        for conn in self._conns:
            try:
                conn.sendall(what)
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
