"""Fast tier: the waits outside the cell (strategies/engines/waiting.py) and the phase barrier (faults.py),
with fake results and a fake cluster (no engines, no TensorFlow)."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest

from kdist_magics.rank import faults
from kdist_magics.cluster.cluster import EngineInfo
from kdist_magics.errors import ControllerDied, KDistError, RankDied
from kdist_magics.strategies.engines import waiting


class FakeResult:
    """An AsyncResult that becomes ready at ``at`` (monotonic) with ``value`` or ``error``."""

    def __init__(self, at: float = 0.0, value=None, error: Exception | None = None):
        self.at, self.value, self.error = at, value, error

    def ready(self) -> bool:
        return time.monotonic() >= self.at

    def successful(self) -> bool:
        return self.error is None

    def get(self, timeout=None):
        if not self.ready():
            raise TimeoutError
        if self.error is not None:
            raise self.error
        return self.value


class FakeCluster:
    def __init__(self, n=2, owned=True):
        self.owned = owned
        self.engines = [EngineInfo(10 + i, 1000 + i, "here") for i in range(n)]
        self.deaths: dict[int, str] = {}
        self.controller: str | None = None

    def dead(self, settle=False):
        return dict(self.deaths)

    def controller_gone(self):
        return self.controller


def run_on(cluster, ctx=None, collective_values=False):
    """The run in progress on ``cluster`` (what every wait is given)."""
    from kdist_magics.strategies.engines.run import EngineRun

    run = EngineRun(SimpleNamespace(collective_values=collective_values), "", ctx)
    run.cluster = cluster
    return run


def test_gather_returns_every_result_in_order():
    s = run_on(FakeCluster())
    soon = time.monotonic() + 0.1
    assert waiting.gather(s, [FakeResult(soon, "a"), FakeResult(0, "b")], [0, 1], 5, "while x") == ["a", "b"]
    assert s.restart is None


def test_an_engine_dying_while_waiting_is_rankdied_naming_the_rank_and_the_phase():
    cluster = FakeCluster()
    s = run_on(cluster)
    never = FakeResult(time.monotonic() + 60)
    threading.Timer(0.2, lambda: cluster.deaths.update({11: "was killed by SIGKILL"})).start()
    t0 = time.monotonic()
    with pytest.raises(RankDied) as info:
        waiting.gather(s, [never, never], [1, 0], 30, "while Horovod started")  # engine 11 is rank 0
    assert time.monotonic() - t0 < 10  # at once, not at the 30 s bound
    assert info.value.deaths == {0: "was killed by SIGKILL"}
    assert str(info.value).startswith("While Horovod started: rank 0 was killed by SIGKILL. The cell did not run")
    assert s.restart


def test_on_an_attached_cluster_the_error_promises_no_restart_kdist_would_not_do():
    cluster = FakeCluster(owned=False)
    cluster.deaths = {11: "was killed by SIGKILL"}
    with pytest.raises(RankDied) as info:
        waiting.check(run_on(cluster), [0, 1], "while Horovod started")
    text = str(info.value)
    assert text.startswith("While Horovod started: rank 1 was killed by SIGKILL. The cell did not run; ")
    assert (
        "restart the cluster's engines (kdist restarts no cluster it did not start), then run the cell again" in text
        and "engines restart with" not in text
    )
    cluster.deaths, cluster.controller = {}, "has ended (pid 4242, on this host)"
    with pytest.raises(ControllerDied) as info:
        waiting.check(run_on(cluster), [0, 1], "after the cell, while its values came back", ran=True)
    text = str(info.value)
    assert text.startswith(
        "After the cell, while its values came back: the cluster's ipyparallel "
        "controller has ended (pid 4242, on this host). The cell had run on every rank; "
    )
    assert (
        "start the cluster again (kdist restarts no cluster it did not start), then run the cell again" in text
        and "starts a new cluster" not in text
    )


def test_deaths_of_engines_outside_the_mapping_do_not_count():
    cluster = FakeCluster()
    cluster.deaths = {11: "exited with status 3"}  # rank 1, lost earlier (or not needed here)
    s = run_on(cluster)
    assert waiting.gather(s, [FakeResult(0, "v")], {10: 0}, 5, "after the cell", ran=True) == ["v"]


def test_the_controller_ending_is_controllerdied_and_says_the_cell_had_run():
    cluster = FakeCluster()
    cluster.controller = "was killed by SIGKILL"
    s = run_on(cluster)
    with pytest.raises(ControllerDied) as info:
        waiting.gather(
            s, [FakeResult(time.monotonic() + 60)], {10: 0}, 30, "after the cell, while its values came back", ran=True
        )
    assert str(info.value).startswith(
        "After the cell, while its values came back: the ipyparallel "
        "controller was killed by SIGKILL. The cell had run on every rank"
    )


class EngineError(Exception):
    """ipyparallel's word for a request on an engine that died (as its RemoteError names it)."""

    ename = "EngineError"


def test_an_engine_error_before_the_death_shows_waits_for_it_and_names_the_death():
    """The controller can unregister an engine (ipyparallel then fails its requests with
    EngineError) a moment before its process is seen ended: the wait looks again, and the
    death is named, not ipyparallel's error."""
    cluster = FakeCluster()
    s = run_on(cluster)
    threading.Timer(0.6, lambda: cluster.deaths.update({11: "was killed by SIGKILL"})).start()
    died = FakeResult(0, error=EngineError("Engine 11 died while running task 'x_42'"))
    with pytest.raises(RankDied) as info:
        waiting.gather(s, [FakeResult(0, "a"), died], [0, 1], 30, "while the engines were prepared")
    assert info.value.deaths == {1: "was killed by SIGKILL"}
    cluster.deaths = {}
    threading.Timer(0.6, lambda: cluster.deaths.update({10: "was killed by SIGKILL"})).start()
    with pytest.raises(RankDied, match="^While the engines were asked what they hold: rank 0 was killed"):
        with waiting.named_deaths(s, [0, 1], "while the engines were asked what they hold"):
            raise EngineError("Engine 10 died")


def test_an_engine_error_whose_death_never_shows_is_raised_as_itself_after_the_wait(monkeypatch):
    monkeypatch.setattr(waiting, "DEATH_SHOWS_WITHIN", 0.5)
    s = run_on(FakeCluster())
    t0 = time.monotonic()
    with pytest.raises(EngineError):
        with waiting.named_deaths(s, [0, 1], "while x"):
            raise EngineError("Engine 10 died")
    assert time.monotonic() - t0 >= 0.5
    with pytest.raises(RuntimeError):  # any other error is raised at once
        with waiting.named_deaths(s, [0, 1], "while x"):
            raise RuntimeError("boom")
    assert s.restart is None


def test_setup_results_stops_at_the_first_failure_and_names_who_waits():
    s = run_on(FakeCluster())
    err = RuntimeError("no module named horovod")
    t0 = time.monotonic()
    with pytest.raises(KDistError) as info:
        waiting.setup_results(
            s,
            [FakeResult(time.monotonic() + 60), FakeResult(0, error=err)],
            [0, 1],
            "Horovod",
            "the rendezvous",
            30,
            "hvd.init() failed",
        )
    assert time.monotonic() - t0 < 10
    assert str(info.value) == (
        "hvd.init() failed: rank 1: RuntimeError: no module named horovod (rank 0 left waiting for it)"
    )
    assert s.restart == "Horovod failed to start"


def test_setup_results_that_never_come_name_the_rank_and_what_to_reach():
    s = run_on(FakeCluster(1))
    with pytest.raises(KDistError, match="did not start on rank 0 within 0.3 s: can every engine reach x"):
        waiting.setup_results(s, [FakeResult(time.monotonic() + 60)], [0], "jax", "x", 0.3, "failed")


def test_the_phase_barrier_holds_only_when_armed_and_says_where(tmp_path, monkeypatch):
    faults.hold("init")  # not armed: returns at once
    monkeypatch.setenv("KDIST_HOLD_DIR", str(tmp_path))
    faults.hold("init")  # no file for this phase: returns at once
    (tmp_path / "init").touch()
    cluster = SimpleNamespace(processes=lambda: {"controller": 5, "launched": [6], "engines": [6]})
    done = threading.Event()
    t = threading.Thread(target=lambda: (faults.hold("init", cluster, addresses=["h:1"]), done.set()))
    t.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "init.held").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    facts = json.loads((tmp_path / "init.held").read_text())
    assert facts["phase"] == "init" and facts["controller"] == 5 and facts["engines"] == [6]
    assert facts["addresses"] == ["h:1"]
    time.sleep(0.2)
    assert not done.is_set()  # held while the file is there
    (tmp_path / "init").unlink()
    t.join(10)
    assert done.is_set()


def test_a_death_while_the_value_comes_back_is_named_not_replaced_by_a_stale_rendering(monkeypatch):
    from kdist_magics.strategies.engines import results

    cluster = FakeCluster()
    never = FakeResult(time.monotonic() + 60)
    cluster.client = {10: SimpleNamespace(apply_async=lambda fn, *args: never)}
    ctx = SimpleNamespace(spec=SimpleNamespace(pull=()), shell=None)
    s = run_on(cluster, ctx)
    shown = []
    monkeypatch.setattr("IPython.display.publish_display_data", lambda *a, **k: shown.append(a))
    threading.Timer(0.2, lambda: cluster.deaths.update({10: "was killed by SIGKILL"})).start()
    with pytest.raises(RankDied, match="^After the cell, while its values came back: rank 0 was killed"):
        results.pull(
            s, {0: cluster.engines[0], 1: cluster.engines[1]}, {"execution_count": 3, "data": {"text/plain": "2"}}
        )
    assert not shown


def test_ipyparallels_error_for_an_engine_already_gone_becomes_its_death():
    cluster = FakeCluster()
    cluster.deaths = {11: "was killed by SIGKILL"}
    s = run_on(cluster)
    with pytest.raises(RankDied, match="^While setting up Horovod: rank 1 was killed by SIGKILL"):
        with waiting.named_deaths(s, [0, 1], "while setting up Horovod"):
            raise KeyError(11)  # client[11] once the controller has unregistered it
    cluster.deaths = {}
    with pytest.raises(KeyError):  # no death behind it: the error itself
        with waiting.named_deaths(s, [0, 1], "while setting up Horovod"):
            raise KeyError(11)


def test_a_name_error_for_a_notebook_name_that_was_not_pushed_names_the_push():
    """Forgetting --push gave "NameError: name 'x_train' is not defined" on every rank
    while x_train was in the notebook, with no word of --push."""
    from types import SimpleNamespace

    from kdist_magics.errors import RankFailed
    from kdist_magics.strategies.engines.hints import missing_push

    def err(name, value):
        return SimpleNamespace(ename=name, evalue=value)

    missing = {
        0: err("NameError", "name 'x_train' is not defined"),
        1: err("NameError", "name 'x_train' is not defined"),
    }
    hint = missing_push(missing, {"x_train": [1]}, None)
    assert hint.startswith("'x_train' is in the notebook, not on the engines: add --push x_train")
    assert missing_push(missing, {}, None) is None  # not the notebook's either: the user's typo
    assert missing_push(missing, {"x_train": [1]}, ("x_train",)) is None  # pushed: another cause
    assert missing_push({0: err("ValueError", "bad")}, {"x_train": [1]}, None) is None
    failed = RankFailed(missing)
    failed.hint = hint
    assert failed._render_traceback_()[0].splitlines()[1] == hint  # under the first line
