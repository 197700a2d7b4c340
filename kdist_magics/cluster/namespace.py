"""A private network for a cluster kdist starts: its engines' loopback is theirs alone.

On a shared host every user shares loopback, and what the ranks listen on there (Gloo's
pairs, TensorFlow's gRPC workers, the JAX coordinator, torch's store) authenticates nothing.
With ``KDist.private_network`` kdist starts, per cluster, a small **holder** process in a new
user and network namespace of its own (``python -m kdist_magics.cluster.namespace``: no privilege
needed where the host allows unprivileged user namespaces, as most Linux distributions do):

* the engines enter its namespaces before anything else runs in them
  (``kdist_magics.cluster.follow --netns PID``), so every socket they open is on a loopback no other
  process on the host can reach;
* the kernel reaches the controller over Unix-domain sockets (ipyparallel's ``ipc``
  transport) in a directory only this user can open (:attr:`Namespace.folder`, 0700);
* kdist's own kernel-side listeners (the Horovod rendezvous, the abort line) get sockets the
  holder opens inside the namespace and hands over (:meth:`Namespace.socket`, SCM_RIGHTS),
  so the kernel serves on the engines' loopback from outside it.

The holder ends with the kernel (:mod:`.lifetime`, as :mod:`.follow` processes do) and with the cluster.
:func:`unavailable` says, once per process and cheaply, why a namespace cannot be had here.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
READY = b"kdist-namespace-ready\n"
START_WITHIN = 10.0  # seconds for the holder to say it is ready

_probed: dict[str, str | None] = {}


def _syscall(name: str, *args: int) -> None:
    """``os.<name>`` (Python 3.12+), else the C library's, raising OSError as ``os`` does."""
    if hasattr(os, name):
        getattr(os, name)(*args)
    elif getattr(ctypes.CDLL(None, use_errno=True), name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def unshare(flags: int) -> None:
    """``unshare(2)``."""
    _syscall("unshare", flags)


def setns(path: str, nstype: int) -> None:
    """Join the namespace at ``path`` (``/proc/PID/ns/net``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _syscall("setns", fd, nstype)
    finally:
        os.close(fd)


def enter(holder: int) -> None:
    """Join the holder's user and network namespaces (a single-threaded process only: call it
    first thing, as ``kdist_magics.cluster.follow --netns`` does)."""
    setns(f"/proc/{holder}/ns/user", CLONE_NEWUSER)
    setns(f"/proc/{holder}/ns/net", CLONE_NEWNET)


def unavailable() -> str | None:
    """None where this user can make a user and network namespace here, else why not (asked
    once per process, in a child: ``unshare`` needs a single-threaded caller)."""
    if "answer" not in _probed:
        if not sys.platform.startswith("linux"):
            _probed["answer"] = "network namespaces are Linux's"
        else:
            code = (
                "import sys; from kdist_magics.cluster.namespace import make_private\n"
                "try:\n    make_private()\n"
                "except OSError as e:\n    sys.exit(f'{e.strerror or e}')"
            )
            try:
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
                why = None if out.returncode == 0 else (out.stderr.strip().splitlines() or ["?"])[-1]
            except (OSError, subprocess.SubprocessError) as exc:
                why = str(exc)
            _probed["answer"] = why and f"this host allows no user namespace for this user ({why})"
    return _probed["answer"]


def wanted(enabled: bool) -> bool:
    """Whether a cluster kdist starts gets a private network: ``KDist.private_network``
    (``enabled``, the default) where this host gives one. (Where it gives none, the extension
    says so once, with who else is here: ``messages.shared_host``.)"""
    return enabled and not unavailable()


class Namespace:
    """The holder of one cluster's namespaces, and the private folder of its ``ipc`` sockets."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="kdist-"))  # 0700: this user's alone
        self.control = str(self.folder / "holder")
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else -1

    def start(self) -> "Namespace":
        import psutil

        me = os.getpid()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kdist_magics.cluster.namespace",
                str(me),
                repr(psutil.Process(me).create_time()),
                self.control,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,
        )  # a kernel interrupt (SIGINT to its group) passes it by
        deadline = time.monotonic() + START_WITHIN
        line = b""
        os.set_blocking(self.process.stdout.fileno(), False)
        while time.monotonic() < deadline and self.process.poll() is None:
            line += self.process.stdout.read() or b""
            if line.endswith(READY):
                return self
            time.sleep(0.01)
        err = b"" if self.process.poll() is None else self.process.stderr.read() or b""
        self.stop()
        last = (err.decode(errors="replace").strip().splitlines() or ["no answer"])[-1]
        raise OSError(f"the network namespace's holder did not start: {last}")

    def socket(self, address: str = "127.0.0.1") -> socket.socket:
        """A TCP socket bound to ``address`` (port chosen) inside the namespace, not listening."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as line:
            line.settimeout(10)
            line.connect(self.control)
            line.sendall(address.encode() + b"\n")
            _, fds, _, _ = socket.recv_fds(line, 64, 1)
        if not fds:
            raise OSError(f"the namespace's holder could not bind {address}")
        return socket.socket(fileno=fds[0])

    @property
    def gone(self) -> bool:
        """The holder has ended (the engines keep their namespace, but nothing new is bound there)."""
        return self.process is not None and self.process.poll() is not None

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        shutil.rmtree(self.folder, ignore_errors=True)


# -- the holder ----------------------------------------------------------------------------
def _map_self(uid: int, gid: int) -> None:
    """This user (and group) is itself inside the new user namespace (the ids as they were
    before it: inside an unmapped one they read as the overflow id). Root without
    CAP_SETFCAP may not map itself (Linux >= 5.12): its processes then read as the overflow
    id inside, and the files they open are still judged by who they are outside."""
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except PermissionError:
        if uid != 0:
            raise


def _loopback_up() -> None:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _serve(control: str) -> None:
    """Answer each request (an address, one line) with a socket bound there, port chosen."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(control)
    os.chmod(control, 0o600)
    server.listen(16)
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    while True:
        conn, _ = server.accept()
        with conn:
            try:
                address = conn.makefile("rb").readline().decode().strip()
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                with socket.socket(family, socket.SOCK_STREAM) as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind((address, 0))
                    socket.send_fds(conn, [b"ok"], [sock.fileno()])
            except OSError:
                pass  # the kernel sees no fd and says so


def make_private() -> None:
    """Move this (single-threaded) process into a new user and network namespace, itself inside
    it, with its loopback up. (A host may allow the namespace but not what follows, as
    AppArmor's restriction of unprivileged user namespaces does: each step raises then.)"""
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER | CLONE_NEWNET)  # first: a process with threads cannot
    _map_self(uid, gid)
    _loopback_up()


def main(argv: list[str]) -> None:
    pid, started, control = argv
    make_private()
    from .lifetime import end_with

    end_with(int(pid), float(started))  # ends with the kernel, taking nothing else along
    _serve(control)


if __name__ == "__main__":
    main(sys.argv[1:])
