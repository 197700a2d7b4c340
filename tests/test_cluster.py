"""Fast tier: engine lifecycle, supervision and transport pieces, with fakes (no engines, no TF)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kdist_magics.rank import lifecycle, values
from kdist_magics.rank import feed as feed_mod
from kdist_magics.cluster.cluster import EngineCluster, EngineInfo
from kdist_magics.cluster.exits import describe_exit, exiting
from kdist_magics.errors import CellFailed, RankDied, RankFailed, RunTimedOut
from kdist_magics.watch.record import RunRecord
from kdist_magics.strategies.engines.strategy import EngineStrategy
from kdist_magics.strategies.engines.printer import Printer as _Printer
from kdist_magics.strategies.engines.supervisor import RunSupervisor
from kdist_magics.strategies.engines.finish import finish_engines
from kdist_magics.strategies.engines.start import check_syntax

from conftest import ROOT, python_without


def test_exit_status_words():
    assert describe_exit(3) == "exited with status 3"
    assert "SIGKILL" in describe_exit(-9) and "out of memory" in describe_exit(-9)
    assert "segmentation fault" in describe_exit(-11)
    assert describe_exit(None) == "exited (status unknown)"


def test_engine_module_imports_without_tensorflow():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import kdist_magics.rank.lifecycle, kdist_magics.cluster.cluster, "
            "kdist_magics.strategies.engines.strategy; "
            + python_without("tensorflow", "keras", "horovod", "ipyparallel"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


# -- output ------------------------------------------------------------------------
def test_rank0_mode_shows_rank_zero_only(capsys):
    p = _Printer("rank0")
    p.write(1, "stdout", "from one\n")
    p.write(0, "stdout", "from zero\n")
    p.write(0, "stderr", "warn\n")
    out = capsys.readouterr()
    assert out.out == "from zero\n" and out.err == "warn\n"


def test_all_mode_prefixes_every_line_across_chunks_and_progress_bars(capsys):
    p = _Printer("all")
    p.write(0, "stdout", "a\nb")
    p.write(1, "stdout", "x\n")
    p.write(0, "stdout", "c\n\r1/2\r2/2")  # Keras-style progress bar: \r then the bar
    p.write(1, "stdout", "half a line")
    # the bar's latest redraw is shown at once (not one update late); a half line waits
    assert capsys.readouterr().out == "[rank 0] a\n[rank 1] x\n[rank 0] bc\n\r[rank 0] 1/2\r[rank 0] 2/2"
    p.write(0, "stdout", "\r3/3\n")
    assert capsys.readouterr().out == "\r[rank 0] 3/3\n"
    p.flush()
    assert capsys.readouterr().out.splitlines() == ["[rank 1] half a line"]


def test_none_mode_hides_everything(capsys):
    p = _Printer("none")
    p.write(0, "stdout", "hidden\n")
    assert capsys.readouterr().out == ""


# -- telemetry transport -------------------------------------------------------------
def _batch(rank, seq, rows):
    return {"data": {feed_mod.FEED_MIME: {"rank": rank, "seq": seq, "rows": rows}}}


def test_feed_rows_reach_the_record_once_in_order_and_gaps_are_counted():
    record = RunRecord("horovod", size=2)
    sup = RunSupervisor(record)
    sup.feed(0, _batch(0, 1, [["metric", {"rank": 0, "step": 1, "loss": 2.0}], ["progress", {"epochs": 3}]]))
    sup.feed(1, _batch(1, 1, [["metric", {"rank": 1, "step": 1}]]))
    sup.feed(0, _batch(0, 1, [["metric", {"rank": 0, "step": 1}]]))  # duplicate
    sup.feed(0, _batch(0, 2, [["sample", {"rank": 0, "cpu": 50.0}]]))
    assert [(m["rank"], m["step"]) for m in record.metrics] == [(0, 1), (1, 1)]
    assert record.samples == [{"rank": 0, "cpu": 50.0}] and record.progress == {"epochs": 3}
    assert sup.lost_batches == 0
    sup.feed(0, _batch(0, 5, []))
    assert sup.lost_batches == 2


class _FakeDisplayPub:
    def __init__(self):
        self.sent = []
        self.parent_header = {"msg_id": "exec-1"}
        self.pub_socket = object()
        self.topic = b"display_data"
        self.session = self

    def send(self, socket, msg_type, content, parent=None, ident=None):
        self.sent.append((msg_type, content, parent))


def test_engine_feed_numbers_batches_and_publishes_to_the_cell_request():
    pub = _FakeDisplayPub()
    feed = feed_mod.Feed(rank=1, interval=0.05, publisher=pub)
    feed.sink("metric", {"step": 1})
    feed.flush()  # not armed yet: nothing goes out (no request to parent it to)
    assert pub.sent == []
    feed.arm()
    try:
        feed.sink("metric", {"step": 2})
        deadline = time.monotonic() + 5
        while not pub.sent and time.monotonic() < deadline:
            time.sleep(0.02)
        feed.sink("metric", {"step": 3})
        feed.disarm()  # the cell ended: the rest goes out under the cell's request, now
        feed.sink("sample", {"cpu": 1.0})
        time.sleep(0.2)
    finally:
        feed.close()
    feed.flush()  # no open request any more: kept for end()
    feed.flush(parent={"msg_id": "end-1"})
    payloads = [(c["data"][feed_mod.FEED_MIME], parent["msg_id"]) for _, c, parent in pub.sent]
    assert [p["seq"] for p, _ in payloads] == [1, 2, 3]
    assert payloads[0][0]["rows"] == [["metric", {"step": 1}], ["metric", {"step": 2}]]
    assert payloads[1][0]["rows"] == [["metric", {"step": 3}]]
    assert payloads[2][0]["rows"] == [["sample", {"cpu": 1.0}]]
    assert [parent for _, parent in payloads] == ["exec-1", "exec-1", "end-1"]
    assert all(p["rank"] == 1 for p, _ in payloads)


# -- values travelling ------------------------------------------------------------------
def test_fetch_names_missing_values_and_untravellable_ones(shell):
    shell.user_ns.update(kd_a=[1, 2], kd_lock=__import__("threading").Lock())
    try:
        assert values.fetch(["kd_a"]) == {"kd_a": ("value", [1, 2])}
        with pytest.raises(KeyError, match="kd_nope"):
            values.fetch(["kd_a", "kd_nope"])
        with pytest.raises(TypeError, match="kd_lock"):
            values.fetch(["kd_lock"])
        assert values.unpack(("value", {"x": 1})) == {"x": 1}
    finally:
        shell.user_ns.pop("kd_a")
        shell.user_ns.pop("kd_lock")


def test_syntax_error_is_reported_before_any_engine(shell, capsys):
    strategy = EngineStrategy()

    class Ctx:
        pass

    ctx = Ctx()
    ctx.shell = shell
    with pytest.raises(CellFailed) as info:
        check_syntax("x = (1,\nprint(x)", ctx)
    assert isinstance(info.value.original, SyntaxError)
    assert strategy.cluster is None  # nothing was started
    out = capsys.readouterr()
    assert "SyntaxError" in out.out + out.err
    check_syntax("%time x = 1\n!echo ok", ctx)  # IPython syntax is fine


# -- errors -----------------------------------------------------------------------------
class _RemoteLike(Exception):
    ename, evalue = "ValueError", "bad data"

    def render_traceback(self):
        return ["Traceback on the engine", "ValueError: bad data"]


def test_rank_failure_names_the_rank_and_shows_its_traceback_once():
    err = RankFailed({1: _RemoteLike()}, stopped=[0])
    assert str(err) == "rank 1: ValueError: bad data"
    lines = err._render_traceback_()
    assert "rank 1" in lines[0] and "stopped rank 0" in lines[0]
    assert lines[-1] == "ValueError: bad data" and lines.count("ValueError: bad data") == 1
    assert isinstance(err, CellFailed) and isinstance(err.original, _RemoteLike)


def test_death_and_timeout_messages():
    died = RankDied({1: describe_exit(-9)})
    assert "rank 1 was killed by SIGKILL" in str(died) and died.status == "failed"
    late = RunTimedOut(5, [0, 1])
    assert "rank 0, rank 1" in str(late) and late.status == "timeout"


# -- watching processes -------------------------------------------------------------------
class _Launcher:
    def __init__(self, pid):
        self.pid = pid
        self.stop_data = None


class _FakeIpp:
    """Stands in for ipyparallel.Cluster: one engine set with local launchers."""

    def __init__(self, pids):
        self.engines = {"set": type("S", (), {"launchers": {i: _Launcher(p) for i, p in enumerate(pids)}})()}
        self.controller = None


class _FakeClient:
    def __init__(self, ids, silent=False):
        self.ids = list(ids)
        self.signals = []
        self.silent = silent

    def send_signal(self, sig, targets=None, block=None):
        from concurrent.futures import Future

        self.signals.append((sig, list(targets)))
        answered = Future()  # an engine whose host died never answers
        if not self.silent:
            answered.set_result(None)
        if block:  # as ipyparallel's: wait for the answers (here at most 10 s)
            answered.result(timeout=10)
        return answered

    def close(self):
        pass


def _sleeper():
    """A process that sleeps a minute, as an engine would, SIGINT ending it, whatever this one
    inherited (a suite started as a background job runs with SIGINT ignored, and so would its
    children); returned once it runs its code, so no signal meets an interpreter still starting."""
    code = (
        "import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "print('up', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    return proc


def _watched(procs) -> EngineCluster:
    """An owned cluster whose engines are ``procs`` (ids 0, 1, ...), with fake ipyparallel parts."""
    c = EngineCluster(len(procs))
    c.cluster = _FakeIpp([p.pid for p in procs])
    c.client = _FakeClient(list(range(len(procs))))
    c.engines = [EngineInfo(i, p.pid, "here") for i, p in enumerate(procs)]
    return c


@pytest.mark.timeout(60)
def test_dead_engine_is_detected_with_its_exit_status():
    procs = [_sleeper(), _sleeper()]
    try:
        c = _watched(procs)
        assert c.dead() == {}
        procs[1].kill()
        procs[1].wait()  # what the launcher's watcher does; it records the status:
        c.cluster.engines["set"].launchers[1].stop_data = {"exit_code": -9}
        assert c.dead() == {1: describe_exit(-9)}
        c.signal(signal.SIGTERM, [0])
        assert procs[0].wait(timeout=10) == -signal.SIGTERM
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_process_being_killed_reads_as_exiting(tmp_path):
    """SIGKILL pending, or the kernel's PF_EXITING flag: the process is ending, though its
    status still reads running (a large engine takes a moment to be torn down)."""

    def proc(pid, flags, shdpnd="0000000000000000", sigpnd="0000000000000000"):
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} (python3 (engine)) R 1 2 3 4 5 {flags} 0 0\n")
        (d / "status").write_text(f"Name:\tpython3\nSigPnd:\t{sigpnd}\nShdPnd:\t{shdpnd}\n")

    proc(1, 0x400000)
    proc(2, 0x400004)  # PF_EXITING
    proc(3, 0x400000, shdpnd="0000000000000100")  # SIGKILL (9) pending for the process
    proc(4, 0x400000, sigpnd="0000000000000100")  # ... for its main thread
    proc(5, 0x400000, shdpnd="0000000000000002")  # SIGINT pending: it may live on
    assert [exiting(pid, str(tmp_path)) for pid in range(1, 7)] == [False, True, True, True, False, False]
    assert not exiting(os.getpid())
    child = _sleeper()
    child.kill()
    deadline = time.monotonic() + 10
    while not exiting(child.pid) and time.monotonic() < deadline:  # until reaped it is ending
        time.sleep(0.01)
    assert exiting(child.pid)
    child.wait()
    assert not exiting(child.pid)


def test_an_engine_being_torn_down_counts_as_dead_before_its_status_says_so(monkeypatch):
    from kdist_magics.cluster import liveness

    procs = [_sleeper(), _sleeper()]
    try:
        c = _watched(procs)
        c.cluster.engines["set"].launchers[1].stop_data = {"exit_code": -9}
        monkeypatch.setattr(liveness, "exiting", lambda pid: pid == procs[1].pid)
        assert c.dead() == {1: describe_exit(-9)}
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.timeout(60)
def test_attached_cluster_is_never_killed_and_remote_engines_are_signalled_through_ipyparallel():
    proc = _sleeper()
    try:
        c = EngineCluster(2, cluster_id="theirs")
        assert c.attached and not c.owned
        c.client = _FakeClient([0, 1])
        c.engines = [EngineInfo(0, proc.pid, __import__("socket").gethostname()), EngineInfo(1, 999999, "elsewhere")]
        c.kill()  # interrupts, never SIGKILL, on somebody else's cluster
        assert proc.wait(timeout=10) != -signal.SIGKILL
        assert c.client.signals == [(signal.SIGINT, [1])]
        c.client.ids = [0]  # engine 1 unregistered: that is how a remote death shows
        assert 1 in c.dead()
        with pytest.raises(Exception, match="not kdist's to restart"):
            c.restart()
    finally:
        proc.kill()
        proc.wait()


def test_a_signal_to_an_engine_on_a_dead_host_is_not_waited_for_ever(monkeypatch):
    from kdist_magics.cluster import cluster as cluster_mod

    monkeypatch.setattr(cluster_mod, "SIGNAL_WAIT", 0.3)
    c = EngineCluster(1, cluster_id="theirs")
    c.client = _FakeClient([0], silent=True)
    c.engines = [EngineInfo(0, 999999, "elsewhere")]
    t0 = time.monotonic()
    c.kill()
    assert c.client.signals == [(signal.SIGINT, [0])] and time.monotonic() - t0 < 5


# -- keeping engines warm -----------------------------------------------------------------
class _FakeEngineCluster:
    made: list = []
    options = None  # (EngineCluster's: a local cluster has no launcher's options)
    launcher = "local"  # (EngineCluster's)

    def give_up(self):
        pass

    def __init__(
        self, n, cluster_id=None, profile=None, ip="127.0.0.1", controller_nice=0, private=False, preload=(), threads=0
    ):
        self.n, self.cluster_id, self.profile, self.ip = n, cluster_id, profile, ip
        self.preload, self.threads = preload, threads
        self.controller_nice, self.private = controller_nice, private
        self.namespace = None  # (a private network's holder: EngineCluster.namespace)
        self.attached = cluster_id is not None or profile is not None
        self.owned = not self.attached
        self.running = False
        self.deaths: dict = {}
        self.calls: list = []
        _FakeEngineCluster.made.append(self)

    def start(self):
        self.running = True
        self.calls.append("start")
        return self

    def stop(self):
        self.running = False
        self.calls.append("stop")

    def restart(self):
        self.calls.append("restart")
        self.deaths = {}
        return self

    def dead(self, settle=False):
        return dict(self.deaths)

    def controller_gone(self):
        return None  # its controller runs (EngineCluster.controller_gone)

    from kdist_magics.cluster.liveness import Liveness

    why_restart = Liveness.why_restart  # the real rule, over this fake's dead/controller_gone/namespace


def test_engines_are_reused_and_restarted_when_n_changes_or_one_died(monkeypatch, capsys):
    import kdist_magics.strategies.engines.start as engines_mod
    from kdist_magics.spec import RunSpec

    _FakeEngineCluster.made = []
    monkeypatch.setattr(engines_mod, "EngineCluster", _FakeEngineCluster)
    strategy = EngineStrategy()

    from kdist_magics.strategies.base import RunOptions

    class Ctx:  # as strategies.RunContext
        options = RunOptions()
        quiet = False

    def ctx(**kw):
        c = Ctx()
        c.spec = RunSpec(strategy="horovod", **kw)
        c.record = RunRecord("horovod", size=kw.get("np", 2))
        return c

    starting = ctx(np=2)
    first = strategy._cluster(starting)
    assert first.n == 2 and first.ip == "127.0.0.1" and first.owned and first.calls == ["start"]
    assert first.controller_nice == RunOptions.helper_nice  # the controller runs below the ranks
    assert [p["name"] for p in starting.record.phases] == ["starting 2 engines"]  # the run's first
    warm = ctx(np=2)
    assert strategy._cluster(warm) is first and first.calls == ["start"]  # warm
    assert warm.record.phases == []  # nothing to start
    first.deaths = {1: "exited with status 3"}
    assert strategy._cluster(ctx(np=2)) is first and first.calls == ["start", "restart"]
    strategy.needs_restart = "stopped ranks did not answer"
    strategy._cluster(ctx(np=2))
    assert first.calls == ["start", "restart", "restart"] and strategy.needs_restart is None
    first.namespace = type("Holder", (), {"gone": True})()  # the private network's holder ended
    strategy._cluster(ctx(np=2))
    assert first.calls[-1] == "restart"
    early = capsys.readouterr()
    assert "restarting the engines (the private network's holder ended)" in early.out
    first.namespace = None
    second = strategy._cluster(ctx(np=3))  # a different N: a new cluster
    assert second is not first and second.n == 3 and first.calls[-1] == "stop"
    attached = strategy._cluster(ctx(np=3, cluster_id="theirs", given=frozenset({"cluster_id"})))
    assert attached.attached and attached.cluster_id == "theirs" and second.calls[-1] == "stop"
    said = capsys.readouterr()
    # news, not errors: kdist's progress lines go to stdout (Jupyter shows stderr in red)
    assert "restarting the engines (an engine died)" in early.out and "3 ranks requested" in said.out
    assert "kdist:" not in said.err + early.err


def test_route_iface_names_the_interface_towards_an_address():
    import psutil

    from kdist_magics.cluster.network import route_iface

    assert route_iface("127.0.0.1") in psutil.net_if_addrs()
    assert route_iface("127.0.0.1") == "lo"


def test_late_batches_still_count_and_the_first_batch_is_not_lost_before_listening():
    from types import SimpleNamespace

    record = RunRecord("horovod", size=1)
    sup = RunSupervisor(record)
    for seq in (1, 3, 2):  # out of order (catch-up and live delivery interleave)
        sup.feed(0, _batch(0, seq, [["metric", {"rank": 0, "step": seq}]]))
    assert sorted(m["step"] for m in record.metrics) == [1, 2, 3] and sup.lost_batches == 0

    early = _batch(0, 1, [["sample", {"rank": 0}]])  # arrived before the callback was attached
    fut = SimpleNamespace(output=SimpleNamespace(metadata={"outputs": [early]}), iopub_callbacks=[])
    sup.listen(fut, 0)
    inbox = sup.inbox
    late = _batch(0, 2, [])
    fut.output.metadata["outputs"].append(late)
    fut.iopub_callbacks[0]({"header": {"msg_type": "display_data"}, "content": late})
    got = []
    while not inbox.empty():
        got.append(inbox.get())
    assert got == [(0, "display_data", early), (0, "display_data", late)]


def test_lost_batches_reach_the_run_record_when_the_engines_finish():
    from types import SimpleNamespace

    from kdist_magics.strategies.engines.run import EngineRun

    record = RunRecord("horovod", size=2)
    run = EngineRun(EngineStrategy(), "", SimpleNamespace(record=record))
    run.cluster, run.ranks = SimpleNamespace(running=False, engines=[]), [0, 1]
    run.supervisor = sup = RunSupervisor(record)  # the cell running
    sup.feed(0, _batch(0, 1, [["metric", {"rank": 0, "step": 1}]]))
    sup.feed(0, _batch(0, 4, [["metric", {"rank": 0, "step": 9}]]))
    finish_engines(run, ok=True)
    assert record.lost_batches == 2 and run.supervisor is None  # per cell: dropped after it
    assert "2 telemetry batches lost" in record.summary()


def test_gc_frozen_hides_earlier_objects_from_the_collector_then_gives_them_back():
    import gc

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle made before the block
    import weakref

    gone = weakref.ref(a)
    with lifecycle.gc_frozen():
        assert gc.get_freeze_count() > 0
        del a, b
        gc.collect()
        assert gone() is not None  # frozen: not collected during the run
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None  # collected once the run is over


def test_what_a_quick_rank_sent_before_kdist_listened_is_not_lost():
    from types import SimpleNamespace

    sup = RunSupervisor(RunRecord("horovod", size=2))
    value = {"data": {"text/plain": "42"}, "execution_count": 3}
    md = {"outputs": [], "execute_input": "x = 42\nx", "execute_result": value}
    fut = SimpleNamespace(output=SimpleNamespace(metadata=md), iopub_callbacks=[])
    sup.listen(fut, 0)
    assert sup.inbox.get_nowait() == (0, "execute_result", value)  # the cell's value
    assert sup.started == {0}  # it has begun: an interrupt may be sent to it
    fut1 = SimpleNamespace(output=SimpleNamespace(metadata={"outputs": []}), iopub_callbacks=[])
    sup.listen(fut1, 1)
    assert sup.started == {0}  # rank 1 has not begun: no SIGINT yet (it would be lost)
    fut1.iopub_callbacks[0]({"header": {"msg_type": "execute_input"}, "content": {"code": ""}})
    assert sup.started == {0, 1}


def test_a_following_process_and_its_children_end_when_the_followed_one_does(tmp_path):
    """kdist_magics.cluster.follow, as the controller's and every engine's launcher command: the watch is
    in place before the module runs, and takes the module's children along."""
    import os

    import psutil

    from kdist_magics.cluster.follow import command
    from kernel_driver import wait_gone

    (tmp_path / "kd_follow_probe.py").write_text(
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "seen = (os.environ['KDIST_PRELOADED'].replace(' ', '_'), os.environ['TF_NUM_INTRAOP_THREADS'],\n"
        "        os.environ['TF_NUM_INTEROP_THREADS'])\n"
        "open(sys.argv[1], 'w').write(f'{child.pid} {sys.argv[2]} {seen[0]} {seen[1]} {seen[2]} {\"wave\" in sys.modules}')\n"
        "time.sleep(120)\n"
    )
    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    procs = [kernel]
    try:
        cmd = command(
            "kd_follow_probe",
            kernel.pid,
            psutil.Process(kernel.pid).create_time(),
            preload=("wave",),
            threads=1,
            ranks=lifecycle.cpu_count() + 1,
        )
        assert cmd[1:3] == ["-m", "kdist_magics.cluster.follow"] and cmd[-1] == "kd_follow_probe"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "CUDA_VISIBLE_DEVICES": ""}
        out = tmp_path / "child.txt"
        follower = subprocess.Popen(cmd + [str(out), "argv-kept"], env=env)
        procs.append(follower)
        deadline = time.monotonic() + 60
        while not out.exists() or not out.read_text():
            assert time.monotonic() < deadline and follower.poll() is None
            time.sleep(0.05)
        child, argv, preloaded, threads, inter, imported = out.read_text().split()
        assert argv == "argv-kept"  # the module ran as __main__ with its own arguments
        # what the engines preload was imported first, after the run's thread variables
        # (more ranks than cores here: two inter-op threads, lifecycle.thread_env)
        assert (preloaded, threads, inter, imported) == ("imported_wave", "1", "2", "True")
        time.sleep(0.5)
        assert follower.poll() is None and psutil.pid_exists(int(child))  # all alive meanwhile
        kernel.kill()
        kernel.wait(timeout=10)
        left, _ = wait_gone([follower.pid, int(child)], 10)
        follower.wait(timeout=10)
        assert not left, left
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


FORKER = (
    "import multiprocessing as mp, os, sys, time\n"
    "def child():\n"
    "    time.sleep(120)\n"
    "if __name__ == '__main__':\n"
    "    kids = [mp.get_context('fork').Process(target=child, daemon=True) for _ in range(2)]\n"
    "    for kid in kids:\n"
    "        kid.start()\n"
    "    open(sys.argv[1], 'w').write(' '.join(str(kid.pid) for kid in kids))\n"
    "    time.sleep(1 if sys.argv[2] == 'exits' else 120)\n"
    "    os._exit(0)  # no atexit: multiprocessing does not end its daemonic children\n"
)


@pytest.mark.parametrize("ended", ["killed", "exits"])
def test_what_a_following_process_forked_ends_with_it_however_it_ends(tmp_path, ended):
    """The controller forks its schedulers (multiprocessing, fork); killed while they
    ran (or gone without ending them), its children were left with init as their parent and
    nothing to end them. The guard ends the follower's process group, which forked children
    stay in, once the follower is gone."""
    import os

    import psutil

    from kdist_magics.cluster.follow import command
    from kernel_driver import wait_gone

    (tmp_path / "kd_forker.py").write_text(FORKER)
    out = tmp_path / "kids.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    # as ipyparallel's launchers start the controller: a session of its own
    follower = subprocess.Popen(command("kd_forker") + [str(out), ended], env=env, start_new_session=True)
    kids = []
    try:
        deadline = time.monotonic() + 60
        while not out.exists() or not out.read_text():
            assert time.monotonic() < deadline and follower.poll() is None
            time.sleep(0.05)
        kids = [int(pid) for pid in out.read_text().split()]
        if ended == "killed":
            follower.kill()  # as a stop that gives up, or the OOM killer, would
        follower.wait(timeout=30)
        left, _ = wait_gone(kids, 10)
        assert not left, f"forked children left after their parent {ended}: {left}"
    finally:
        for pid in [follower.pid, *kids]:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def test_thread_variables_share_the_cores_and_give_ranks_that_outnumber_them_two_inter_op(monkeypatch):
    monkeypatch.setattr(lifecycle, "cpu_count", lambda: 4)
    assert lifecycle.threads_per_rank(2) == 2 and lifecycle.threads_per_rank(8) == 1
    assert lifecycle.threads_per_rank(8, chosen=3) == 3  # KDist.threads_per_rank wins
    assert lifecycle.thread_env(2, 2) == {
        "TF_NUM_INTRAOP_THREADS": "2",
        "OMP_NUM_THREADS": "2",
        "TF_NUM_INTEROP_THREADS": "2",
    }
    assert lifecycle.thread_env(4)["TF_NUM_INTEROP_THREADS"] == "2"  # at most 2
    assert lifecycle.thread_env(1, 4)["TF_NUM_INTEROP_THREADS"] == "1"  # a core each: one
    assert lifecycle.thread_env(1, 8)["TF_NUM_INTEROP_THREADS"] == "2"  # ranks outnumber cores: two


def test_a_run_sets_the_thread_rule_for_the_ranks_on_its_host(monkeypatch):
    monkeypatch.setattr(lifecycle, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if "THREADS" not in k})
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)  # not yet started on this "engine"
    from kdist_magics.strategies.engines.prepare import prepare_remote as _prepare_remote

    assert _prepare_remote({}, None, 4)["threads"] == "1"  # 4 ranks on 2 cores
    assert (os.environ["OMP_NUM_THREADS"], os.environ["TF_NUM_INTEROP_THREADS"]) == ("1", "2")
    _prepare_remote({}, None, 2)
    assert os.environ["TF_NUM_INTEROP_THREADS"] == "1"


def test_preload_imports_after_the_thread_variables_and_leaves_gpus_and_failures_to_the_run():
    code = (
        "import os, sys\nfrom kdist_magics.cluster.follow import preload\n"
        "said = preload(['wave', 'kd_no_such_module', 'json'], 2)\n"
        "print(said, '|', os.environ.get('TF_NUM_INTRAOP_THREADS'), os.environ.get('TF_NUM_INTEROP_THREADS'),"
        " 'wave' in sys.modules)"
    )

    def run(gpus):
        return subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": gpus},
        ).stdout.strip()

    # a failing import stops the preload there and says why; the run imports again and names it
    assert run("") == "kd_no_such_module failed: ModuleNotFoundError: No module named 'kd_no_such_module' | 2 2 True"
    # GPUs here: a rank's GPU is chosen as its run starts, so nothing is imported or set before
    assert run("0") == "skipped: GPUs here | None None False"


def test_an_owned_cluster_preloads_its_framework_and_beats_its_heart_often():
    from kdist_magics.cluster.launch import HEARTBEAT_MISSES, HEARTBEAT_MS, heartbeat_args
    from kdist_magics.cluster.launch import config as _following

    cluster = EngineCluster(4, preload=("tensorflow",))
    assert cluster.threads == max(1, lifecycle.cpu_count() // 4)  # the run's rule
    assert EngineCluster(4, preload=("tensorflow",), threads=3).threads == 3
    cmd = _following(preload=cluster.preload, threads=2, ranks=4).LocalEngineSetLauncher.engine_cmd
    assert cmd[cmd.index("--preload") + 1 : cmd.index("--preload") + 6] == [
        "tensorflow",
        "--threads",
        "2",
        "--ranks",
        "4",
    ]
    assert "--preload" not in _following().LocalEngineSetLauncher.engine_cmd
    # ipyparallel counts an engine registered at the first beat after its heart answered: a beat
    # each 0.25 s; an engine is dropped after the same 30 s of silence as ipyparallel's default
    assert heartbeat_args() == [
        f"--HeartMonitor.period={HEARTBEAT_MS}",
        f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
    ]
    assert HEARTBEAT_MS * HEARTBEAT_MISSES == 30_000


def test_a_local_engine_left_stopped_is_ended_and_its_death_says_why(monkeypatch):
    """A SIGSTOPped process reads as alive to a pid check; dead() ends it after FROZEN_AFTER."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from kdist_magics.cluster import cluster as cluster_mod, liveness

    monkeypatch.setattr(liveness, "FROZEN_AFTER", 0.5)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        c = EngineCluster(1)
        c.engines = [cluster_mod.EngineInfo(7, proc.pid, socket.gethostname())]
        assert c.dead() == {}
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.2)
        assert c.dead() == {}  # stopped for a moment: not yet
        time.sleep(0.5)
        why = {7: "was stopped (SIGSTOP) for 0 s while its peers waited for it; kdist ended it"}
        assert c.dead() == why  # ended now (SIGKILL): dead at this look, though not yet reaped
        assert proc.wait(10) == -signal.SIGKILL
        assert c.dead() == why
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stopped_engine_of_an_attached_cluster_counts_as_lost_but_is_never_ended(monkeypatch):
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from kdist_magics.cluster import cluster as cluster_mod, liveness

    monkeypatch.setattr(liveness, "FROZEN_AFTER", 0.3)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        c = EngineCluster(1, cluster_id="theirs")  # attached: somebody else's engines
        c.engines = [cluster_mod.EngineInfo(4, proc.pid, socket.gethostname())]
        os.kill(proc.pid, signal.SIGSTOP)
        assert c.dead() == {}
        deadline = time.monotonic() + 10
        while not (lost := c.dead()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lost[4].startswith("has been stopped (SIGSTOP) for 0 s") and f"kill -CONT {proc.pid}" in lost[4]
        time.sleep(0.2)
        assert proc.poll() is None  # still there, still stopped: kdist never ends it
    finally:
        proc.kill()
        proc.wait()


def test_the_guard_removes_the_push_names_of_a_kernel_that_died_and_of_its_own_process(tmp_path):
    """A kernel killed while a --push segment is named (kdist-<kernel pid>-*), or an
    engine that made segments for its host (kdist-<engine pid>-*), leaves nothing in /dev/shm:
    the guard that follows the engine removes both names once they are gone."""
    import os
    import sys

    import psutil

    from kernel_driver import wait_gone

    if not os.path.isdir("/dev/shm") or not hasattr(os, "pidfd_open"):
        pytest.skip("needs /dev/shm and pidfds (Linux)")
    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    names = [f"/dev/shm/kdist-{kernel.pid}-guardtest", f"/dev/shm/kdist-{engine.pid}-guardtest"]
    try:
        for name in names:
            open(name, "wb").close()
        started = psutil.Process(kernel.pid).create_time()
        guard = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kdist_magics.cluster.follow",
                "--guard",
                str(kernel.pid),
                repr(started),
                str(engine.pid),
            ],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        time.sleep(0.5)  # the guard waits on the kernel's pidfd
        kernel.kill()
        guard.wait(timeout=30)
        assert not wait_gone([engine.pid], 10)[0]  # the guard ended the engine
        assert [n for n in names if os.path.exists(n)] == []
    finally:
        for proc in (kernel, engine):
            proc.kill()
        for name in names:
            if os.path.exists(name):
                os.unlink(name)


@pytest.mark.timeout(60)
def test_stop_ends_the_controller_and_what_it_forked_by_pid_even_where_ipyparallels_stop_does_not():
    """Rehearsal 16: a Slurm start refused at once left its controller and schedulers running.
    stop() read the controller's pid after forgetting the ipyparallel cluster that names it, so
    only ipyparallel's own stop could end it, and a controller still starting can miss that.
    Here that stop does nothing: the controller (SIGTERM ignored, as one still starting may)
    and the child it forked end by pid all the same."""
    import psutil

    code = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if os.fork() == 0:\n"
        "    time.sleep(60); os._exit(0)\n"
        "print('up', flush=True); time.sleep(60)\n"
    )
    controller = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert controller.stdout.readline() == "up\n"
    forked = [p.pid for p in psutil.Process(controller.pid).children()]
    assert len(forked) == 1
    _stop_owned_cluster_of(controller.pid)
    assert controller.wait(timeout=10) is not None
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in forked)


@pytest.mark.timeout(60)
def test_stop_ends_what_the_controller_forked_after_its_tree_was_read():
    """make test, 4 Dec 2026: a Slurm start refused at once still left two schedulers. The
    controller was starting them when stop's SIGTERM came (ipyparallel sets its handler only
    after they start), so it died at once, and those it forked after stop read its tree were
    orphans no pid list named. They stay in the group the controller leads (as kdist's follow
    makes it): stop ends that group. Here the controller forks its child on SIGTERM itself."""
    import psutil

    code = (
        "import os, signal, sys, time\n"
        "def forks(*_):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60); os._exit(0)\n"
        "    open(sys.argv[1], 'w').close(); os._exit(1)\n"
        "signal.signal(signal.SIGTERM, forks)\n"
        "print('up', flush=True); time.sleep(60)\n"
    )
    marker = f"/tmp/kdist-forked-{os.getpid()}"
    controller = subprocess.Popen(
        [sys.executable, "-c", code, marker], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert controller.stdout.readline() == "up\n"
        _stop_owned_cluster_of(controller.pid)
        controller.wait(timeout=10)  # (stop reaped it: its status is gone)
        assert os.path.exists(marker)  # it forked as SIGTERM came
        deadline = time.monotonic() + 5
        while left := [p.pid for p in psutil.process_iter() if _in_group(p, controller.pid)]:
            assert time.monotonic() < deadline, f"left in the controller's group: {left}"
            time.sleep(0.05)
    finally:
        try:
            os.killpg(controller.pid, signal.SIGKILL)
        except OSError:
            pass
        if os.path.exists(marker):
            os.unlink(marker)


def _stop_owned_cluster_of(controller_pid: int) -> None:
    """EngineCluster.stop() on an owned cluster whose controller is process ``controller_pid``
    and whose ipyparallel stop reaches nothing."""
    c = EngineCluster(1)
    c.cluster = _FakeIpp([])
    c.cluster.controller = _Launcher(controller_pid)
    c.cluster.stop_cluster_sync = lambda: None  # ipyparallel's stop reaching nothing
    c.client = _FakeClient([])
    c.stop()


def _in_group(proc, pgid: int) -> bool:
    import psutil

    try:
        return os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False


def test_a_launchers_failed_start_stops_what_started_and_says_where_in_one_line():
    """Slurm's and Ray's clusters fail their start the same way: what started is stopped, a
    ClusterError keeps its own words, anything else is named with where the engines were to
    start (one line)."""
    from kdist_magics.cluster import launch
    from kdist_magics.errors import ClusterError

    class Started:
        n, stopped = 2, 0

        def stop(self):
            self.stopped += 1

    cluster = Started()
    said = ClusterError("Ray could not place 2 bundles")
    assert launch.start_failed(cluster, said, "on the Ray cluster at x:1") is said
    other = launch.start_failed(cluster, OSError("connection refused"), "as a Slurm job")
    assert str(other) == "could not start 2 engines as a Slurm job: OSError: connection refused"
    assert cluster.stopped == 2
