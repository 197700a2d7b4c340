"""Who is on the other end of a loopback connection: kdist's own listeners serve this user only.

On a shared host (an HPC node, a JupyterHub node, a lab workstation) every user shares
loopback, so binding to 127.0.0.1 keeps other machines out but not other users. Linux lists
every TCP socket with its owner's uid in ``/proc/net/tcp`` and ``/proc/net/tcp6``; the peer of
an accepted loopback connection is the socket whose local address is our connection's remote
address. :func:`allowed` accepts a peer of the same user, and any peer that is not on loopback
(an attached cluster's engines on other hosts: see docs/guide/shared-hosts.md); a loopback peer
whose owner cannot be read is refused.

Used by the kernel's Horovod rendezvous server and the abort line (``rendezvous.py``);
:func:`listener` finds the process behind an attached cluster's controller address (``cluster.py``).
Gloo's pairs, TensorFlow's gRPC servers and the JAX coordinator are other libraries' listeners
and are not covered here.
"""

from __future__ import annotations

import ipaddress
import os
import socket

TABLES = {socket.AF_INET: "/proc/net/tcp", socket.AF_INET6: "/proc/net/tcp6"}


def _hex_address(host: str, port: int, family: int) -> str:
    """An address as ``/proc/net/tcp*`` writes it: host bytes in 32-bit little-endian words."""
    packed = socket.inet_pton(family, host)
    words = [packed[i : i + 4][::-1] for i in range(0, len(packed), 4)]
    return "".join(w.hex().upper() for w in words) + f":{port:04X}"


def owner(host: str, port: int, family: int) -> int | None:
    """The uid owning the TCP socket whose local address is ``host:port``, or None."""
    table = TABLES.get(family)
    if table is None:
        return None
    want = _hex_address(host, port, family)
    try:
        with open(table) as f:
            next(f, None)  # header
            for line in f:
                fields = line.split()
                if len(fields) > 7 and fields[1] == want:
                    return int(fields[7])
    except OSError:
        return None
    return None


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process that owns the other end of ``conn`` (a loopback peer), or None."""
    try:
        host, port = conn.getpeername()[:2]
    except OSError:
        return None
    uid = owner(host, port, conn.family)
    if uid is None and conn.family == socket.AF_INET6 and host.startswith("::ffff:"):
        uid = owner(host[7:], port, socket.AF_INET)
    return uid


def on_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def allowed(conn: socket.socket, uid: int | None = None) -> bool:
    """True for a peer of this user (``uid``, default the effective uid) or one off loopback."""
    try:
        host = conn.getpeername()[0]
    except OSError:
        return False
    if not on_loopback(host):
        return True  # another host: loopback's sharing is not the question there
    if not os.path.exists(TABLES.get(conn.family, "")):
        return True  # not Linux: no socket table to ask (docs/guide/shared-hosts.md says so)
    return peer_uid(conn) == (os.geteuid() if uid is None else uid)


#: uids below this are system accounts (Debian's and Red Hat's UID_MIN)
FIRST_HUMAN_UID = 1000


def other_users(processes=None) -> list[int]:
    """Real uids of people other than this user with processes on this host (system accounts
    and root left out). ``processes``: psutil-like objects, for tests."""
    import psutil

    me = os.getuid()
    found = set()
    for proc in processes if processes is not None else psutil.process_iter(["uids"]):
        try:
            uid = proc.info["uids"].real if hasattr(proc, "info") else proc.uids().real
        except (psutil.Error, AttributeError, KeyError, TypeError):
            continue
        if uid != me and FIRST_HUMAN_UID <= uid < 65534:
            found.add(uid)
    return sorted(found)


def _this_host(host: str) -> bool:
    import psutil

    if on_loopback(host):
        return True
    try:
        return any(a.address.split("%", 1)[0] == host for addrs in psutil.net_if_addrs().values() for a in addrs)
    except Exception:
        return False


def listener(url: str) -> int | None:
    """The pid of this host's process listening on ``url`` (``tcp://HOST:PORT``); 0 when the
    address is this host's and nothing listens there; None when that cannot be told (another
    host, or a listener whose process this user cannot see)."""
    import psutil

    host, _, port = url.removeprefix("tcp://").rpartition(":")
    host = host.strip("[]")
    if not port.isdigit() or not _this_host(host):
        return None
    try:
        conns = psutil.net_connections("tcp")
    except (psutil.Error, OSError):
        return None
    wildcard = ("0.0.0.0", "::", host)
    found = [
        c
        for c in conns
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == int(port) and c.laddr.ip in wildcard
    ]
    if not found:
        return 0
    return found[0].pid or None
