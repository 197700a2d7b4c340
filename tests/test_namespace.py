"""Fast tier (the last test: engines): a private network's pieces (kdist_magics/cluster/namespace.py) with real processes and
sockets, no engines: the holder's namespace, a socket it hands over, a process that enters
it, the ipc URLs the controller binds, the follow command line; and one real owned cluster
started in it (ipyparallel only: no framework)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from kdist_magics.cluster import namespace
from kdist_magics.cluster.follow import command
from kernel_driver import wait_gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux's")


@pytest.fixture
def holder():
    why = namespace.unavailable()
    if why:
        pytest.skip(f"no namespace here: {why}")
    ns = namespace.Namespace().start()
    yield ns
    ns.stop()


def test_a_socket_made_in_the_namespace_is_reached_from_inside_only(holder):
    assert os.readlink(f"/proc/{holder.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    assert oct(holder.folder.stat().st_mode & 0o777) == "0o700"  # this user's alone
    server = holder.socket("127.0.0.1")
    server.listen()
    port = server.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):  # the host's loopback: nothing there
        socket.create_connection(("127.0.0.1", port), timeout=2)
    code = (
        f"from kdist_magics.cluster.namespace import enter; enter({holder.pid}); import socket; "
        f"socket.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'hi')"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    conn, _ = server.accept()
    with conn:
        assert conn.recv(2) == b"hi"
    server.close()


def test_stopping_ends_the_holder_and_removes_the_folder(holder):
    pid, folder = holder.pid, holder.folder
    holder.stop()
    assert not folder.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_follow_command_enters_the_namespace_first():
    argv = command("ipyparallel.engine", pid=1, started=2.0, nice=3, netns=77)
    assert argv[1:] == [
        "-m",
        "kdist_magics.cluster.follow",
        "--netns",
        "77",
        "--nice",
        "3",
        "1",
        "2.0",
        "ipyparallel.engine",
    ]
    assert "--netns" not in command("ipyparallel.engine", pid=1, started=2.0)


def test_the_controller_binds_ipc_urls_as_clients_read_them():
    from ipyparallel.controller.app import IPController

    from kdist_magics.cluster.compat_ipyparallel import ipc_urls_as_read

    original = IPController.construct_url
    try:
        ipc_urls_as_read()
        ipc_urls_as_read()  # once is enough; twice changes nothing
        c = IPController.__new__(IPController)
        c.engine_info = {"interface": "ipc:///tmp/k/c", "mux": 5}
        c.client_info = {"interface": "tcp://127.0.0.1", "mux": 6}
        c.internal_info = {"interface": "ipc:///tmp/k/c", "broadcast": {"0": 7}}
        assert c.construct_url("engine", "mux") == "ipc:///tmp/k/c:5"
        assert c.construct_url("client", "mux") == "tcp://127.0.0.1:6"
        assert c.construct_url("internal", "broadcast", "0") == "ipc:///tmp/k/c:7"
    finally:
        IPController.construct_url = original


@pytest.mark.engines
@pytest.mark.timeout(180)
def test_an_owned_cluster_in_a_private_network_listens_on_no_host_socket(holder, tmp_path, monkeypatch):
    """The engines run in the namespace, the controller on Unix sockets; stop ends them all."""
    import psutil

    from kdist_magics.cluster.cluster import EngineCluster
    from kdist_magics.cluster.compat_psutil import net_connections

    holder.stop()  # (the fixture's probe said yes; the cluster makes its own)
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    cluster = EngineCluster(2, private=True).start()
    try:
        ns = cluster.namespace
        assert cluster.status()["network"].startswith(
            "private (a network of the engines' own"
        )  # no pids, paths (49.14)
        nets = cluster.view().apply_sync(os.readlink, "/proc/self/ns/net")
        assert nets == [os.readlink(f"/proc/{ns.pid}/ns/net")] * 2
        host_net = os.readlink("/proc/self/ns/net")
        for pid in cluster._process_tree_pids():
            if os.readlink(f"/proc/{pid}/ns/net") == host_net:  # the controller and its schedulers
                assert not [
                    c for c in net_connections(psutil.Process(pid), "inet") if c.status == psutil.CONN_LISTEN
                ], pid
        assert any(p.name.startswith("c:") for p in ns.folder.iterdir())  # its ipc sockets
        pids = set(cluster._process_tree_pids()) | {ns.pid}
        folder = ns.folder
    finally:
        cluster.stop()
    assert not folder.exists() and cluster.namespace is None
    left, _ = wait_gone(pids, 10)
    assert not left, left


def test_status_says_whether_a_private_network_is_had_here(ip, capsys, monkeypatch):
    import kdist_magics

    ext = kdist_magics._extension
    assert ext.private_network is True  # the default
    monkeypatch.setitem(namespace._probed, "answer", None)
    ip.run_line_magic("kdist", "status")
    assert "private network: on: a cluster kdist starts gets a network of its own" in capsys.readouterr().out
    monkeypatch.setitem(namespace._probed, "answer", "this host allows no user namespace for this user (x)")
    ip.run_line_magic("kdist", "status")
    assert (
        "private network: not here (this host allows no user namespace for this user (x)): the engines "
        "share this host's loopback"
    ) in capsys.readouterr().out
    monkeypatch.setattr(ext, "private_network", False)
    ip.run_line_magic("kdist", "status")
    assert "private network: off (KDist.private_network = False)" in capsys.readouterr().out


def test_a_cluster_gets_a_private_network_by_default_where_the_host_gives_one(monkeypatch):
    monkeypatch.setitem(namespace._probed, "answer", "this host allows no user namespace for this user (x)")
    assert namespace.wanted(True) is False  # none here: the run goes on without
    monkeypatch.setitem(namespace._probed, "answer", None)
    assert namespace.wanted(True) is True
    assert namespace.wanted(False) is False  # turned off
