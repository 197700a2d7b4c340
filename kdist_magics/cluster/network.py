"""Addresses and ports for the libraries' listeners on engines (TF_CONFIG, JAX's coordinator,
torch's store and Gloo): which address of this host to use, a free port there, the interface
that carries an address. Runs on engines; plain functions over psutil and sockets."""

from __future__ import annotations

from .compat_psutil import net_connections


def join(address: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def interface_of(address: str) -> str:
    """The name of this host's interface that has ``address`` (Gloo's ``GLOO_SOCKET_IFNAME``)."""
    import socket

    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addrs):
            return name
    raise LookupError(f"no interface of {socket.gethostname()} has the address {address}")


def engine_address(mode: str) -> str:
    """This engine's address for its library's listeners (TF_CONFIG, JAX's coordinator, torch's store).

    ``loopback``: 127.0.0.1. ``''``: the local address of this engine's connection to
    the controller. An interface name: its IPv4 (else IPv6) address. A network
    (``10.0.0.0/16``): this host's address in it. Another address: the local address
    used to route towards it.
    """
    import ipaddress
    import socket

    import psutil

    if mode == "loopback":
        return "127.0.0.1"
    if not mode:
        return _controller_side_address()
    ifaces = psutil.net_if_addrs()
    if mode in ifaces:
        addrs = [a.address for a in ifaces[mode] if a.family in (socket.AF_INET, socket.AF_INET6)]
        addrs.sort(key=lambda a: ":" in a)  # IPv4 first
        if not addrs:
            raise LookupError(f"interface {mode} has no IP address on {socket.gethostname()}")
        return addrs[0].split("%")[0]
    if "/" in mode:
        net = ipaddress.ip_network(mode, strict=False)
        for addrs in ifaces.values():
            for a in addrs:
                try:
                    if ipaddress.ip_address(a.address.split("%")[0]) in net:
                        return a.address.split("%")[0]
                except ValueError:
                    continue
        raise LookupError(f"no address in {mode} on {socket.gethostname()}")
    try:
        target = ipaddress.ip_address(mode)
    except ValueError:
        raise LookupError(
            f"KDist.worker_network {mode!r} is not an interface of {socket.gethostname()}, a network or an address"
        ) from None
    family = socket.AF_INET6 if target.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((str(target), 9))  # UDP: picks the route, sends nothing
        return s.getsockname()[0]


def _controller_side_address() -> str:
    """The local address of this engine's established TCP connections (to the controller)."""
    import psutil

    conns = [c for c in net_connections(psutil.Process(), "tcp") if c.status == psutil.CONN_ESTABLISHED and c.raddr]
    controller = _controller_ip()
    towards = [c.laddr.ip for c in conns if controller and c.raddr.ip == controller]
    if towards:
        return towards[0]
    addrs = [c.laddr.ip for c in conns]
    outside = [a for a in addrs if not a.startswith("127.") and a != "::1"]
    return (outside or addrs or ["127.0.0.1"])[0]


def _controller_ip() -> str | None:
    """The controller's IP as this engine registered with it (None when unknown)."""
    try:
        from urllib.parse import urlparse

        from ipyparallel.engine.app import IPEngine

        if not IPEngine.initialized():
            return None
        return urlparse(IPEngine.instance().registration_url).hostname
    except Exception:
        return None


def listening(address: str, backlog: int):
    """A TCP socket bound to ``address`` (IPv4 or IPv6) on a port the system picks, listening
    with ``backlog``; read its port with ``getsockname()[1]``."""
    import socket

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.listen(backlog)
    return sock


def free_port(address: str) -> int:
    return free_ports(1, address)[0]


def free_ports(n: int, address: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``address`` now (all bound at once, then released).

    They are drawn below the system's ephemeral range where there is room: a port handed out
    there can be taken, between now and the moment a worker binds it, as the source port of any
    outgoing connection on the machine (a TensorFlow worker then fails with "Could not start gRPC
    server"); a port below the range is only ever taken by an explicit bind."""
    import random
    import socket

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    low = ephemeral_range()[0]
    candidates = random.sample(range(_LOWEST, low), min(4 * n + 60, low - _LOWEST)) if low > _LOWEST else []
    socks: list[socket.socket] = []
    try:
        for port in [*candidates, *[0] * n]:
            if len(socks) == n:
                break
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.bind((address, port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
        if len(socks) < n:
            raise OSError(f"no {n} free ports on {address}")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_LOWEST = 20000  # below this sit well-known services' ports (databases, brokers, notebooks)


def ephemeral_range() -> tuple[int, int]:
    """The ports the system hands out as source ports of outgoing connections (Linux's
    ``ip_local_port_range``; its default where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def route_iface(address: str) -> str:
    """This machine's interface that reaches ``address`` (Gloo binds by interface name).

    Each engine asks for itself, so hosts whose interfaces are named differently
    (``eth0`` here, ``ens5`` there) still find each other.
    """
    import ipaddress
    import socket

    import psutil

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))  # a UDP connect only picks the route; nothing is sent
        local = probe.getsockname()[0]
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == local for a in addrs):
            return name
    if ipaddress.ip_address(local).is_loopback:
        return "lo"
    raise RuntimeError(f"no network interface carries {local}, the route to {address}")
