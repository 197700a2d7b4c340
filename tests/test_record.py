"""Fast tier: the run record that the dashboard and last_run() read."""

import pytest

from kdist_magics.watch.record import RunRecord


def test_rows_listeners_and_finish():
    seen = []
    rec = RunRecord("horovod", size=2)
    rec.subscribe(lambda kind, payload: seen.append(kind))
    rec.set_rank(0, state="running", host="h", pid=1)
    rec.set_rank(1, state="running", host="h", pid=2)
    rec.add("metric", {"rank": 0, "epoch": 0, "step": 1, "loss": 0.5})
    rec.add("sample", {"rank": 1, "time": 1.0, "cpu_percent": 50.0, "rss_bytes": 10})
    rec.add("progress", {"epochs": 3})
    rec.set_rank(0, state="done")
    rec.finish("done")
    assert seen == ["rank", "rank", "metric", "sample", "progress", "rank", "status"]
    assert rec.ranks[1].state == "done" and rec.ranks[0].state == "done"
    assert rec.status == "done" and rec.duration >= 0
    assert rec.progress == {"epochs": 3}
    assert "0.5" in rec.summary()


def test_failed_run_stops_the_other_ranks():
    rec = RunRecord("horovod", size=2)
    rec.set_rank(1, state="failed", error="boom")
    rec.finish("failed", "rank 1 failed")
    assert rec.ranks[1].state == "failed" and rec.ranks[0].state == "stopped"


def test_broken_listener_does_not_break_the_run():
    rec = RunRecord("default")
    rec.subscribe(lambda kind, payload: 1 / 0)
    rec.add("metric", {"loss": 1.0})
    assert len(rec.metrics) == 1


def test_unknown_row_kind():
    with pytest.raises(ValueError):
        RunRecord("default").add("weather", {})


def test_to_pandas():
    pd = pytest.importorskip("pandas", reason="pandas is an optional extra")
    rec = RunRecord("default")
    rec.add("metric", {"rank": 0, "loss": 1.0})
    rec.add("metric", {"rank": 0, "loss": 0.5})
    df = rec.to_pandas()
    assert isinstance(df, pd.DataFrame) and list(df["loss"]) == [1.0, 0.5]
    assert len(rec.to_pandas("ranks")) == 1
    with pytest.raises(ValueError):
        rec.to_pandas("nope")


def test_phases_follow_each_other_and_training_begins_with_the_first_metric_row():
    from kdist_magics.messages import PHASE_CELL, PHASE_TRAINING

    rec = RunRecord("horovod", size=2)
    seen = []
    rec.subscribe(lambda kind, payload: seen.append((kind, dict(payload) if kind == "phase" else None)))
    rec.phase("starting 2 engines")
    rec.phase_detail("1 of 2 registered")
    rec.phase("setting up Horovod")
    rec.phase(PHASE_CELL)
    rec.add("sample", {"rank": 0, "cpu": 1.0})  # not a metric: still running the cell
    assert rec.phases[-1]["name"] == PHASE_CELL
    rec.add("metric", {"rank": 0, "step": 1, "loss": 1.0})
    rec.add("metric", {"rank": 1, "step": 1, "loss": 1.0})
    rec.finish("done")
    names = [p["name"] for p in rec.phases]
    assert names == ["starting 2 engines", "setting up Horovod", PHASE_CELL, PHASE_TRAINING]
    assert rec.phases[0]["detail"] == "1 of 2 registered"
    assert all(p["ended"] is not None and p["ended"] >= p["started"] for p in rec.phases)
    assert rec.phases[-1]["ended"] == rec.ended
    for before, after in zip(rec.phases, rec.phases[1:]):
        assert before["ended"] == after["started"]
    phase_events = [p["name"] for kind, p in seen if kind == "phase"]
    assert phase_events == [
        "starting 2 engines",
        "starting 2 engines",
        "setting up Horovod",
        PHASE_CELL,
        PHASE_TRAINING,
    ]  # the detail is news too
    rec.phase_detail("late")  # after the end: nothing changes
    assert rec.phases[-1]["detail"] is None


def test_layout_of_a_run_that_has_none_says_why(capsys):
    """Last_run().layout() after a non-sharded or failed run returned None silently."""
    from kdist_magics.watch.record import RunRecord

    assert RunRecord("mirrored", size=2).layout() is None
    assert "this run was mirrored; only --strategy sharded runs have a layout" in capsys.readouterr().out
    failed = RunRecord("sharded", size=4)
    failed.finish("failed", "ValueError: ...")
    assert failed.layout() is None
    assert "this sharded run (failed) built no model to lay out" in capsys.readouterr().out
