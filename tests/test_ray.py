"""``--launcher ray``: ranks placed by Ray (kdist_magics/cluster/ray_engines.py, ray_actors.py).

Fast tier: the options, and the one line each for a Ray that is missing, a cluster that is not
there, and ``--cluster-id``. Ray tier (marker ``ray``): a real Ray head started for the module
(``ray start --head --block``, 2 CPUs, no dashboard), stopped at the end; kdist's engines placed
there by ipyparallel's entry point and by ``%%kdist``: multiworker and horovod train with
identical weights on every rank (multiworker on TensorFlow, Keras on JAX and on PyTorch), the
placement group and the engines are gone after ``%kdist stop``, a group Ray cannot place is one
line with nothing left reserved, and a rank whose engine dies mid-run is named. Before the head
stops, no placement group or actor of kdist's is left on it (any kernel's), and its session
folder goes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from IPython.core.error import UsageError

import kdist_magics
import kernel_driver
from kdist_magics.cluster.network import free_port
from kdist_magics.errors import ClusterError
from kdist_magics.messages import ray_given_back
from kdist_magics.spec import parse_line
from test_multiworker import TRAIN as MW_TRAIN


# -- fast tier ----------------------------------------------------------------------------


def test_ray_options_are_parsed_and_refused_where_they_mean_nothing():
    spec = parse_line("--strategy multiworker --launcher ray --address 10.0.0.5:6379 --placement pack")
    assert spec.ray.address == "10.0.0.5:6379" and spec.ray.placement == "pack"
    assert parse_line("--strategy horovod --launcher ray").ray.where() in (os.environ.get("RAY_ADDRESS") or "auto",)
    with pytest.raises(UsageError, match="--address applies to --launcher ray"):
        parse_line("--strategy multiworker --address 10.0.0.5:6379")
    with pytest.raises(UsageError, match="--launcher ray starts a cluster kdist owns; --cluster-id"):
        parse_line("--strategy multiworker --launcher ray --cluster-id abc")
    with pytest.raises(UsageError, match="starts engines .* not mirrored"):
        parse_line("--strategy mirrored --launcher ray")
    assert parse_line("--strategy sharded --np 2 --launcher ray").launcher == "ray"


def test_no_ray_installed_is_one_line_naming_the_extra(monkeypatch):
    from kdist_magics.cluster import ray_actors

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ClusterError, match=r"pip install 'kdist_magics\[ray\]'"):
        ray_actors.require()


def test_no_cluster_at_the_address_is_one_line_before_anything_starts():
    pytest.importorskip("ray", reason="Ray is in the ray extra (make test installs it)")
    from kdist_magics.cluster import ray_actors

    port = free_port("127.0.0.1")  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=f"no Ray cluster at 127.0.0.1:{port} .*ray start --head"):
        ray_actors.connect(ray_actors.RayOptions(f"127.0.0.1:{port}"))
    assert time.monotonic() - t0 < 10


def test_joining_off_the_main_thread_shows_no_warning_about_sigterm(monkeypatch, capsys):
    """ipyparallel starts launchers off the main thread, where Ray's init warns that it set no
    SIGTERM handler (which the kernel wants none of): the user never sees that line."""
    import logging
    import types

    from kdist_magics.cluster import ray_actors

    said = []

    def init(**kwargs):  # as Ray 2.60's does off the main thread
        logging.getLogger("ray._private.worker").warning(
            "SIGTERM handler is not set because current thread is not the main thread."
        )
        logging.getLogger("ray._private.worker").warning("another warning")

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(ray_actors, "_answers", lambda address: None)
    keep = Keep()
    logging.getLogger("ray._private.worker").addHandler(keep)
    try:
        assert ray_actors.connect(ray_actors.RayOptions("127.0.0.1:1")) is True
    finally:
        logging.getLogger("ray._private.worker").removeHandler(keep)
    assert said == ["another warning"]


def test_ipyparallel_finds_kdists_ray_launcher_by_its_entry_point():
    from ipyparallel.cluster.launcher import abbreviate_launcher_class, find_launcher_class

    from kdist_magics.cluster.ray_engines import RayEngines

    assert find_launcher_class("ray", "engine") is RayEngines
    assert abbreviate_launcher_class(RayEngines) == "ray"


# -- Ray tier: a real Ray head ------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A Ray head of 2 CPUs for the module (its own temp folder and port), stopped at the end
    with everything it started."""
    pytest.importorskip("ray", reason="Ray is in the ray extra (make test installs it)")
    import psutil

    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    port = free_port("127.0.0.1")
    temp = tmp_path_factory.mktemp("ray")
    head = subprocess.Popen(
        [
            ray_bin,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--object-store-memory=100000000",
            f"--temp-dir={temp}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )  # Ray 2.60's token auth, off on loopback
    address = f"127.0.0.1:{port}"
    try:
        wait_for(lambda: listens("127.0.0.1", port), 120, "the Ray head did not listen")
    except BaseException:
        head.kill()
        raise
    yield address
    try:  # the Ray tier's session check: nothing kdist asked Ray for is left (any driver's)
        left = held(address)
    finally:
        _stop_head(head, psutil)
        shutil.rmtree(temp, ignore_errors=True)  # Ray's session folder: logs, sockets, spill
    assert left == {"placement groups": [], "actors": []}, f"left on the Ray cluster: {left}"


def listens(host: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_for(ready, seconds: float, what: str) -> None:
    """Until ``ready()`` is true (an AssertionError counts as not yet), or fail saying ``what``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except AssertionError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{what} within {seconds:.0f} s")


def _stop_head(head, psutil) -> None:
    tree = [head.pid] + [p.pid for p in psutil.Process(head.pid).children(recursive=True)]
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(30)
    except subprocess.TimeoutExpired:
        pass
    for pid in tree:
        try:
            os.killpg(pid, signal.SIGKILL) if pid == head.pid else os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def ask_ray(address: str, code: str):
    """Run ``code`` as a driver of the Ray cluster at ``address``, in a process of its own (never
    this kernel's connection); what the last line it printed as JSON holds."""
    import json

    done = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import json, logging, ray\n"
                f"ray.init(address={address!r}, logging_level=logging.ERROR, log_to_driver=False)\n" + code
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for line in reversed(done.stdout.splitlines()):  # Ray prints its warnings there too
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise AssertionError(f"no JSON printed: {done.stdout[-2000:]}")


def held(address: str) -> dict[str, list[str]]:
    """What kdist holds on the Ray cluster, any kernel's (:func:`ray_actors.held`)."""
    return ask_ray(
        address, "from kdist_magics.cluster.ray_actors import held\nprint(json.dumps(held(all_drivers=True)))"
    )


def groups(address: str) -> dict[str, str]:
    """Every placement group Ray knows of, and its state."""
    return ask_ray(
        address,
        "from ray.util.placement_group import placement_group_table\n"
        "print(json.dumps({k: v['state'] for k, v in placement_group_table().items()}))",
    )


#: test_multiworker's regression (different initial weights per worker), and where it ran
TRAIN = MW_TRAIN + "kd_node = __import__('socket').gethostname()\n"

HOROVOD = """
import socket, numpy as np, keras
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(64, 4)).astype("float32"); y = x.sum(axis=1, keepdims=True)
keras.utils.set_random_seed(hvd.rank())
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
model.fit(x, y, batch_size=16, epochs=2, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
kd_weights = [w.tolist() for w in model.get_weights()]
kd_node = socket.gethostname()
"""


@pytest.mark.ray
@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_multiworker_on_ray_trains_one_model_and_leaves_nothing_reserved(ip, ray_head, capsys):
    """Two ranks placed by Ray (one bundle of a CPU each, spread), trained as one model:
    identical weights; the dashboard's rows name each rank's host; %kdist status names the
    Ray cluster; after %kdist stop the placement group is removed and the engines are gone."""
    import psutil

    ip.run_cell_magic("kdist", f"--strategy multiworker --np 2 --launcher ray --address {ray_head}", TRAIN)
    out = capsys.readouterr()
    assert (
        f"placing 2 engines on the Ray cluster at {ray_head} (1 node, 2 CPUs): one bundle each "
        "{CPU: 1}, spread" in out.out + out.err
    ), out
    strategy = kdist_magics._extension._strategies["multiworker"]
    weights = kernel_driver.engine_values(strategy, "kd_weights")
    for wa, wb in zip(*weights):
        np.testing.assert_array_equal(np.array(wa), np.array(wb))
    rec = kdist_magics.last_run()
    assert rec.status == "done" and {r.state for r in rec.ranks.values()} == {"done"}
    launcher = strategy.cluster._launcher()
    placed = launcher.placed
    # the dashboard's rank rows name each rank's Ray node beside its host
    assert sorted(r.node for r in rec.ranks.values()) == sorted(f"Ray node {p['node'][:12]}" for p in placed)
    assert len(placed) == 2 and {p["pid"] for p in placed} == {e.pid for e in strategy.cluster.engines}
    ip.run_line_magic("kdist", "status")
    assert f"ray={ray_head}, spread, node {placed[0]['node'][:12]}" in capsys.readouterr().out
    pids = [p["pid"] for p in placed]
    assert list(groups(ray_head).values()).count("CREATED") == 1
    from kdist_magics.cluster.ray_actors import held as held_here

    holding = held_here()  # this kernel's, by name: one group, an actor per rank named after it
    assert len(holding["placement groups"]) == 1 and len(holding["actors"]) == 2, holding
    assert all(a.startswith(holding["placement groups"][0] + "-") for a in holding["actors"]), holding
    ip.run_line_magic("kdist", "stop")
    assert "CREATED" not in groups(ray_head).values()
    assert held(ray_head) == {"placement groups": [], "actors": []}
    assert not sys.modules["ray"].is_initialized()  # no Ray of its own was started on the way
    time.sleep(1)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.ray
@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_placement_ray_cannot_satisfy_is_one_line_and_nothing_stays_reserved(ip, ray_head, monkeypatch):
    """Four ranks of a CPU each on a head of two CPUs: within the timeout, one line saying what was
    asked and what the cluster has; no placement group left, no engine started."""
    from kdist_magics.cluster.ray_engines import RayEngines

    monkeypatch.setattr(RayEngines, "ready_timeout", 8.0)
    with pytest.raises(ClusterError) as caught:
        ip.run_cell_magic(
            "kdist", f"--strategy multiworker --np 4 --launcher ray --address {ray_head}", "print('never')"
        )
    words = str(caught.value)
    assert (
        "Ray could not place 4 bundles of {CPU: 1} (spread) within 8 s: the cluster has 1 node, "
        "CPU 2 free of 2" in words
    ), words
    assert "CREATED" not in groups(ray_head).values()
    ip.run_line_magic("kdist", "stop")


#: a Horovod fit that runs until stopped, and how many epochs rank 0 has reported so far
ENDLESS = """
import keras, numpy as np
x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
model.fit(x, x.sum(1), batch_size=8, epochs=10000, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""


def _epochs(rec) -> int:
    return sum(1 for m in list(rec.metrics) if m.get("kind") == "epoch" and m.get("rank") == 0)


def _stop_gives_the_engines_and_the_placement_back(ip, line: str, address: str, strategy, capsys) -> None:
    """The notebook's Stop (SIGINT to the kernel) mid-fit on Ray-placed ranks: every rank stops,
    the run says interrupted and keeps its history; then kdist ends the engines and removes the
    placement group (a team's cluster is not held by a run that did not finish), says so in
    one line, and the next cell places new engines."""
    pids = sorted(e.pid for e in strategy.cluster.engines)
    done = threading.Event()

    def stop_after_two_epochs():
        while not done.is_set():
            rec = kdist_magics.last_run()
            if rec is not None and rec.status == "running" and _epochs(rec) >= 2:
                os.kill(os.getpid(), signal.SIGINT)  # what the notebook's Stop button does
                return
            time.sleep(0.1)

    ext = kdist_magics._extension
    grace, ext.stop_grace = ext.stop_grace, 30.0  # a loaded test machine may be slow to stop
    stopper = threading.Thread(target=stop_after_two_epochs, daemon=True)
    stopper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ip.run_cell_magic("kdist", line, ENDLESS)
    finally:
        ext.stop_grace = grace
        done.set()
        stopper.join()
    rec = kdist_magics.last_run()
    assert rec.status == "interrupted" and {r.state for r in rec.ranks.values()} == {"stopped"}
    assert _epochs(rec) >= 2  # the history so far is kept
    assert strategy.cluster is None and "CREATED" not in groups(address).values()  # given back
    assert kernel_driver.alive(pids) == []  # the engines ended (on this machine's Ray node)
    assert ray_given_back("interrupted") in capsys.readouterr().out
    ip.run_cell_magic("kdist", line, "kd_ok = hvd.size()")
    assert not set(e.pid for e in strategy.cluster.engines) & set(pids)  # new engines
    assert kernel_driver.engine_values(strategy, "kd_ok") == [2, 2]


@pytest.mark.ray
@pytest.mark.engines
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_horovod_on_ray_stopped_and_a_rank_lost_mid_run(ip, ray_head, capsys):
    """Horovod over two Ray-placed engines: the same weights on both ranks. Stop mid-fit stops
    every rank, ends the engines and removes the placement group. Then rank 1's engine is
    killed mid-run: the run fails with one line naming the rank, nothing stays reserved, and the
    next cell runs on new engines."""
    from kdist_magics.errors import RankDied

    line = f"--strategy horovod --np 2 --launcher ray --address {ray_head} --no-dashboard"
    ip.run_cell_magic("kdist", line, HOROVOD)
    strategy = kdist_magics._extension._strategies["horovod"]
    w0, w1 = kernel_driver.engine_values(strategy, "kd_weights")
    for a, b in zip(w0, w1):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    _stop_gives_the_engines_and_the_placement_back(ip, line, ray_head, strategy, capsys)
    victim = strategy.cluster.engines[1]
    with pytest.raises(RankDied) as caught:
        ip.run_cell_magic(
            "kdist",
            line,
            f"""
import os, signal, time
if hvd.rank() == 1:
    os.kill({victim.pid}, signal.SIGKILL)
time.sleep(60)
""",
        )
    assert str(caught.value).startswith("rank 1 "), str(caught.value)  # which watcher names it first varies
    assert strategy.cluster is None and "CREATED" not in groups(ray_head).values()
    assert ray_given_back("failed") in capsys.readouterr().out
    ip.run_cell_magic("kdist", line, "kd_ok = hvd.size()")
    assert kernel_driver.engine_values(kdist_magics._extension._strategies["horovod"], "kd_ok") == [2, 2]
    ip.run_line_magic("kdist", "stop")
    assert "CREATED" not in groups(ray_head).values()
    assert not sys.modules["ray"].is_initialized()  # no Ray of its own was started on the way


@pytest.mark.ray
@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ipyparallels_own_cluster_starts_engines_on_ray_by_name(ray_head):
    """Without kdist's magic: ``ipp.Cluster(engines="ray")`` (what ``ipcluster start --engines
    ray`` does) finds the launcher by its entry point and places the engines on Ray; stopping the
    cluster removes the placement group."""
    import ipyparallel as ipp
    from traitlets.config import Config

    config = Config()
    config.RayEngines.address = ray_head
    cluster = ipp.Cluster(n=2, engines="ray", config=config, log_level=40)
    try:
        cluster.start_cluster_sync()
        client = cluster.connect_client_sync()
        client.wait_for_engines(2, timeout=120)
        pids = client[:].apply_sync(os.getpid)
        launcher = next(iter(cluster.engines.values()))
        assert sorted(pids) == sorted(p["pid"] for p in launcher.placed)
        assert list(groups(ray_head).values()).count("CREATED") == 1
        client.close()
    finally:
        cluster.stop_cluster_sync()
    assert "CREATED" not in groups(ray_head).values()


#: after the cell (conftest.PROCESS_FIT, the suite's cell for multiworker across processes)
KERAS_ON = """
out["err"] = repr(err) if err is not None else None
if err is None:
    out["weights"], out["loss"], out["backend"] = by_rank("kd_weights"), by_rank("kd_loss"), by_rank("kd_backend")
    out["placed"] = [p["node"] for p in kdist_magics._extension._strategies["multiworker"].cluster._launcher().placed]
ip.run_line_magic("kdist", "stop")
"""


@pytest.mark.ray
@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", [pytest.param("torch", marks=pytest.mark.torch)])
def test_keras_on_jax_and_torch_over_ray_trains_one_model(ray_head, backend):
    """multiworker under KERAS_BACKEND=torch on two Ray-placed engines (a kernel of its own: the
    backend is fixed at Keras' import): both processes end with the same weights, each placed by
    Ray; %kdist stop leaves nothing reserved. (Keras on JAX over Ray runs across two Ray hosts,
    tests/test_ray_hosts.py, with the same checks and the same losses on both.)"""
    pytest.importorskip(backend, reason=f"{backend} is installed by make test (.venv)")
    from conftest import PROCESS_FIT

    line = f"--strategy multiworker --np 2 --launcher ray --address {ray_head} --no-dashboard"
    cell = PROCESS_FIT + "kd_backend = keras.backend.backend()\n"
    r = kernel_driver.run_in_fresh_shell(
        f"value, err = attempt({line!r}, {cell!r})\n" + KERAS_ON, env={"KERAS_BACKEND": backend}
    )
    assert r["err"] is None, r["err"] + r["_stdout"][-3000:] + r["_stderr"][-2000:]
    assert r["backend"] == [backend, backend]
    w0, w1 = r["weights"]
    for a, b in zip(w0, w1):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    # JAX logs the loss over every process's batch; torch each rank's own (its own samples)
    assert all(loss[-1] < loss[0] for loss in r["loss"]), r["loss"]
    if backend == "jax":
        assert r["loss"][0] == r["loss"][1], r["loss"]
    assert len(r["placed"]) == 2 and all(r["placed"])
    assert held(ray_head) == {"placement groups": [], "actors": []}


@pytest.mark.ray
@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sharded_over_ray_trains_as_one_device(ray_head):
    """``--strategy sharded --mesh 1,2 --launcher ray``: the model axis across two Ray-placed
    engine processes (a kernel of its own on Keras' JAX backend) trains as one device does on the
    same batches, each process holding half of the sharded kernel; nothing left reserved."""
    pytest.importorskip("jax", reason="JAX is in the jax extra (make test installs it)")
    from test_sharded import TRAIN as SHARDED

    cell = SHARDED + "\nkd_local = {v.path: list(v.value.addressable_data(0).shape) for v in model.weights}\n"
    line = (
        f"--strategy sharded --mesh 1,2 --launcher ray --address {ray_head} --placement pack "
        "--pull kd_loss,kd_local --no-dashboard --no-telemetry"
    )
    r = kernel_driver.run_in_fresh_shell(
        f"""
        value, err = attempt("-s default --no-dashboard --no-telemetry", {SHARDED!r})
        assert err is None, repr(err)
        out["one"] = ip.user_ns["kd_loss"]
        value, err = attempt({line!r}, {cell!r})
        out["err"] = repr(err) if err is not None else None
        if err is None:
            out["loss"], out["local"] = ip.user_ns["kd_loss"], ip.user_ns["kd_local"]
            out["placed"] = [p["node"] for p in kdist_magics._extension._strategies["sharded"].engines.cluster._launcher().placed]
        ip.run_line_magic("kdist", "stop")
        """,
        env={"KERAS_BACKEND": "jax"},
    )
    assert r["err"] is None, r["err"] + r["_stdout"][-3000:] + r["_stderr"][-2000:]
    assert "one bundle each {CPU: 1}, pack" in r["_stdout"], r["_stdout"][-2000:]
    assert r["local"]["d1/kernel"] == [256, 128]  # this process's half; the other holds the rest
    np.testing.assert_allclose(r["loss"], r["one"], rtol=1e-5, atol=1e-6)
    assert len(r["placed"]) == 2 and all(r["placed"])
    assert held(ray_head) == {"placement groups": [], "actors": []}


@pytest.mark.ray
@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_kernel_leaves_no_engine_and_nothing_reserved_on_ray(ray_head, tmp_path):
    """A real kernel places two engines on Ray, then dies by SIGKILL: its controller, the engines
    in Ray's actors and its placement group all go (Ray ends a dead driver's actors and groups;
    each engine dies with its actor)."""
    from kernel_driver import Kernel, wait_gone

    kernel = Kernel(cwd=tmp_path)
    try:
        kernel.check(
            f"%%kdist --strategy multiworker --np 2 --launcher ray --address {ray_head} "
            "--no-dashboard\nkd_ok = strategy.num_replicas_in_sync\n",
            timeout=300,
        )
        engines = kernel.eval(
            "[p['pid'] for p in __import__('kdist_magics')._extension"
            "._strategies['multiworker'].cluster._launcher().placed]"
        )
        ours = held(ray_head)
        assert len(engines) == 2 and len(ours["placement groups"]) == 1 and len(ours["actors"]) == 2, ours
        tree = set(kernel.tree()) | set(engines)
        kernel.kill()
        left, _ = wait_gone(tree, 120)
        assert not left, f"still running after the kernel was SIGKILLed: {left}"
        deadline = time.monotonic() + 60
        while (ours := held(ray_head)) != {"placement groups": [], "actors": []} and time.monotonic() < deadline:
            time.sleep(2)
        assert ours == {"placement groups": [], "actors": []}, ours
    finally:
        kernel.cleanup()
