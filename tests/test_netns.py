"""Training across "hosts": ipyparallel engines in Linux network namespaces.

This machine plays a small cluster. A bridge in the root namespace
(``10.213.N.1/24``, a private range this test creates and deletes) connects two
network namespaces through veth pairs; each namespace is a "host" with its own
address and, through ``unshare --uts``, its own hostname. An ipyparallel
controller in the root namespace listens on the bridge address only; engines
run inside the namespaces (two on host A, one on host B) with the controller's
engine connection file, exactly as ipcluster's SSH launcher would start them
on other machines. The notebook side attaches with ``--cluster-id`` and trains

* with ``--strategy multiworker``: TF_CONFIG carries the namespaces' addresses
  (never loopback), ranks are grouped by host, weights end identical;
* with ``--strategy horovod`` on fresh engines: the rendezvous listens on the
  bridge (``KDist.bind_address``), local ranks follow hostnames, weights end
  identical.

Inside each namespace the veth end is named differently from the kernel side's
bridge, so every rank must find its own interface for Gloo (as on a cluster whose
hosts name their interfaces differently), and ``/etc/netns/NS/hosts`` makes every
hostname resolve to its "host" (Horovod needs resolvable hostnames).

Needs root, ``ip`` (iproute2) and ``unshare``; skipped, saying which is missing,
elsewhere. Namespaces, links and every process are removed in a finalizer,
also when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import kdist_magics
from kdist_magics.cluster.cluster import kill_pids
from kdist_magics.cluster.lifetime import process_tree
from conftest import ROOT

pytestmark = [pytest.mark.netns, pytest.mark.engines, pytest.mark.slow, pytest.mark.timeout(900)]

HOSTS = {"kd-host-a": 2, "kd-host-b": 1}  # "host" -> engines on it
#: the fixture controller's heartbeat: a beat each HEARTBEAT_MS, an engine unregistered after
#: HEARTBEAT_MISSES missed beats
HEARTBEAT_MS, HEARTBEAT_MISSES = 1000, 5


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=check)


def netns_unavailable() -> str | None:
    """Why namespaces cannot be built here (None when they can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CI runs as root)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    probe = f"kdist-probe-{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def tbf(rate: str) -> tuple[str, ...]:
    """``tc qdisc add ... root`` arguments that hold a link to ``rate`` (a token bucket of 64 KiB:
    a packet over it is dropped, so the link's MTU stays a network's)."""
    return ("tbf", "rate", rate, "burst", "64kb", "latency", "100ms")


def _free_subnet(first: int) -> int:
    """The first 10.213.N.0/24 from ``first`` on that no address here is in (another session's
    hosts may be up beside these: the long tier's two-host probe beside the netns tier)."""
    taken = _run("ip", "-4", "-o", "addr", check=False).stdout
    n = first
    while f" 10.213.{n}." in taken:
        n = 20 + (n - 19) % 200
    return n


class Hosts:
    """The bridge, the namespaces ("hosts"), the controller and the engines."""

    def __init__(self, counts: dict[str, int] | None = None):
        self.counts = dict(counts or HOSTS)  # "host" -> engines on it
        tag = f"{os.getpid() % 100000:05d}"
        self.subnet = _free_subnet(20 + os.getpid() % 200)
        self.bridge = f"kdb{tag}"
        self.inner = "kdeth0"  # the veth end inside every namespace: not the kernel side's name
        self.bridge_ip = f"10.213.{self.subnet}.1"
        self.namespaces: dict[str, str] = {}  # host -> namespace
        self.addresses: dict[str, str] = {}  # host -> its address
        self.veths: list[str] = []
        self.etc_dirs: list[Path] = []
        self.tag = tag
        self.cluster = None
        self.cluster_id = f"kdist-netns-{tag}"
        self.engines: list[subprocess.Popen] = []
        self.controller_pids: set[int] = set()
        self.log = None  # the engines' stderr, shown when a test fails

    @contextlib.contextmanager
    def watched(self, shell):
        """The engines' log printed when the block fails, and ``%kdist stop`` after it,
        whatever happens."""
        try:
            yield
        except BaseException:
            print("engine log:\n" + self.engine_log())
            raise
        finally:
            shell.run_line_magic("kdist", "stop")

    def engine_log(self) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-6000:]

    # -- network -----------------------------------------------------------------
    def build(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i, host in enumerate(self.counts, start=1):
            # the namespace carries the whole pid (the session check reads its maker from it);
            # link names are 15 characters at most, so they carry the short tag
            ns, veth, peer = f"kdist-{os.getpid()}-{i}", f"kdv{self.tag}{i}", f"kdp{self.tag}{i}"
            address = f"10.213.{self.subnet}.{10 + i}"
            _run("ip", "netns", "add", ns)
            self.namespaces[host] = ns
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            self.veths.append(veth)
            _run("ip", "link", "set", peer, "netns", ns)
            _run("ip", "-n", ns, "link", "set", peer, "name", self.inner)
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", self.inner)
            _run("ip", "-n", ns, "link", "set", self.inner, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
            self.addresses[host] = address
        # `ip netns exec` shows /etc/netns/NS/hosts as /etc/hosts: every "host" resolves
        # every hostname to its namespace address, as on a real cluster. (Horovod 0.28.1
        # needs that: its process-set Gloo device ignores HOROVOD_GLOO_IFACE and uses the
        # address the hostname resolves to.)
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{a} {h}" for h, a in self.addresses.items()]
        if not Path("/etc/netns").exists():
            self.etc_dirs.append(Path("/etc/netns"))  # made here, removed (last) if empty
        for ns in self.namespaces.values():
            folder = Path("/etc/netns") / ns
            folder.mkdir(parents=True, exist_ok=True)
            self.etc_dirs.append(folder)
            (folder / "hosts").write_text("\n".join(lines) + "\n")

    def limit(self, rate: str) -> None:
        """Every host's way out (its veth end, so both directions between two hosts) at ``rate``
        (``tc ... tbf``: ``netem`` is not available here), a slower network between hosts."""
        for ns in self.namespaces.values():
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", self.inner, "root", *tbf(rate))

    # -- ipyparallel -------------------------------------------------------------
    def start_controller(self) -> None:
        import ipyparallel as ipp

        # a quicker heartbeat than ipyparallel's default (10 missed beats of 3 s): a frozen
        # "remote" engine is unregistered after 5 s, not 30
        self.cluster = ipp.Cluster(
            n=0,
            cluster_id=self.cluster_id,
            controller_ip=self.bridge_ip,
            log_level=40,
            shutdown_atexit=False,
            controller_args=[
                f"--HeartMonitor.period={HEARTBEAT_MS}",
                f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
            ],
        )
        self.cluster.start_controller_sync()
        self.controller_pids = process_tree({self.cluster.controller.pid})

    @property
    def engine_file(self) -> str:
        return str(Path(self.cluster.profile_dir) / "security" / f"ipcontroller-{self.cluster_id}-engine.json")

    def launch_engines(self) -> None:
        """Start the hosts' engines inside their namespaces, each with its host's hostname."""
        import ipyparallel as ipp

        import tempfile

        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
        if self.log is None:
            self.log = tempfile.TemporaryFile("w+")
        for host, count in self.counts.items():
            for _ in range(count):
                script = f'hostname {host} && exec "$0" -m ipyparallel.engine --file="$1" --log-level=40'
                self.engines.append(
                    subprocess.Popen(
                        [
                            "ip",
                            "netns",
                            "exec",
                            self.namespaces[host],
                            "unshare",
                            "--uts",
                            "sh",
                            "-c",
                            script,
                            sys.executable,
                            self.engine_file,
                        ],
                        cwd=ROOT,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=self.log,
                    )
                )
        client = ipp.Client(cluster_id=self.cluster_id)
        try:
            client.wait_for_engines(sum(self.counts.values()), timeout=180, interactive=False)
        finally:
            client.close()

    def stop_engines(self) -> None:
        """End the engines we started (by pid) and wait until the controller lets them go."""
        import ipyparallel as ipp

        pids = process_tree({p.pid for p in self.engines if p.poll() is None})
        _kill(pids)
        for p in self.engines:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        self.engines = []
        client = ipp.Client(cluster_id=self.cluster_id)
        try:
            deadline = time.monotonic() + 90
            while client.ids and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            client.close()

    def destroy(self) -> None:
        """Everything, in reverse, ignoring what was never made."""
        try:
            if self.engines:
                _kill(process_tree({p.pid for p in self.engines if p.poll() is None}))
        finally:
            if self.cluster is not None:
                try:
                    self.cluster.stop_cluster_sync()
                except Exception:
                    pass
                _kill(self.controller_pids)
            for veth in self.veths:
                _run("ip", "link", "del", veth, check=False)
            for ns in self.namespaces.values():
                _run("ip", "netns", "del", ns, check=False)
            _run("ip", "link", "del", self.bridge, check=False)
            for folder in reversed(self.etc_dirs):
                if folder == Path("/etc/netns"):
                    try:
                        folder.rmdir()  # only when empty
                    except OSError:
                        pass
                else:
                    shutil.rmtree(folder, ignore_errors=True)


def _kill(pids: set[int]) -> None:
    kill_pids(pids, grace=5)


@pytest.fixture(scope="module")
def hosts():
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    h = Hosts()
    try:
        h.build()
        h.start_controller()
        yield h
    finally:
        h.destroy()
        if h.log is not None:
            h.log.close()
        leftover = _run("ip", "netns", "list", check=False).stdout
        assert f"kdist-{os.getpid()}-" not in leftover, f"namespaces left behind: {leftover}"


def engine_values(name: str) -> list:
    s = kdist_magics._extension._strategies
    strategy = s.get("multiworker") or s.get("horovod")
    values = strategy.cluster.view().pull(name, block=True)
    ranks = strategy.ranks(strategy.cluster, None)
    return [v for _, v in sorted(zip(ranks, values), key=lambda t: t[0])]


def check_host_grouping(facts: list[dict]) -> None:
    """Ranks on one host are consecutive, and local ranks count 0.. within each host."""
    by_host: dict[str, list[int]] = {}
    for rank, f in enumerate(facts):
        by_host.setdefault(f["host"], []).append(rank)
    assert sorted(by_host) == sorted(HOSTS)
    for host, ranks in by_host.items():
        assert len(ranks) == HOSTS[host]
        assert ranks == list(range(ranks[0], ranks[0] + len(ranks)))
        assert [facts[r]["local_rank"] for r in ranks] == list(range(len(ranks)))


MW_CELL = """
import os, socket, json, numpy as np, keras
rng = np.random.default_rng(0)
x = rng.normal(size=(96, 4)).astype("float32")
y = (x @ np.array([1., -2., .5, 3.], dtype="float32"))[:, None]
keras.utils.set_random_seed(10 + strategy.cluster_resolver.task_id)  # different starts
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="tanh"),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(x, y, batch_size=12, epochs=2, verbose=0)
kd_weights = [w.tolist() for w in model.get_weights()]
kd_facts = {"host": socket.gethostname(), "task": strategy.cluster_resolver.task_id,
            "tf_config": json.loads(os.environ["TF_CONFIG"]), "loss": history.history["loss"]}
"""


def test_multiworker_across_namespaced_hosts(shell, hosts):
    shell.run_line_magic("kdist", "stop")
    hosts.launch_engines()
    with hosts.watched(shell):
        shell.run_cell_magic(
            "kdist", f"--strategy multiworker --np 3 --no-dashboard --cluster-id {hosts.cluster_id}", MW_CELL
        )
        facts = engine_values("kd_facts")
        weights = engine_values("kd_weights")
    assert [f["task"] for f in facts] == [0, 1, 2]
    workers = facts[0]["tf_config"]["cluster"]["worker"]
    assert all(f["tf_config"]["cluster"]["worker"] == workers for f in facts)
    for rank, f in enumerate(facts):  # each worker listens on its own host's address
        assert workers[rank].rsplit(":", 1)[0] == hosts.addresses[f["host"]]
    local = {}
    for f in facts:
        f["local_rank"] = local.get(f["host"], 0)
        local[f["host"]] = f["local_rank"] + 1
    check_host_grouping(facts)
    for w in weights[1:]:
        for a, b in zip(weights[0], w):
            np.testing.assert_array_equal(np.array(a), np.array(b))
    assert all(f["loss"] == facts[0]["loss"] for f in facts)
    assert facts[0]["loss"][-1] < facts[0]["loss"][0]
    hosts.stop_engines()


PUSH_CELL = """
import os, re, socket, numpy as np
kd_root = big
while isinstance(kd_root, np.ndarray) and kd_root.base is not None:
    kd_root = kd_root.base
kd_root = kd_root.obj if isinstance(kd_root, memoryview) else kd_root
with open("/proc/self/maps") as f:
    kd_maps = sorted(set(re.findall(r"/dev/shm/(kdist-[0-9a-f-]+)", f.read())))  # "(deleted)" ones too
kd_push = {"host": socket.gethostname(), "pid": os.getpid(), "sum": float(big.sum()),
           "pair": float(pair[1].sum()), "root": type(kd_root).__name__, "maps": kd_maps, "id": id(big)}
"""


def test_a_push_travels_once_to_each_host_and_is_shared_there(shell, hosts):
    """Engines on other hosts get a large array in one transfer per host: that
    host's first engine makes the shared-memory segment there, the others map it; a host with
    one engine binds it as it came; no name is left in /dev/shm; unchanged, it is not sent again."""
    import glob

    shell.run_line_magic("kdist", "stop")
    hosts.launch_engines()
    rng = np.random.default_rng(0)
    shell.user_ns.update(
        big=rng.normal(size=(1024, 1024)).astype("float32"),  # 4 MiB
        pair=(np.arange(10), np.ones(300_000)),
    )
    line = f"--strategy multiworker --np 3 --no-dashboard --cluster-id {hosts.cluster_id} --push big,pair"
    with hosts.watched(shell):
        shell.run_cell_magic("kdist", line, PUSH_CELL)
        first = engine_values("kd_push")
        left = glob.glob("/dev/shm/kdist-*")
        shell.run_cell_magic("kdist", line, PUSH_CELL)
        again = engine_values("kd_push")
    want = float(shell.user_ns["big"].sum())
    assert all(p["sum"] == pytest.approx(want) and p["pair"] == 300_000.0 for p in first), first
    on_a = [p for p in first if p["host"] == "kd-host-a"]
    on_b = [p for p in first if p["host"] == "kd-host-b"]
    assert len(on_a) == 2 and len(on_b) == 1
    # host A: one segment, made by one of its engines, mapped by both (read from /proc/self/maps)
    assert on_a[0]["maps"] == on_a[1]["maps"] and len(on_a[0]["maps"]) == 2, on_a  # big, pair[1]
    makers = {int(name.split("-")[1]) for name in on_a[0]["maps"]}
    assert makers <= {p["pid"] for p in on_a} and all(p["root"] == "mmap" for p in on_a)
    assert on_b[0]["maps"] == []  # alone on its host: bound as it came
    ours = {os.getpid(), *(p["pid"] for p in first)}  # (other sessions may push meanwhile)
    assert [n for n in left if int(n.rsplit("/", 1)[1].split("-")[1]) in ours] == []  # all removed
    assert [p["id"] for p in again] == [p["id"] for p in first]  # unchanged: not sent again
    hosts.stop_engines()


HVD_CELL = """
import socket, numpy as np, keras
rng = np.random.default_rng(hvd.rank())                       # each rank its own data
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ np.array([1., -2., .5, 3.], dtype="float32"))[:, None]
keras.utils.set_random_seed(10 + hvd.rank())                  # and its own start
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="tanh"),
                          keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
history = model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
kd_weights = [w.tolist() for w in model.get_weights()]
kd_facts = {"host": socket.gethostname(), "rank": hvd.rank(), "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank()}
"""


def test_horovod_across_namespaced_hosts(shell, hosts):
    pytest.importorskip(
        "horovod.tensorflow",
        reason="Horovod is not installed here (make test builds it into .venv; the Colab-pinned .venv-colab has none, as Colab has none)",
    )
    shell.run_line_magic("kdist", "stop")
    hosts.launch_engines()  # fresh processes
    ext = kdist_magics._extension
    saved = ext.bind_address
    ext.bind_address = hosts.bridge_ip  # the rendezvous must be reachable from the namespaces
    try:
        with hosts.watched(shell):
            shell.run_cell_magic(
                "kdist", f"--strategy horovod --np 3 --no-dashboard --cluster-id {hosts.cluster_id}", HVD_CELL
            )
            facts = engine_values("kd_facts")
            weights = engine_values("kd_weights")
    finally:
        ext.bind_address = saved
    assert [f["rank"] for f in facts] == [0, 1, 2]
    check_host_grouping(facts)
    for f in facts:
        assert f["local_size"] == HOSTS[f["host"]]
    hosts_in_order = list(dict.fromkeys(f["host"] for f in facts))
    assert [f["cross_rank"] for f in facts if f["local_rank"] == 0] == list(range(len(hosts_in_order)))
    for w in weights[1:]:
        for a, b in zip(weights[0], w):
            np.testing.assert_array_equal(np.array(a), np.array(b))
    hosts.stop_engines()


def test_a_remote_engine_that_freezes_is_named_once_the_heartbeat_gives_up(shell, hosts):
    """An engine on another "host" stopped (SIGSTOP) mid-cell: kdist cannot see that process,
    so ipyparallel's heartbeat is what notices (here 5 missed beats of 1 s; 10 of 3 s by
    default); the run then ends naming the rank, instead of waiting on it for ever (no
    --timeout here)."""
    import re
    import signal

    import psutil

    from kdist_magics.errors import RankDied

    shell.run_line_magic("kdist", "stop")
    hosts.launch_engines()
    cell = (
        "import os, signal, threading, time\nif strategy.cluster_resolver.task_id == 2:\n"
        "    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGSTOP)).start()\ntime.sleep(300)"
    )
    t0 = time.monotonic()
    try:
        with hosts.watched(shell):
            with pytest.raises(RankDied) as info:
                shell.run_cell_magic(
                    "kdist", f"--strategy multiworker --np 3 --no-dashboard --cluster-id {hosts.cluster_id}", cell
                )
            waited = time.monotonic() - t0
    finally:
        frozen = [
            p.pid for p in hosts.engines if p.poll() is None and psutil.Process(p.pid).status() == psutil.STATUS_STOPPED
        ]
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert len(frozen) == 1  # rank 2 stopped itself, and only it (kdist ends no engine of theirs)
    text = str(info.value)
    assert re.match(
        r"rank 2 on kd-host-[ab] left the cluster \(its controller unregistered it: it ended, "
        r"or stopped answering ipyparallel's heartbeat\)\. The run was stopped; restart the "
        r"cluster's engines",
        text,
    ), text
    assert waited < 120, waited  # the heartbeat's ~5 s, plus starting the workers (never the 300 s of sleep)
    hosts.stop_engines()
