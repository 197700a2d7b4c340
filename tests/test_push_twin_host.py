"""A host that answers the kernel's own name but is another machine for ``--push``.

Two engines run with this machine's host name in a mount namespace of their own, with a
``/dev/shm`` of their own (as two containers, or two VMs cloned from one image, answer one
name). The kernel must not hand them a segment in its own ``/dev/shm`` (they cannot open it):
``--push`` sends the value once, to their first engine, which shares it there. Changed data
pushed again replaces what they map: each engine maps one segment per array however many
pushes came, none after ``%kdist stop``, and no name is left in their ``/dev/shm``.

Needs root and ``unshare`` (util-linux); skipped, saying which is missing, elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from kernel_driver import run_in_fresh_shell
from kdist_magics.cluster.cluster import kill_pids
from kdist_magics.cluster.lifetime import process_tree

pytestmark = [pytest.mark.netns, pytest.mark.engines, pytest.mark.timeout(600)]


def _unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "mount namespaces are Linux-only"
    if os.geteuid() != 0:
        return "a /dev/shm of the engines' own needs root (CI runs as root)"
    if shutil.which("unshare") is None:
        return "`unshare` is not installed (util-linux)"
    return None


@pytest.fixture
def twin_host():
    """A controller on loopback and 2 engines with this host name and their own /dev/shm:
    (cluster id, engine pids)."""
    why = _unavailable()
    if why:
        pytest.skip(why)
    import ipyparallel as ipp

    cluster_id = f"kdist-twin-{os.getpid()}-{int(time.time())}"
    cluster = ipp.Cluster(n=0, cluster_id=cluster_id, controller_ip="127.0.0.1", log_level=40, shutdown_atexit=False)
    cluster.start_controller_sync()
    controller = process_tree({cluster.controller.pid})
    engine_file = os.path.join(cluster.profile_dir, "security", f"ipcontroller-{cluster_id}-engine.json")
    engine = '"$0" -m ipyparallel.engine --file="$1" --log-level=40'
    script = f"mount -t tmpfs -o size=256m kdist-twin /dev/shm && {{ {engine} & {engine} & wait; }}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    # one mount namespace, one /dev/shm for both engines: one "machine"
    host = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable, engine_file],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = ipp.Client(cluster_id=cluster_id)
        try:
            client.wait_for_engines(2, timeout=120, interactive=False)
            pids = client[:].apply_sync(os.getpid)
        finally:
            client.close()
        yield cluster_id, pids
    finally:
        tree = process_tree({host.pid} if host.poll() is None else set())
        kill_pids(tree, grace=5)
        try:
            cluster.stop_cluster_sync()
        except Exception:
            pass
        kill_pids(controller, grace=5)


CELL = (
    "import os, re, socket, hashlib, numpy as np\n"
    "with open('/proc/self/maps') as f:\n"
    "    kd_maps = sorted(set(re.findall(r'/dev/shm/(kdist-[0-9a-f-]+)', f.read())))\n"
    "kd_seen = {'sha': hashlib.sha256(big.tobytes()).hexdigest(), 'host': socket.gethostname(),\n"
    "           'maps': kd_maps, 'shm': os.stat('/dev/shm').st_dev}\n"
)


def test_a_host_sharing_the_kernels_name_gets_its_own_shared_copy(twin_host):
    cluster_id, pids = twin_host
    line = f"--strategy multiworker --np 2 --no-dashboard --cluster-id {cluster_id} --push big"
    out = run_in_fresh_shell(
        f"""
import glob, hashlib, os, socket
import numpy as np
rng = np.random.default_rng(0)
big = rng.random((1024, 512))                                      # 4 MiB
ip.user_ns["big"] = big
out["host"], out["shm"] = socket.gethostname(), os.stat("/dev/shm").st_dev
out["runs"] = []
for i in range(4):
    _, err = attempt({line!r}, {CELL!r})
    assert err is None, repr(err)
    out["runs"].append({{"want": hashlib.sha256(big.tobytes()).hexdigest(), "seen": by_rank("kd_seen"),
                        "pushed": dict(kdist_magics.last_run().pushed)}})
    big.sort(axis=1) if i == 0 else big.__setitem__((i, 0), -1.0)  # changed in place
out["mine"] = glob.glob(f"/dev/shm/kdist-{{os.getpid()}}-*")
ip.run_line_magic("kdist", "stop")
""",
        {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
        unset=("XLA_FLAGS",),
    )
    for run in out["runs"]:
        for seen in run["seen"]:
            assert seen["host"] == out["host"] and seen["shm"] != out["shm"]  # one name, two machines
            assert seen["sha"] == run["want"]  # every rank holds the notebook's bytes
            assert len(seen["maps"]) == 1  # the current copy only: nothing replaced is kept
        assert run["seen"][0]["maps"] == run["seen"][1]["maps"]  # one copy, shared there
        maker = int(run["seen"][0]["maps"][0].split("-")[1])
        assert maker in pids  # made there by its first engine, not by the kernel
    assert [r["pushed"]["big"] for r in out["runs"]] == ["shared"] * 4
    assert out["mine"] == []
    for pid in pids:  # no name left in their own /dev/shm
        assert [n for n in os.listdir(f"/proc/{pid}/root/dev/shm") if n.startswith("kdist-")] == []
