"""``--launcher ray`` across two "hosts": a Ray head on this machine and a second Ray node in a
network namespace, so the ranks Ray spreads really talk between hosts.

The namespace (its own address on a bridge, its own hostname through ``unshare --uts``) is a
second machine as the netns tier builds them (tests/test_netns.py). The head listens on the
bridge (``--node-ip-address``); the second node joins it from inside the namespace. The kernel
is a driver on the head's machine (the notebook on the head, as in docs/guide/ray.md), with
``KDist.bind_address`` on the bridge and ``KDist.worker_network`` the bridge's network.

Horovod finds each rank by its hostname: the namespace sees ``/etc/netns/NS/hosts``, and the head
(with everything it starts: its raylet, the actors, rank 0's engine) runs in a mount namespace
of its own where ``/etc/hosts`` names both hosts, so this machine's own ``/etc/hosts`` is never
touched.

Tested: multiworker on TensorFlow and on Keras' JAX backend, and horovod, across the two nodes
end with identical weights on both ranks, one on each host; then the second node is killed whole mid-run (every process in
its namespace), and the run ends within seconds naming the rank and its node ("the Ray node
died"), with nothing of kdist's left reserved on Ray. Needs root, ``ip``, ``unshare`` and Ray;
skipped, saying which is missing, elsewhere.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import kdist_magics
import kernel_driver
from kdist_magics.errors import RankDied
from test_netns import _run, netns_unavailable
from test_ray import HOROVOD, TRAIN, _stop_head, ask_ray, held, listens, wait_for

pytestmark = [pytest.mark.netns, pytest.mark.ray, pytest.mark.engines, pytest.mark.slow, pytest.mark.timeout(900)]

NODE_B = "kd-ray-b"


class RayHosts:
    """The bridge, the second host's namespace, the Ray head (here) and node (there)."""

    def __init__(self):
        tag = f"{os.getpid() % 100000:05d}"
        self.subnet = 20 + (os.getpid() + 101) % 200  # not the netns tier's bridge beside it
        self.bridge, self.veth, self.peer = f"kdr{tag}", f"kdrv{tag}", f"kdrp{tag}"
        self.ns = f"kdist-{os.getpid()}-ray"
        self.head_ip, self.node_ip = f"10.214.{self.subnet}.1", f"10.214.{self.subnet}.11"
        self.network = f"10.214.{self.subnet}.0/24"
        self.made: list[tuple[str, ...]] = []  # how to undo each step, last first
        self.temp = Path(tempfile.mkdtemp(prefix="kdist-ray-hosts-"))
        self.head = self.node = None
        self.address = ""

    def build(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("ip", "link", "del", self.bridge))
        _run("ip", "addr", "add", f"{self.head_ip}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        _run("ip", "netns", "add", self.ns)
        self.made.append(("ip", "netns", "del", self.ns))
        _run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", self.peer)
        self.made.append(("ip", "link", "del", self.veth))
        _run("ip", "link", "set", self.peer, "netns", self.ns)
        _run("ip", "-n", self.ns, "addr", "add", f"{self.node_ip}/24", "dev", self.peer)
        _run("ip", "-n", self.ns, "link", "set", self.peer, "up")
        _run("ip", "-n", self.ns, "link", "set", "lo", "up")
        _run("ip", "link", "set", self.veth, "master", self.bridge)
        _run("ip", "link", "set", self.veth, "up")
        hosts = f"127.0.0.1 localhost\n{self.head_ip} {socket.gethostname()}\n{self.node_ip} {NODE_B}\n"
        folder = Path("/etc/netns") / self.ns
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text(hosts)
        (self.temp / "hosts").write_text(hosts)

    def start_ray(self) -> None:
        ray = shutil.which("ray", path=os.path.dirname(sys.executable))
        port = 30000 + os.getpid() % 2000
        self.address = f"{self.head_ip}:{port}"
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(Path(__file__).parents[1])}
        common = ["--num-cpus=1", "--disable-usage-stats", "--object-store-memory=100000000", "--block"]
        self.head = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount --bind "$1" /etc/hosts && shift && exec "$@"',
                "sh",
                str(self.temp / "hosts"),
                ray,
                "start",
                "--head",
                f"--port={port}",
                f"--node-ip-address={self.head_ip}",
                "--include-dashboard=false",
                f"--temp-dir={self.temp / 'ray'}",
                *common,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        wait_for(lambda: listens(self.head_ip, port), 120, "the Ray head did not listen")
        self.node = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.ns,
                "unshare",
                "--uts",
                "sh",
                "-c",
                f'hostname {NODE_B} && exec "$@"',
                "sh",
                ray,
                "start",
                f"--address={self.address}",
                f"--node-ip-address={self.node_ip}",
                *common,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        wait_for(
            lambda: ask_ray(self.address, "print(sum(n['Alive'] for n in ray.nodes()))") == 2,
            120,
            "the second Ray node did not join",
        )

    def kill_node(self) -> int:
        """Every process of the second host, SIGKILLed at once (the machine lost)."""
        pids = _run("ip", "netns", "pids", self.ns, check=False).stdout.split()
        if pids:
            subprocess.run(["kill", "-9", *pids], check=False)
        return len(pids)

    def destroy(self) -> None:
        import psutil

        try:
            self.kill_node()
            if self.head is not None and self.head.poll() is None:
                _stop_head(self.head, psutil)
        finally:
            for undo in reversed(self.made):
                _run(*undo, check=False)
            shutil.rmtree(Path("/etc/netns") / self.ns, ignore_errors=True)
            try:
                Path("/etc/netns").rmdir()  # only when empty
            except OSError:
                pass
            shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_hosts():
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    pytest.importorskip("ray", reason="Ray is in the ray extra (make test installs it)")
    hosts = RayHosts()
    try:
        hosts.build()
        hosts.start_ray()
        yield hosts
    finally:
        left = None
        if hosts.head is not None and hosts.head.poll() is None:
            try:
                left = held(hosts.address)
            except AssertionError as exc:
                left = str(exc)
        hosts.destroy()
        gone = _run("ip", "netns", "list", check=False).stdout
        assert hosts.ns not in gone, f"namespace left behind: {gone}"
        assert left in (None, {"placement groups": [], "actors": []}), f"left on Ray: {left}"


@pytest.fixture
def across(ip, ray_hosts):
    """The kernel set to talk on the bridge (the ``ip`` fixture restores the settings)."""
    ip.run_line_magic("config", f"KDist.bind_address = {ray_hosts.head_ip!r}")
    ip.run_line_magic("config", f"KDist.worker_network = {ray_hosts.network!r}")
    try:
        yield ray_hosts
    finally:
        ip.run_line_magic("kdist", "stop")


def _same(weights) -> None:
    for a, b in zip(*weights):
        np.testing.assert_array_equal(np.array(a), np.array(b))


def test_multiworker_and_horovod_spread_over_two_ray_hosts_end_identical(ip, across):
    """One rank on each host (spread): TF_CONFIG carries the two hosts' addresses, never
    loopback; horovod's ranks meet across the bridge; identical weights after each."""
    line = f"--np 2 --launcher ray --address {across.address} --placement spread --no-dashboard"
    ip.run_cell_magic("kdist", f"--strategy multiworker {line}", TRAIN)
    strategy = kdist_magics._extension._strategies["multiworker"]
    assert sorted(kernel_driver.engine_values(strategy, "kd_node")) == sorted([socket.gethostname(), NODE_B])
    assert sorted(a.split(":")[0] for a in strategy.addresses) == [across.head_ip, across.node_ip]
    assert not strategy.cluster.loopback
    _same(kernel_driver.engine_values(strategy, "kd_weights"))
    ip.run_line_magic("kdist", "stop")

    ip.run_cell_magic("kdist", f"--strategy horovod {line}", HOROVOD)
    strategy = kdist_magics._extension._strategies["horovod"]
    assert sorted(kernel_driver.engine_values(strategy, "kd_node")) == sorted([socket.gethostname(), NODE_B])
    _same(kernel_driver.engine_values(strategy, "kd_weights"))
    rec = kdist_magics.last_run()
    assert rec.status == "done" and {r.host for r in rec.ranks.values()} == {socket.gethostname(), NODE_B}


def test_keras_on_jax_spread_over_two_ray_hosts_trains_one_model(ray_hosts):
    """multiworker under KERAS_BACKEND=jax (a kernel of its own: the backend is fixed at Keras'
    import) with one process on each Ray host: JAX's coordinator on the bridge, both processes
    end with the same weights and the same losses."""
    pytest.importorskip("jax", reason="JAX is in the jax extra (make test installs it)")
    from conftest import PROCESS_FIT

    line = f"--strategy multiworker --np 2 --launcher ray --address {ray_hosts.address} --no-dashboard"
    cell = PROCESS_FIT + "import socket\nkd_node = socket.gethostname()\n"
    r = kernel_driver.run_in_fresh_shell(
        f"""
        ip.run_line_magic("config", "KDist.bind_address = {ray_hosts.head_ip!r}")
        ip.run_line_magic("config", "KDist.worker_network = {ray_hosts.network!r}")
        value, err = attempt({line!r}, {cell!r})
        out["err"] = repr(err) if err is not None else None
        if err is None:
            out["weights"], out["loss"], out["node"] = by_rank("kd_weights"), by_rank("kd_loss"), by_rank("kd_node")
        ip.run_line_magic("kdist", "stop")
        """,
        env={"KERAS_BACKEND": "jax"},
    )
    assert r["err"] is None, r["err"] + r["_stdout"][-3000:] + r["_stderr"][-2000:]
    assert sorted(r["node"]) == sorted([socket.gethostname(), NODE_B])
    _same(r["weights"])
    assert r["loss"][0] == r["loss"][1] and r["loss"][0][-1] < r["loss"][0][0], r["loss"]


SLOW_FIT = """
import time, numpy as np, keras
x = np.random.default_rng(0).normal(size=(128, 4)).astype("float32"); y = x.sum(1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
class Slow(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"kd-epoch {epoch}", flush=True)
        time.sleep(0.5)
model.fit(x, y, batch_size=16, epochs=400, verbose=0, callbacks=[Slow()])
"""


def test_a_ray_node_lost_mid_run_is_named_and_nothing_stays_reserved(ip, across, capsys):
    """Last (it kills the second node): every process of the second host is killed while the
    ranks train; the run ends within seconds, not at a collective's timeout, naming the rank on
    that node and saying the node died; at the run's end kdist holds nothing on Ray (a run
    that did not finish gives its engines and placement group back), nor after %kdist stop."""
    line = f"--strategy multiworker --np 2 --launcher ray --address {across.address} --no-dashboard"
    killed = {}

    def kill_when_training():
        seen, deadline = "", time.monotonic() + 240
        while time.monotonic() < deadline and "kd-epoch 3" not in seen:
            seen += capsys.readouterr().out
            time.sleep(0.5)
        killed["at"] = time.monotonic()
        killed["pids"] = across.kill_node()

    # capsys is read by the killer only: the cell's own output is not checked here
    watcher = threading.Thread(target=kill_when_training, daemon=True)
    watcher.start()
    with pytest.raises(RankDied) as caught:
        ip.run_cell_magic("kdist", line, SLOW_FIT)
    ended = time.monotonic()
    watcher.join(5)
    words = str(caught.value)
    assert killed.get("pids"), "the second node was never killed"
    assert ended - killed["at"] < 60, f"the run went on {ended - killed['at']:.0f} s after the node died"
    assert f"({NODE_B}): the Ray node died" in words and words.startswith("rank "), words
    assert held(across.address) == {"placement groups": [], "actors": []}
    ip.run_line_magic("kdist", "stop")
    assert held(across.address) == {"placement groups": [], "actors": []}
