"""Faults at every phase of an engine run, through a real kernel.

kdist's phase barrier (:mod:`kdist_magics.rank.faults`, armed by ``KDIST_HOLD_DIR``) holds the
kernel at a phase; ``fault_matrix.run_case`` does the fault to the process the barrier
names, releases the hold and records the outcome. Each case must end in one of the two
outcomes allowed: the cell fails with one named line (the expected error, and the
words saying what happened), or it carries on with the right result; then no process kdist
started is left, and the next cell works. A case that hangs fails on the driver's bound
(``fault_matrix.CASE_BOUND``); the seconds themselves are ``benchmarks/failure_times.py
--matrix``'s to print, never asserted here.

One kernel serves a strategy's cases in order (a cold start is made with ``%kdist stop``
for the phases before the engines are up); kernel faults get a kernel of their own.
"""

from __future__ import annotations

import pytest

pytest.importorskip("ipyparallel", reason="ipyparallel is a core dependency")
pytest.importorskip("jupyter_client", reason="jupyter_client drives the kernel")
pytest.importorskip("psutil", reason="processes are found with psutil")

import fault_matrix as fm  # noqa: E402

pytestmark = [pytest.mark.engines, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(900)]


def matches(out: fm.Outcome, expected) -> bool:
    """The case ended as ``expected``: "ok" (it carried on), or (error name, *words in it),
    shown as one line."""
    if expected == "ok":
        return out.ok
    name, *words = expected
    return (
        not out.ok
        and out.error is not None
        and out.error.startswith(f"{name}: ")
        and all(w in out.error for w in words)
        and out.lines == 1
    )  # no kdist traceback


def check(out: fm.Outcome, expected) -> None:
    where = f"{out.strategy} {out.phase} {out.fault}: {out.row()} {out.note}"
    alternatives = expected if isinstance(expected, list) else [expected]
    assert any(matches(out, e) for e in alternatives), f"{where}; expected one of {alternatives}"
    assert not out.left, where
    assert out.next_ok, where


def run_strategy(strategy: str, table: dict, tmp_path) -> None:
    for out, expected in fm.run_strategy(strategy, table, tmp_path, skip=fm.COVERED_ELSEWHERE):
        check(out, expected)


@pytest.mark.horovod
def test_horovod_faults_at_every_phase(tmp_path):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here (make test builds it into .venv)")
    run_strategy("horovod", fm.EXPECTED["horovod"], tmp_path)


def test_multiworker_faults_at_every_phase(tmp_path):
    pytest.importorskip("tensorflow", reason="multiworker runs TensorFlow on the engines")
    run_strategy("multiworker", fm.EXPECTED["multiworker"], tmp_path)


def test_jax_multiworker_faults_at_every_phase(tmp_path):
    pytest.importorskip("jax", reason="Keras on JAX across engines needs JAX")
    run_strategy("jax", fm.EXPECTED["jax"], tmp_path)


@pytest.mark.torch
def test_torch_multiworker_faults_at_every_phase(tmp_path):
    pytest.importorskip("torch", reason="Keras on PyTorch across engines needs PyTorch (.venv has it)")
    run_strategy("torch", fm.EXPECTED["torch"], tmp_path)


KERNEL_TESTED = [c for c in fm.KERNEL_CASES if c not in fm.KERNEL_CASES_BENCH_ONLY]


@pytest.mark.parametrize("strategy,phase,fault", KERNEL_TESTED, ids=["-".join(c) for c in KERNEL_TESTED])
def test_a_kernel_that_dies_or_restarts_at_any_phase_leaves_nothing(strategy, phase, fault, tmp_path):
    if strategy == "horovod":
        pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here")
    if strategy == "jax":
        pytest.importorskip("jax", reason="Keras on JAX across engines needs JAX")
    else:
        pytest.importorskip("tensorflow", reason="the strategies run TensorFlow on the engines")
    out, k = fm.run_case(strategy, phase, fault, tmp_path)
    try:
        where = f"{out.row()} {out.note}"
        assert not out.left, f"{where}: still running {fm.GONE_WITHIN:g} s after the kernel went"
        if fault == "kernel-restart":
            assert out.next_ok, where  # the restarted kernel runs the cell
    finally:
        if k is not None:
            k.shutdown()
            k.cleanup()


THEIRS = (
    "import kdist_magics, ipyparallel as ipp\ntheirs = ipp.Cluster(n=2, cluster_id='theirs', "
    "controller_ip='127.0.0.1', log_level=40)\ntheirs.start_cluster_sync()\n"
    "theirs.connect_client_sync().wait_for_engines(2, timeout=120, interactive=False)"
)
#: the user mends their cluster: what is left of it stopped (an engine set whose engines died
#: with their controller raises as it stops), the connection files a killed controller left
#: removed (new engines would read them and fail: what ``ipcluster clean`` does), a new one
#: started under the same id
RESTART_THEIRS = (
    "import glob, os\ntry:\n    theirs.stop_cluster_sync()\nexcept Exception as e:\n"
    "    print('stop:', repr(e)[:200])\nfor f in glob.glob(os.path.join(theirs.profile_dir, "
    "'security', 'ipcontroller-theirs-*.json')):\n    os.remove(f)\n" + THEIRS.split("\n", 1)[1]
)


@pytest.mark.horovod
def test_faults_on_an_attached_cluster_never_end_its_engines(tmp_path):
    """A cluster the notebook's user started (attach: ``--cluster-id``), three faults in turn.
    Each is named in one line that sends the user to their cluster (kdist restarts nothing it
    did not start), kdist ends none of their processes, and once the user has mended their
    cluster the next cell works; ``%kdist stop`` leaves their engines running.

    1. An engine stopped mid-cell counts as lost after 10 s, and is never ended.
    2. An engine killed as the run is set up: the other engine is left alone. (Killed once
       Horovod is up, the other may be aborted by Gloo itself, SIGABRT: the matrix's case.)
    3. Their controller killed mid-cell: kdist watches it through the process listening on the
       address in the cluster's connection file, so the run ends at once instead of hanging.
    """
    import os
    import signal
    import time

    import psutil

    pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here")
    k, holds = fm.new_kernel(tmp_path)
    cell = fm.CELLS["horovod"].replace("--np 2", "--np 2 --cluster-id theirs")

    def engines():
        return k.eval("[e.pid for e in kdist_magics._extension._strategies['horovod'].cluster.engines]")

    def faulted(phase, harm, code=cell):
        holds.arm(phase)
        msg_id = k.send(code)
        facts = holds.wait(phase)
        harm(facts)
        holds.release(phase)
        res = k.wait_for(msg_id, timeout=fm.CASE_BOUND)
        assert res.errors, res.text[-1500:]
        err = res.errors[0]
        assert len([ln for ln in err.get("traceback", []) if ln.strip()]) == 1, err  # one named line
        return err

    try:
        k.check(THEIRS)
        k.check(cell, timeout=300)  # warm: TensorFlow and Horovod imported on their engines
        pids = engines()

        # 1. an engine stopped mid-cell
        err = faulted("cell", lambda facts: os.kill(facts["engines"][-1], signal.SIGSTOP))
        assert err.get("ename") == "RankDied", err
        assert "rank 1 has been stopped (SIGSTOP) for 10 s" in err["evalue"], err["evalue"]
        assert f"kill -CONT {pids[-1]}" in err["evalue"], err["evalue"]
        time.sleep(1)
        assert psutil.Process(pids[-1]).status() == psutil.STATUS_STOPPED  # not ended by kdist
        assert all(psutil.pid_exists(p) for p in pids)
        os.kill(pids[-1], signal.SIGCONT)
        assert "2" in k.check(cell, timeout=300).text  # continued: the next cell works

        # 2. an engine killed as the run is set up (before Horovod starts on the other one)
        pids = engines()
        err = faulted("setup", lambda facts: os.kill(facts["engines"][-1], signal.SIGKILL))
        assert err.get("ename") == "RankDied", err
        assert err["evalue"].startswith(
            f"While the engines were prepared: rank 1 has ended (pid {pids[-1]}; kdist did not start it"
        ), err["evalue"]
        assert "The cell did not run" in err["evalue"]
        assert "restart the cluster's engines (kdist restarts no cluster it did not start)" in err["evalue"]
        assert psutil.pid_exists(pids[0])  # the other engine is theirs: left running
        k.check(RESTART_THEIRS, timeout=180)
        assert "2" in k.check(cell, timeout=300).text

        # 3. their controller killed mid-cell: its every process (ipyparallel 9's hub and
        # schedulers are children of the launched one, and go on serving without it)
        pids = engines()
        top = k.eval("theirs.controller.pid")
        controller = [top] + [c.pid for c in psutil.Process(top).children(recursive=True)]
        long_cell = cell.replace("time.sleep(1.5)", "time.sleep(30)")  # running when it dies
        t0 = time.monotonic()
        err = faulted("cell", lambda facts: [os.kill(pid, signal.SIGKILL) for pid in controller], long_cell)
        assert time.monotonic() - t0 < 25  # named at once, not at the cell's end nor never
        assert err.get("ename") == "ControllerDied", err
        assert err["evalue"].startswith("the cluster's ipyparallel controller has ended (pid "), err["evalue"]
        assert "on this host) during the run" in err["evalue"], err["evalue"]
        assert "Start the cluster again (kdist restarts no cluster it did not start), then run" in err["evalue"]
        assert all(psutil.pid_exists(p) for p in pids)  # their engines: not ended by kdist
        k.check(RESTART_THEIRS, timeout=180)
        assert "2" in k.check(cell, timeout=300).text
        pids = engines()
        k.check("%kdist stop")
        time.sleep(1)
        assert all(psutil.pid_exists(p) for p in pids)  # kdist never stops their engines
    finally:
        try:
            k.check("theirs.stop_cluster_sync()", timeout=120)
        finally:
            k.shutdown()
            k.cleanup()


@pytest.mark.parametrize("moment", ["as it starts", "after its first scheduler", "once it listens"])
def test_a_controller_ended_while_it_forks_its_schedulers_takes_them_along(moment, tmp_path):
    """An owned controller ended at any moment of its start (a refused or cancelled
    Slurm job, Stop or ``%kdist stop`` during a start) left the schedulers it had forked
    running, parent 1, following nobody. The real controller, started as kdist starts it
    (``kdist_magics.cluster.follow``, a session of its own as ipyparallel's launcher gives it),
    is killed at one moment of its start; every process of its group is gone within
    ``fm.GONE_WITHIN``."""
    import subprocess
    import sys
    import time

    import psutil

    from kdist_magics.cluster.follow import command
    from kdist_magics.cluster.lifetime import live_in_group
    from kernel_driver import wait_gone

    cmd = command("ipyparallel.controller") + [
        f"--profile-dir={tmp_path / 'profile'}",
        "--ip=127.0.0.1",
        "--cluster-id=kdleak",
    ]
    controller = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path
    )

    def group() -> list[int]:
        return live_in_group(controller.pid)

    def schedulers() -> list[int]:
        return [p for p in group() if p != controller.pid]

    deadline = time.monotonic() + 120
    if moment == "as it starts":
        time.sleep(0.3)
    elif moment == "after its first scheduler":
        while not schedulers():
            assert time.monotonic() < deadline and controller.poll() is None, "no scheduler forked"
            time.sleep(0.01)
    else:
        files = tmp_path / "profile" / "security"
        while not list(files.glob("ipcontroller-kdleak-client.json")):
            assert time.monotonic() < deadline and controller.poll() is None, "it never listened"
            time.sleep(0.1)
        assert schedulers(), "a listening controller has forked its schedulers"
    seen = group()
    controller.kill()
    controller.wait(timeout=30)
    left, _ = wait_gone(seen, fm.GONE_WITHIN)
    left += [p for p in group() if p not in left]
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    assert not left, f"left after the controller was killed {moment}: {left} ({sys.platform})"
