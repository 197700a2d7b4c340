"""kdist's own listeners serve this user only (fast tier: real sockets; another uid where this
runs as root, as CI does).

The other user is a process started with ``setuid(65534)`` (nobody) running the system's
Python (``/usr/bin/python3``: the test's own interpreter may sit in a directory nobody can
read), so it is a genuine other owner in the kernel's socket tables.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kdist_magics.cluster import namespace, peers
from kdist_magics.watch.record import RunRecord
from kdist_magics.strategies.horovod.rendezvous import AbortLine

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the socket tables (/proc/net/tcp) are Linux's"
)
NOBODY = 65534
SYSTEM_PY = "/usr/bin/python3"


def as_nobody(code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    if os.geteuid() != 0:
        pytest.skip("connecting as another user needs root to switch to it (CI runs as root)")
    if not Path(SYSTEM_PY).exists():
        pytest.skip(f"{SYSTEM_PY} is missing: the other user needs an interpreter it can read")
    return subprocess.run(
        [SYSTEM_PY, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=lambda: os.setuid(NOBODY),
        cwd="/",
    )


def test_the_socket_table_names_the_owner_of_a_loopback_socket():
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, 0))
            except OSError:
                continue  # no IPv6 loopback here
            s.listen(1)
            port = s.getsockname()[1]
            assert peers.owner(host, port, family) == os.geteuid()
            with socket.create_connection((host, port)) as client:
                conn, _ = s.accept()
                with conn:
                    assert peers.peer_uid(conn) == os.geteuid() and peers.allowed(conn)
                    assert not peers.allowed(conn, uid=os.geteuid() + 1)
                    assert client  # the client end stays open until here
    assert peers.on_loopback("127.0.0.1") and peers.on_loopback("::ffff:127.0.0.1")
    assert not peers.on_loopback("10.1.2.3")


CONNECT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", {port}))
s.settimeout(20)
print(repr(s.recv(1)))
"""


def test_the_abort_line_tells_this_users_ranks_and_hangs_up_on_another_user():
    line = AbortLine("127.0.0.1")
    mine = socket.create_connection(("127.0.0.1", line.port))
    try:
        other = (
            subprocess.Popen(
                [SYSTEM_PY, "-c", CONNECT.format(port=line.port)],
                stdout=subprocess.PIPE,
                text=True,
                cwd="/",
                preexec_fn=lambda: os.setuid(NOBODY),
            )
            if os.geteuid() == 0 and Path(SYSTEM_PY).exists()
            else None
        )
        time.sleep(1.0)  # both wait in the backlog
        assert line.abort() == 1  # this user's connection only
        assert mine.recv(1) == b"!"
        if other is None:
            pytest.skip("connecting as another user needs root (CI runs as root)")
        out, _ = other.communicate(timeout=30)
        assert out.strip() == "b''"  # hung up on, told nothing
    finally:
        mine.close()
        line.close()


PUT = """
import urllib.request
req = urllib.request.Request("http://127.0.0.1:{port}/global/attacker", data=b"x", method="PUT")
try:
    print(urllib.request.urlopen(req, timeout=20).status)
except Exception as exc:
    print(type(exc).__name__)
"""


def test_the_horovod_rendezvous_answers_this_user_only():
    pytest.importorskip("horovod.runner.http.http_server", reason="Horovod's rendezvous server")
    import urllib.request

    from kdist_magics.strategies.horovod.rendezvous import Rendezvous

    rdv = Rendezvous(["localhost", "localhost"])
    port = rdv.start()
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/global/mine", data=b"x", method="PUT")
        assert urllib.request.urlopen(req, timeout=20).status == 200
        out = as_nobody(PUT.format(port=port))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() in ("RemoteDisconnected", "ConnectionResetError", "URLError"), out.stdout
        opened = Rendezvous(["localhost"], same_user=False)  # KDist.same_user_only = False
        open_port = opened.start()
        try:
            assert as_nobody(PUT.format(port=open_port)).stdout.strip() == "200"
        finally:
            opened.stop()
    finally:
        rdv.stop()


class _Proc:
    def __init__(self, uid):
        self.info = {"uids": type("U", (), {"real": uid})()}


def test_other_users_are_people_with_processes_here_not_system_accounts():
    me = os.getuid()
    procs = [_Proc(u) for u in (me, 0, 1, 100, 999, 1000, 1001, 1001, 65534)]
    assert peers.other_users(procs) == sorted({1000, 1001} - {me})
    assert isinstance(peers.other_users(), list)  # this machine's, for real


def test_the_shared_host_line_names_who_and_what_stays_open():
    from kdist_magics.messages import EXPOSED, shared_host

    line = shared_host([1001, 1002], EXPOSED["horovod"])  # the private network turned off
    assert "uid 1001, 1002" in line and "the ranks' Gloo pairs" in line and "only you" in line
    assert "KDist.private_network = True (the default)" in line
    line = shared_host([1001], EXPOSED["jax"], "this host allows no user namespace for this user (x)")
    assert "no private network (this host allows no user namespace for this user (x))" in line
    assert "a container or an exclusive node" in line and "the JAX coordinator" in line
    assert set(EXPOSED) == {"horovod", "multiworker", "jax", "torch"}


def test_the_first_engine_run_on_a_shared_host_says_once_what_stays_open(ip, monkeypatch, capsys):
    import kdist_magics
    from kdist_magics import spec as specmod

    monkeypatch.setattr(peers, "other_users", lambda: [1001])

    class EngineRun:  # a stand-in engine strategy: the line comes before its run
        in_kernel = False
        exposure = "multiworker"

        def run(self, cell, ctx):
            return None

    ext = kdist_magics._extension
    spec = specmod.parse_line("--strategy multiworker --np 2")
    for answer in (None, "this host allows no user namespace for this user (x)"):
        monkeypatch.setitem(namespace._probed, "answer", answer)
        monkeypatch.setattr(ext, "_sharing_said", False)
        ext.execute(EngineRun(), "pass", spec, RunRecord("multiworker", size=2))
        err = capsys.readouterr().err
        if answer is None:  # the engines get a network of their own: nothing to say
            assert "other users" not in err
            continue
        assert "kdist: other users have processes on this host (uid 1001)" in err
        assert "TensorFlow's gRPC workers" in err and "no private network" in err
        ext.execute(EngineRun(), "pass", spec, RunRecord("multiworker", size=2))
        assert "other users" not in capsys.readouterr().err  # once per kernel
    monkeypatch.setattr(ext, "private_network", False)  # turned off: said too
    monkeypatch.setattr(ext, "_sharing_said", False)
    ext.execute(EngineRun(), "pass", spec, RunRecord("multiworker", size=2))
    assert "KDist.private_network = True (the default)" in capsys.readouterr().err


def test_listener_names_the_local_process_behind_an_address_and_says_when_nothing_listens():
    """How kdist finds an attached cluster's controller on this host (cluster.py)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    try:
        assert peers.listener(f"tcp://127.0.0.1:{port}") == os.getpid()
    finally:
        sock.close()
    assert peers.listener(f"tcp://127.0.0.1:{port}") == 0  # this host's address, nothing there
    assert peers.listener("tcp://192.0.2.1:5555") is None  # another host's (TEST-NET): cannot tell
    assert peers.listener("tcp://127.0.0.1:notaport") is None
