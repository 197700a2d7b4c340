"""``--launcher slurm`` against a real Slurm (tests/slurm_cluster.py: munge, slurmctld and two
slurmd nodes, ``kd-host-a`` and ``kd-host-b``, in network namespaces on a bridge).

One job of four engines (two per node, through ``--sbatch``) trains multiworker across both
nodes, ranks grouped by node, and then has its step cancelled from inside the cell (a named
death); the next cell starts a new job. Horovod and Keras on JAX train on a job of one engine
per node. The refused and the pending job are cheap (no engine starts); Stop (an interrupt) and
the kernel's death are a real kernel's, while its job waits in the queue. After every test ``squeue`` lists nothing
of it. Needs root and Debian's slurm-wlm and munge; skipped, saying
which is missing, elsewhere.
"""

from __future__ import annotations

import io
import subprocess
import time
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

import kdist_magics
from kdist_magics.errors import ClusterError, KDistError, RankDied
from slurm_cluster import HELD, MARK, NODES, Slurm, unavailable
from test_netns import HVD_CELL, MW_CELL, engine_values

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.engines, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def slurm(shell):
    why = unavailable()
    if why:
        pytest.skip(why)
    cluster = Slurm()
    ext = kdist_magics._extension
    saved = ext.bind_address
    try:
        cluster.start()
        ext.bind_address = cluster.hosts.bridge_ip  # the controller and rendezvous the nodes reach
        yield cluster
    finally:
        ext.bind_address = saved
        shell.run_line_magic("kdist", "stop")
        pids = [p.pid for p in cluster.procs.values()]
        cluster.stop()
        import psutil

        assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE], (
            "Slurm processes left"
        )
        assert cluster.hosts.tag not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert MARK not in Path("/etc/hosts").read_text()


#: one engine on each node, and two on each (Slurm would otherwise fill one node first)
SPREAD = '--np 2 --sbatch "--ntasks-per-node=1"'
PAIRS = '--np 4 --sbatch "--ntasks-per-node=2"'


def run(shell, line: str, cell: str):
    return shell.run_cell_magic("kdist", f"--launcher slurm --no-dashboard {line}", cell)


def status(shell) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        shell.run_line_magic("kdist", "status")
    return out.getvalue()


def test_both_nodes_are_up(slurm):
    assert slurm.idle() == set(NODES)


def test_a_job_slurm_refuses_is_one_line_with_slurms_reason(shell, slurm):
    with pytest.raises(ClusterError) as info:
        run(shell, "--strategy multiworker --np 2 --partition nope", "x = 1")
    assert str(info.value) == "Slurm refused the engines' job: invalid partition specified: nope"
    with pytest.raises(ClusterError) as info:  # over the partition's limit (60 minutes)
        run(shell, "--strategy multiworker --np 2 --time 2:00:00", "x = 1")
    assert str(info.value) == (
        "Slurm refused the engines' job: Requested time limit is invalid (missing or exceeds some limit)"
    )
    assert slurm.queue() == []


def test_a_pending_job_is_a_phase_with_slurms_reason_and_timeout_ends_the_wait(shell, slurm):
    with pytest.raises(ClusterError) as info:
        run(shell, f"--strategy multiworker --np 2 --partition {HELD} --timeout 3", "x = 1")
    assert "was still PENDING: PartitionDown after --timeout 3 s; kdist cancelled it" in str(info.value)
    phases = kdist_magics._extension.last_record.phases
    queue = [p for p in phases if p["name"] == "waiting in Slurm's queue for 2 engines"]
    assert queue and "PENDING: PartitionDown, waited" in queue[0]["detail"], phases
    assert slurm.queue() == []


def kdist_processes_of_this_kernel() -> list[int]:
    """Processes kdist started for this test process that are alive (the follow wrapper's own,
    its children and guards, by their command line), here where the controller runs."""
    import os

    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if (
            "kdist_magics.cluster.follow" in cmd
            and f" {os.getpid()} " in f" {cmd} "
            and proc.info["status"] != psutil.STATUS_ZOMBIE
        ):
            found.append(proc.info["pid"])
    return found


#: a Slurm start, cancelled at each of its phases (a fault-matrix case): how it is ended
CANCELLED_AT = {
    "refused by sbatch": "the job is refused",
    "pending, --timeout": "--timeout ends the wait",
    "pending, %kdist stop": "%kdist stop from another cell",
    "pending, %kdist restart": "%kdist restart from another cell",
    "running, its engines starting": "%kdist stop from another cell",
    "its engines registered": "%kdist stop from another cell",
}


@pytest.mark.parametrize("phase", list(CANCELLED_AT))
def test_a_slurm_start_cancelled_at_each_of_its_phases_leaves_nothing(shell, slurm, phase):
    """A Slurm start ended at each of its phases leaves no job in Slurm's queue and no
    process kdist started (the controller, its forked schedulers, the follow guards), as the
    user would end it at that phase. (The Slurm tests share one Slurm, so this case lives here
    rather than in test_fault_matrix.py.) Only this case's processes count: one an earlier test
    left is named by the session's own check, under the test that started it."""
    before = set(kdist_processes_of_this_kernel())
    if phase == "refused by sbatch":
        with pytest.raises(ClusterError, match="Slurm refused the engines' job"):
            run(shell, "--strategy multiworker --np 2 --partition nope", "x = 1")
    elif phase == "pending, --timeout":
        with pytest.raises(ClusterError, match="kdist cancelled it"):
            run(shell, f"--strategy multiworker --np 2 --partition {HELD} --timeout 3", "x = 1")
    else:
        held = f" --partition {HELD}" if phase.startswith("pending") else ""
        shell.run_line_magic("kdist", f"start --strategy multiworker {SPREAD} --launcher slurm{held}")

        def reached() -> bool:
            if phase.startswith("pending"):  # %kdist status shows the job waiting, and why
                return "PENDING: PartitionDown, waited" in status(shell) and slurm.queue() != []
            if phase.startswith("running"):  # the job runs; its engines are still starting
                return any(line.endswith(" RUNNING") for line in slurm.queue())
            return "engines warmed by %kdist start" in status(shell)

        deadline = time.monotonic() + 120
        while not reached():
            assert time.monotonic() < deadline, (slurm.queue(), status(shell))
            time.sleep(0.2)
        shell.run_line_magic("kdist", "restart" if phase.endswith("restart") else "stop")
    queue_empties(slurm, within=30)
    deadline = time.monotonic() + 30
    while left := sorted(set(kdist_processes_of_this_kernel()) - before):
        assert time.monotonic() < deadline, f"left after a start cancelled ({phase}): {left}"
        time.sleep(0.5)


def queue_empties(slurm, within: float) -> None:
    """Wait until Slurm lists no job (a cancelled job leaves squeue within seconds)."""
    deadline = time.monotonic() + within
    while slurm.queue():
        assert time.monotonic() < deadline, f"left in squeue: {slurm.queue()}"
        time.sleep(0.5)


def test_multiworker_trains_across_the_nodes(shell, slurm):
    try:
        run(shell, f"--strategy multiworker {PAIRS}", MW_CELL)
    except Exception:
        print(slurm.logs())
        raise
    facts, weights = engine_values("kd_facts"), engine_values("kd_weights")
    hosts = [f["host"] for f in facts]
    assert sorted(set(hosts)) == sorted(NODES) and all(hosts.count(n) == 2 for n in NODES)
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3]  # ranks grouped by node
    workers = facts[0]["tf_config"]["cluster"]["worker"]
    for rank, f in enumerate(facts):  # each worker listens on its node's address
        assert workers[rank].rsplit(":", 1)[0] == slurm.hosts.addresses[f["host"]]
    for w in weights[1:]:
        for a, b in zip(weights[0], w):
            np.testing.assert_array_equal(np.array(a), np.array(b))
    assert facts[0]["loss"][-1] < facts[0]["loss"][0]
    assert "RUNNING on kd-host-a,kd-host-b" in status(shell)


CANCEL_CELL = """
import os, subprocess, time
if strategy.cluster_resolver.task_id == 0:  # the engines' step: every engine ends
    subprocess.run(["scancel", os.environ["SLURM_JOB_ID"] + "." + os.environ["SLURM_STEP_ID"]])
time.sleep(120)
"""


def test_a_cancelled_step_is_a_named_death_and_the_next_cell_starts_a_new_job(shell, slurm):
    strategy = kdist_magics._extension._strategies["multiworker"]
    job = strategy.cluster.job
    with pytest.raises(RankDied) as info:
        run(shell, f"--strategy multiworker {PAIRS}", CANCEL_CELL)
    said = str(info.value)
    for rank in range(4):
        assert f"rank {rank} on kd-host-" in said
    assert said.count(": the Slurm job step was cancelled") == 4, said
    run(shell, f"--strategy multiworker {SPREAD}", "import os\njob = os.environ['SLURM_JOB_ID']")
    jobs = engine_values("job")
    assert jobs[0] == jobs[1] == strategy.cluster.job != job
    shell.run_line_magic("kdist", "stop")
    assert slurm.queue() == []


@pytest.mark.long  # (its own session, beside the Colab part: scripts/test.sh)
def test_a_job_at_its_time_limit_is_a_named_death(shell, slurm):
    """``--time 0:10``: Slurm ends the job at its next look at time limits. About 100 s, nearly
    all waiting: Slurm keeps time limits in whole minutes and slurmctld looks at them every
    ~30 s, so it is in the long tier, which runs beside the Colab part."""
    with pytest.raises(KDistError) as info:
        run(shell, f"--strategy multiworker {SPREAD} --time 0:10", "import time\ntime.sleep(300)")
    assert "the Slurm job reached its time limit" in str(info.value), str(info.value)
    shell.run_line_magic("kdist", "stop")
    assert slurm.queue() == []


def test_horovod_trains_across_the_nodes_once_every_node_resolves_every_name(shell, slurm):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here (make test builds it into .venv)")
    try:
        with slurm.unresolvable("kd-host-b"), pytest.raises(KDistError) as info:
            run(shell, f"--strategy horovod {SPREAD}", HVD_CELL)
        assert "on kd-host-a cannot resolve kd-host-b" in str(info.value)
        assert "every node must resolve every node's name" in str(info.value)
        run(shell, f"--strategy horovod {SPREAD}", HVD_CELL)  # the same job's engines
    except Exception:
        print(slurm.logs())
        raise
    facts, weights = engine_values("kd_facts"), engine_values("kd_weights")
    assert sorted(f["host"] for f in facts) == sorted(NODES)
    assert [f["local_size"] for f in facts] == [1, 1] and [f["cross_rank"] for f in facts] == [0, 1]
    for w in weights[1:]:
        for a, b in zip(weights[0], w):
            np.testing.assert_array_equal(np.array(a), np.array(b))
    shell.run_line_magic("kdist", "stop")
    assert slurm.queue() == []


JAX_CELL = """
import socket, numpy as np, keras
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ np.array([1., -2., .5, 3.], dtype="float32"))[:, None]
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
kd_weights = [w.tolist() for w in model.get_weights()]
kd_host = socket.gethostname()
"""

JAX_BODY = """
ip.run_line_magic("config", "KDist.bind_address = %r")
value, err = attempt("--launcher slurm --strategy multiworker --no-dashboard " + %r, %r)
out["err"] = None if err is None else f"{type(err).__name__}: {err}"
if err is None:
    out["cls"] = type(kdist_magics._extension._strategies["multiworker"]).__name__
    out["weights"], out["hosts"] = by_rank("kd_weights"), by_rank("kd_host")
ip.run_line_magic("kdist", "stop")
# sharded across the nodes: the model axis spans them; the same training on one device here
value, err = attempt("-s default --no-dashboard --no-telemetry", SHARDED_CELL)
out["one"] = ip.user_ns["kd_loss"]
value, err = attempt("--launcher slurm --strategy sharded --mesh 1,2 --no-dashboard --no-telemetry "
                     "--pull kd_loss,kd_local " + %r, SHARDED_CELL + "\\nimport socket\\nkd_host = socket.gethostname()")
out["sharded_err"] = None if err is None else f"{type(err).__name__}: {err}"
if err is None:
    engines = kdist_magics._extension._strategies["sharded"].engines
    out["sharded"] = dict(loss=ip.user_ns["kd_loss"], local=ip.user_ns["kd_local"],
                          hosts=engines.cluster.view().pull("kd_host", block=True))
ip.run_line_magic("kdist", "stop")
"""


def test_keras_on_jax_trains_across_the_nodes(slurm):
    """Multiworker on JAX (identical weights), then sharded with the model axis across the two
    nodes (half of the large kernel on each; the losses of one device)."""
    pytest.importorskip("jax", reason="JAX is in the jax extra (make test installs it)")
    from kernel_driver import run_in_fresh_shell
    from test_sharded import TRAIN

    sharded_cell = TRAIN + "\nkd_local = {v.path: list(v.value.addressable_data(0).shape) for v in model.weights}\n"
    # (sharded: no --np; --mesh 1,2 asks for two engines, one on each node)
    body = f"SHARDED_CELL = {sharded_cell!r}\n" + JAX_BODY % (
        slurm.hosts.bridge_ip,
        SPREAD,
        JAX_CELL,
        '--sbatch "--ntasks-per-node=1"',
    )
    r = run_in_fresh_shell(body, env={"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}, unset=("XLA_FLAGS",))
    assert r["err"] is None, r["err"] + r["_stderr"][-2000:] + slurm.logs()
    assert r["cls"] == "JaxMultiWorkerStrategy" and sorted(r["hosts"]) == sorted(NODES)
    for a, b in zip(*r["weights"]):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    assert r["sharded_err"] is None, r["sharded_err"] + r["_stderr"][-2000:] + slurm.logs()
    sharded = r["sharded"]
    assert sorted(sharded["hosts"]) == sorted(NODES)
    assert sharded["local"]["d1/kernel"] == [256, 128]  # this process's half; the other node has the rest
    np.testing.assert_allclose(sharded["loss"], r["one"], rtol=1e-5, atol=1e-6)
    assert slurm.queue() == []


def test_stop_during_the_queue_wait_and_the_kernels_death_cancel_its_job(slurm):
    """In a real kernel. Stop (the kernel interrupted, as Jupyter's Stop button does) while a
    cell's job waits in the queue: the cell ends, the job is cancelled and the kernel takes the
    next cell. Then the kernel is killed while a ``%kdist start``'s job waits: cancelled too."""
    from kernel_driver import Kernel, isolated_env

    kernel = Kernel(env=isolated_env())
    try:
        kernel.check(f"%config KDist.bind_address = '{slurm.hosts.bridge_ip}'")
        msg_id = kernel.send(
            f"%%kdist --strategy multiworker --np 2 --launcher slurm --no-dashboard --partition {HELD}\nx = 1"
        )
        deadline = time.monotonic() + 60
        while not any(line.endswith(" PENDING") for line in slurm.queue()):
            assert time.monotonic() < deadline, slurm.queue()
            time.sleep(0.3)
        time.sleep(1.0)  # into the wait (an interrupt while it submits is caught the same way)
        kernel.interrupt()
        res = kernel.wait_for(msg_id, timeout=60)
        assert res.errors and res.errors[0]["ename"] == "Interrupted", res.text[-2000:]
        assert len(res.errors[0]["traceback"]) == 1, res.errors[0]  # one line, no kdist frames
        said = [ln for ln in res.stdout.splitlines() if "interrupted: kdist cancelled Slurm job" in ln]
        assert said and said[0].endswith("(PENDING: PartitionDown)"), res.text[-2000:]
        queue_empties(slurm, within=30)
        run = "__import__('kdist_magics').last_run()"
        assert kernel.eval(f"({run}.status, [p['name'] for p in {run}.phases][-1])") == (
            "interrupted",
            "waiting in Slurm's queue for 2 engines",
        )  # the phase it ended in
        assert kernel.check("print(6 * 7)").stdout.strip() == "42"
        kernel.check(f"%kdist start --strategy multiworker --np 2 --launcher slurm --partition {HELD}")
        deadline = time.monotonic() + 60
        while "PENDING: PartitionDown" not in (said := kernel.check("%kdist status").stdout):
            assert time.monotonic() < deadline, said  # submitted, and waiting (not failed)
            time.sleep(0.3)
        assert slurm.queue()
    finally:
        kernel.kill()
    queue_empties(slurm, within=30)


def test_engines_of_a_slurm_job_the_user_started_are_attached_by_cluster_id(shell, slurm):
    """A cluster the user started with ipyparallel's Slurm launcher (its controller here, its
    engines one job spread over both nodes): ``--cluster-id`` attaches to it, multiworker trains
    across the nodes with identical weights, and ``%kdist stop`` leaves the user's job running."""
    import ipyparallel as ipp

    # as a user would: ipyparallel's own Slurm launcher, with a batch script that spreads the
    # engines (its `options` trait is not read in ipyparallel 9.2)
    theirs = ipp.Cluster(
        cluster_id="theirs-on-slurm", n=2, controller_ip=slurm.hosts.bridge_ip, engines="slurm", log_level=40
    )
    theirs.config.SlurmEngineSetLauncher.batch_template = (
        "#!/bin/sh\n#SBATCH --ntasks={n}\n#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --output={slurm.folder}/theirs-%j.out\n#SBATCH --export=ALL\n"
        "srun {program_and_args}\n"
    )
    # its batch file (an absolute name: the launcher's folder is always '.', the notebook's)
    theirs.config.SlurmEngineSetLauncher.batch_file_name = str(slurm.folder / "theirs.sbatch")
    theirs.start_cluster_sync()
    try:
        try:
            theirs.connect_client_sync().wait_for_engines(2, timeout=120)
            shell.run_cell_magic(
                "kdist", "--strategy multiworker --np 2 --cluster-id theirs-on-slurm --no-dashboard", MW_CELL
            )
        except Exception:
            print(slurm.logs())
            raise
        facts, weights = engine_values("kd_facts"), engine_values("kd_weights")
        assert sorted(f["host"] for f in facts) == sorted(NODES)
        for a, b in zip(*weights):
            np.testing.assert_array_equal(np.array(a), np.array(b))
        assert facts[0]["loss"][-1] < facts[0]["loss"][0]
        shell.run_line_magic("kdist", "stop")
        assert slurm.queue(), "kdist cancelled a job it did not start"
        assert len(theirs.connect_client_sync().ids) == 2  # their engines are still there
    finally:
        theirs.stop_cluster_sync()
    queue_empties(slurm, within=30)
