"""Fast tier: the run record that the dashboard and last_run() read."""

import pytest

from kdist_magics.record import RunRecord


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
