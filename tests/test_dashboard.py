"""The dashboard: a view of the RunRecord (fast tier), its wiring into %%kdist (kernel tier)
and a 2-rank Horovod run filling metrics and samples for both ranks (engines tier)."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

import kdist_magics
from kdist_magics.watch.dashboard import WIDGET_MIME, Dashboard, DashboardWidget, svg_curves
from kdist_magics.watch.record import RunRecord


pytestmark = pytest.mark.notf  # also in .venv-colab-tpu: no TensorFlow (tests/README.md)


def feed(rec, rank, steps, t0=1000.0, total=None, loss0=1.0, **extra):
    rec.add(
        "progress",
        {
            "rank": rank,
            "epochs": 2,
            "steps_per_epoch": (total or steps) // 2,
            "total_steps": total or steps,
            "fit_started": t0,
            "step": 0,
            "time": t0,
        },
    )
    for s in range(1, steps + 1):
        rec.add(
            "metric",
            {
                "rank": rank,
                "epoch": 0,
                "step": s,
                "time": t0 + s,
                "kind": "step",
                "loss": loss0 / s,
                "accuracy": s / steps,
                "lr": 0.01,
                "steps_per_s": 1.0,
                "samples_per_s": 32.0,
                **extra,
            },
        )
        rec.add("progress", {"rank": rank, "step": s, "time": t0 + s, "fit_started": t0})


def sample(rank, **extra):
    row = {
        "rank": rank,
        "time": 1.0,
        "pid": 100 + rank,
        "host": "h",
        "cpu_percent": 50.0,
        "cpu_count": 2,
        "rss_bytes": 2**20,
        "pss_bytes": 2**19,
        "gpus": [],
        "accelerator": None,
        "accelerator_note": "not available: NVML sees no GPU",
    }
    row.update(extra)
    return row


def test_snapshot_has_ranks_curves_progress_and_eta():
    rec = RunRecord("horovod", size=2)
    rec.set_rank(0, state="running", host="h", pid=100)
    rec.set_rank(1, state="running", host="h", node="Ray node 5f0c1a2b3c4d", pid=101)
    dash = Dashboard(rec, interval=None, clock=lambda: 1010.0)
    timings = {"batch_size": 32, "step_time": 0.5, "gap_time": 0.01, "collective_time": 0.1}
    feed(rec, 0, 10, total=40, **timings)
    feed(rec, 1, 10, total=40, loss0=2.0, **timings)
    rec.add("sample", sample(0))
    rec.add(
        "sample",
        sample(1, gpus=[{"index": 1, "name": "G", "util_percent": 80.0, "mem_used_bytes": 1, "mem_total_bytes": 4}]),
    )
    state, curves = dash.snapshot()
    json.dumps(state), json.dumps(curves)
    assert [r["rank"] for r in state["ranks"]] == [0, 1]
    r0, r1 = state["ranks"]
    assert r0["state"] == "running" and r0["cpu_percent"] == 50.0 and r0["rss_bytes"] == 2**20
    assert r0["pss_bytes"] == 2**19  # the memory shown: shared pages split between processes
    assert r0["accelerator_note"].startswith("not available")
    assert r1["gpus"][0]["util_percent"] == 80.0 and r1["loss"] == pytest.approx(0.2)
    # where a scheduler placed a rank is said beside its host, live and in the saved view
    assert r0["node"] is None and r1["node"] == "Ray node 5f0c1a2b3c4d"
    assert "<td>h · Ray node 5f0c1a2b3c4d</td>" in dash.html() and "<td>h</td>" in dash.html()
    # curves: loss first, one line per rank, x = step
    assert curves["names"][0] == "loss" and "accuracy" in curves["names"] and "lr" in curves["names"]
    assert sorted(curves["names"]) == ["accuracy", "loss", "lr"]  # timings and the batch are no curves
    assert set(curves["series"]["loss"]) == {"0", "1"}
    assert curves["series"]["loss"]["1"][-1] == [10, 0.2, 0]  # [step, value, epoch]
    # progress: 10 of 40 steps after 10 s -> 30 s to go; throughput summed over ranks
    p = state["progress"]
    assert p["fraction"] == 0.25 and p["total_steps"] == 40 and p["eta_s"] == pytest.approx(30.0)
    assert p["samples_per_s"] == 64.0
    assert state["status"] == "running" and state["error"] is None


def test_progress_follows_the_slowest_rank():
    rec = RunRecord("horovod", size=2)
    dash = Dashboard(rec, interval=None, clock=lambda: 1010.0)
    feed(rec, 0, 10, total=40)
    feed(rec, 1, 6, total=40)
    state, _ = dash.snapshot()
    assert state["progress"]["step"] == 6 and state["progress"]["fraction"] == 0.15
    assert [r["step"] for r in state["ranks"]] == [10, 6]
    assert state["ranks"][0]["total_steps"] == 40


def test_updates_are_coalesced_into_few_sends():
    rec = RunRecord("default")
    dash = Dashboard(rec, interval=None)
    sent = []
    dash.widget.observe(lambda change: sent.append(change["name"]), names=["state"])
    assert dash.flush() is False  # nothing new since the first state
    feed(rec, 0, 500)
    assert dash.flush() is True and dash.flush() is False
    assert len(sent) == 1  # 1000+ record events, one front-end update
    curves_sent = []
    dash.widget.observe(lambda change: curves_sent.append(1), names=["curves_json"])
    rec.add("sample", sample(0))
    assert dash.flush() is True and curves_sent == []  # a sample alone: state only
    assert dash.widget.state["ranks"][0]["cpu_percent"] == 50.0
    rec.add("sample", sample(0, cpu_percent=None, rss_bytes=2**21))  # no CPU window
    dash.flush()
    assert dash.widget.state["ranks"][0]["cpu_percent"] == 50.0  # the last reading stays
    assert dash.widget.state["ranks"][0]["rss_bytes"] == 2**21
    assert len(dash.curves["series"]["loss"]["0"]) <= dash.max_points
    assert json.loads(dash.widget.curves_json) == dash.curves  # what the front end gets


def test_long_curves_are_downsampled_keeping_the_last_point():
    rec = RunRecord("default")
    dash = Dashboard(rec, interval=None, max_points=50)
    feed(rec, 0, 5000)
    _, curves = dash.snapshot()
    line = curves["series"]["loss"]["0"]
    assert len(line) <= 50 and line[-1][0] == 5000 and line[0][0] == 1
    assert len(dash.series["loss"][0]) <= 8 * 50 + 1  # memory stays bounded too


def test_background_thread_pushes_while_the_caller_is_busy():
    rec = RunRecord("default")
    dash = Dashboard(rec, interval=0.05)
    seen = threading.Event()
    threads = set()

    def on_state(change):
        if change["new"].get("progress", {}).get("step"):
            threads.add(threading.current_thread().name)
            seen.set()

    dash.widget.observe(on_state, names=["state"])
    feed(rec, 0, 5)  # no flush() call from this thread
    assert seen.wait(30)
    assert "kdist-dashboard" in threads
    rec.finish("done")
    assert dash._thread is not None and not dash._thread.is_alive()
    assert dash.widget.state["status"] == "done" and dash.widget.state["running"] is False


@pytest.mark.parametrize("status", ["failed", "interrupted", "timeout"])
def test_failed_and_stopped_states_carry_the_error_line(status):
    rec = RunRecord("horovod", size=2)
    dash = Dashboard(rec, interval=None)
    rec.set_rank(0, state="running")
    if status == "failed":
        rec.set_rank(1, state="failed", error="Traceback ...\nValueError: bad batch")
        rec.finish("failed", "rank 1 failed:\nValueError: bad batch")
    else:
        rec.finish(status, f"{status} after 3 s")
    state = dash.widget.state  # finish() flushed the final state
    assert state["status"] == status and not state["running"]
    if status == "failed":
        assert state["error"] == "ValueError: bad batch"
        assert [r["state"] for r in state["ranks"]] == ["stopped", "failed"]
        assert state["ranks"][1]["error"].endswith("ValueError: bad batch")
    else:
        assert state["error"] == f"{status} after 3 s"
    assert status in dash.html()


def test_lost_telemetry_is_said_in_the_widget_the_static_summary_and_the_record():
    rec = RunRecord("horovod", size=2)
    dash = Dashboard(rec, interval=None)
    rec.add("metric", {"rank": 0, "epoch": 0, "step": 1, "time": 1.0, "kind": "step", "loss": 1.0})
    assert Dashboard(rec, interval=None).snapshot()[0]["lost_batches"] == 0
    assert "lost" not in dash.html() and "lost" not in rec.summary()
    rec.note_lost_batches(3)
    rec.finish("done")
    assert dash.widget.state["lost_batches"] == 3
    assert "3 telemetry batches lost in transit" in dash.html()
    assert "3 telemetry batches lost" in rec.summary()
    js = (Path(kdist_magics.__file__).parent / "watch" / "static" / "dashboard.js").read_text()
    assert "st.lost_note" in js and "lost in transit" not in js  # the words come from Python
    assert dash.widget.state["lost_note"] == rec.summary().split("; ")[-1]


def test_a_sharded_run_shows_its_mesh_in_the_widget_and_the_static_view():
    rec = RunRecord("sharded", size=4)
    rec.mesh = (1, 4)
    dash = Dashboard(rec, interval=None)
    rec.finish("done")
    assert dash.widget.state["mesh"] == "1x4"
    assert "<b>kdist sharded</b>, mesh 1x4 &middot;" in dash.html()
    other = Dashboard(RunRecord("mirrored", size=2), interval=None)
    assert other.snapshot()[0]["mesh"] is None and "mesh" not in other.html()


def _timed_steps(rec, rank, step_s, gap_s, n=12):
    for s in range(1, n + 1):
        rec.add(
            "metric",
            {
                "rank": rank,
                "epoch": 0,
                "step": s,
                "time": 1000.0 + s,
                "kind": "step",
                "loss": 1.0 / s,
                "steps_per_s": 1 / (step_s + gap_s),
                "step_time": step_s,
                "gap_time": gap_s,
            },
        )


def test_each_ranks_step_split_is_a_bar_live_and_in_the_static_view_and_a_probe_splits_it():
    rec = RunRecord("horovod", size=2)
    for r in (0, 1):
        rec.set_rank(r, state="running")
    dash = Dashboard(rec, interval=None)
    _timed_steps(rec, 0, 0.030, 0.002)
    _timed_steps(rec, 1, 0.040, 0.010)  # rank 1: a slow input pipeline (the rest)
    state, _ = dash.snapshot()
    assert [r["split"] for r in state["ranks"]] == [{"in_step": 0.03, "rest": 0.002}, {"in_step": 0.04, "rest": 0.01}]
    assert "inside the step" in state["split_legend"]
    assert "the collective is not separable live here" in state["split_legend"]
    page = dash.html()
    assert page.count('fill="#7e57c2"') == 2 and page.count('fill="#bdbdbd"') == 2  # in step, rest
    assert "<th>step split</th>" in page
    assert "in step 40 ms &middot; rest 10 ms" in page and "inside the step" in page
    # the same cell after %kdist scale measured a rank's compute alone: 25 ms
    probed = RunRecord("horovod", size=2)
    probed.probe_compute_s = 0.025
    probed.set_rank(0, state="running")
    dash = Dashboard(probed, interval=None)
    _timed_steps(probed, 0, 0.030, 0.002)
    state, _ = dash.snapshot()
    assert state["ranks"][0]["split"] == {"compute": 0.025, "communication": 0.005, "rest": 0.002}
    assert state["split_legend"].startswith("each rank's mean step: compute (its 1-rank step")
    assert "communication (inferred" in state["split_legend"]
    assert "communication inferred: the collective is not separable live" in probed.split()[0]["source"]
    assert "compute 25 ms &middot; communication 5 ms &middot; rest 2 ms" in dash.html()
    assert probed.split()[0]["communication_s"] == pytest.approx(0.005)


def test_a_timed_collective_shows_communication_and_the_wait_for_slower_ranks_in_the_bar():
    rec = RunRecord("horovod", size=2)
    for r in (0, 1):
        rec.set_rank(r, state="running")
    dash = Dashboard(rec, interval=None)
    for r, (step_s, collective_s) in enumerate([(0.019, 0.009), (0.019, 0.003)]):
        for step in range(1, 6):
            rec.add(
                "metric",
                {
                    "rank": r,
                    "kind": "step",
                    "step": step,
                    "time": float(step),
                    "loss": 1.0,
                    "step_time": step_s,
                    "gap_time": 0.002,
                    "collective_time": collective_s,
                },
            )
    state, _ = dash.snapshot()
    assert state["ranks"][0]["split"] == {"compute": 0.01, "communication": 0.003, "wait": 0.006, "rest": 0.002}
    assert state["ranks"][1]["split"]["wait"] == 0.0
    assert "the all-reduce, timed on every rank" in state["split_legend"]
    page = dash.html()
    assert "compute 10 ms &middot; communication 3 ms &middot; wait for slower ranks 6 ms" in page
    assert 'fill="#ffb74d"' in page


def test_a_run_whose_steps_are_not_timed_live_says_so_instead_of_a_bar():
    rec = RunRecord("multiworker", size=1)  # Keras on JAX: rows without step_time
    rec.set_rank(0, state="running")
    dash = Dashboard(rec, interval=None)
    feed(rec, 0, 5)
    state, _ = dash.snapshot()
    assert state["ranks"][0]["split"] is None
    assert state["split_legend"].startswith("step split: not timed live: Keras on JAX")
    assert "<th>step split</th>" not in dash.html() and "not timed live" in dash.html()
    assert Dashboard(RunRecord("default", size=1), interval=None).snapshot()[0]["split_legend"] == ""


def test_in_kernel_replicas_share_the_process_sample():
    rec = RunRecord("mirrored", size=2)
    rec.set_rank(0, state="running", device="GPU:0")
    rec.set_rank(1, state="running", device="GPU:1")
    dash = Dashboard(rec, interval=None)
    gpus = [{"index": i, "util_percent": 10.0 * (i + 1), "mem_used_bytes": 1, "mem_total_bytes": 2} for i in range(2)]
    rec.add("sample", sample(0, gpus=gpus, accelerator="gpu"))
    state, _ = dash.snapshot()
    r0, r1 = state["ranks"]
    assert r0["shared"] is False and r1["shared"] is True
    assert [g["index"] for g in r1["gpus"]] == [1]  # each replica shows its own GPU
    assert r1["pid"] == 100


def test_display_bundle_has_widget_and_static_fallback(monkeypatch):
    displayed = []
    import IPython.display

    class Handle:
        def update(self, obj, raw=False):
            displayed.append(("update", obj))

    def fake_display(obj, raw=False, display_id=None):
        displayed.append(("display", obj))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    rec = RunRecord("default")
    dash = Dashboard(rec, interval=None).display()
    model_id = dash.widget.model_id
    feed(rec, 0, 20)
    rec.finish("done")
    (first_kind, first), (last_kind, last) = displayed[0], displayed[-1]
    assert first_kind == "display" and last_kind == "update"
    assert first[WIDGET_MIME]["model_id"] == model_id
    # finished: the same display holds no widget any more, and the widget is closed
    assert WIDGET_MIME not in last and dash.widget.comm is None
    shown = last["text/html"].split("<script>")[0]  # the state and the summary, not the script
    assert "waiting" not in shown and "done" in shown
    polyline = re.search(r'<polyline[^>]*points="([^"]+)"', shown)
    assert polyline and len(polyline.group(1).split()) == 20  # the static picture of the loss
    assert "done" in last["text/plain"]


def test_the_finished_view_carries_the_widgets_script_and_its_final_state():
    """What the export's browser test draws: the widget's own module inlined as a classic
    script (no ``export`` left, nothing from the web), the final state as JSON that cannot end
    its ``<script>``, and the static summary beside it for pages that run no script."""
    from kdist_magics.watch.offline import finished_view

    rec = RunRecord("default")
    dash = Dashboard(rec, interval=None)
    feed(rec, 0, 12)
    rec.finish("failed", error="ValueError: </script><b>x</b> & NaN")
    state, curves = dash.snapshot()
    state["elapsed"] = float("nan")  # JSON.parse takes no NaN: it travels as null
    view = finished_view(state, curves)
    data = re.search(r'<script type="application/json" class="kdist-data">(.*?)</script>', view, re.S).group(1)
    assert "</" not in data and json.loads(data)["state"]["error"].startswith("ValueError: </script>")
    assert json.loads(data)["state"]["elapsed"] is None
    assert json.loads(data)["curves"] == json.loads(json.dumps(curves))
    script = view.rsplit("<script>", 1)[1]
    assert "\nexport " not in script and "function render(" in script
    assert "http" not in script.replace("http://www.w3.org/2000/svg", "")
    assert 'class="kdist-static"' in view and "<polyline" in view
    ids = re.findall(r'id="(kdist-offline-[0-9a-f]+)"', view + finished_view(state, curves))
    assert len(set(ids)) == 2  # two finished runs in one page never share an id


def test_static_svg_one_line_per_rank():
    svg = svg_curves({"0": [[1, 1.0], [2, 0.5]], "1": [[1, 2.0], [2, 1.0]]})
    assert svg.count("<polyline") == 2 and svg.startswith("<svg")
    assert svg_curves({}) == ""


def test_widget_ships_its_static_front_end():
    from kdist_magics.watch.offline import STATIC

    js = (STATIC / "dashboard.js").read_text()
    assert "export default" in js and "http" not in js.replace("http://www.w3.org/2000/svg", "")
    assert (STATIC / "dashboard.css").read_text().strip()
    assert DashboardWidget._esm and DashboardWidget._css


# -- wiring into %%kdist (kernel tier) ------------------------------------------------------

TRAIN = """
import numpy as np, keras
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
model.fit(x, y, epochs=2, batch_size=16, verbose=0)
"""


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_kdist_cell_shows_dashboard_and_fills_metrics_and_samples(ip, monkeypatch):
    shown = []
    import kdist_magics.watch.dashboard as dashmod

    real_show = dashmod.show
    monkeypatch.setattr(dashmod, "show", lambda record, **kw: shown.append(real_show(record, **kw)))
    ip.run_cell_magic("kdist", "--strategy default", TRAIN)
    rec = kdist_magics.last_run()
    assert len(shown) == 1 and shown[0].record is rec
    state = shown[0].widget.state
    assert state["status"] == "done" and state["ranks"][0]["state"] == "done"
    assert state["progress"]["fraction"] == 1.0 and state["progress"]["total_steps"] == 8
    assert {"loss", "mae"} <= set(json.loads(shown[0].widget.curves_json)["names"])
    # last_run(): metrics with lr/throughput, samples from the sampler, pandas tables
    epochs = [m for m in rec.metrics if m["kind"] == "epoch"]
    assert len(epochs) == 2 and all(m["lr"] == pytest.approx(0.05) for m in epochs)
    assert len(rec.samples) >= 2 and all(s["rank"] == 0 and s["rss_bytes"] > 0 for s in rec.samples)
    df = rec.to_pandas("samples")
    assert {"rank", "time", "cpu_percent", "rss_bytes"} <= set(df.columns)


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_no_dashboard_and_no_telemetry(ip, monkeypatch):
    import kdist_magics.watch.dashboard as dashmod

    shown = []
    monkeypatch.setattr(dashmod, "show", lambda record, **kw: shown.append(record))
    ip.run_cell_magic("kdist", "--strategy default --no-dashboard", TRAIN)
    assert shown == [] and kdist_magics.last_run().metrics
    ip.run_cell_magic("kdist", "--strategy default --no-telemetry", TRAIN)
    rec = kdist_magics.last_run()
    assert shown == [] and rec.metrics == [] and rec.samples == []


# -- two Horovod ranks (engines tier) ----------------------------------------------------------


def _strategy_ready(name: str) -> str | None:
    from kdist_magics.strategies import REGISTRY

    if name not in REGISTRY:
        return f"--strategy {name} is not in strategies.REGISTRY yet"
    try:
        from kdist_magics.strategies import create

        create(name)
    except Exception as exc:  # module not there yet, or not built here
        return f"--strategy {name} cannot be created here: {exc}"
    return None


HVD_TRAIN = """
import numpy as np, keras
x = np.random.default_rng(hvd.rank()).normal(size=(256, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
import time
class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.02)
model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[Slow()])
"""


@pytest.mark.engines
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_rank_horovod_run_fills_metrics_and_samples_for_both_ranks(ip):
    reason = _strategy_ready("horovod")
    if reason:
        pytest.skip(reason)
    ip.run_cell_magic("kdist", "--strategy horovod --np 2 --no-dashboard", HVD_TRAIN)
    rec = kdist_magics.last_run()
    assert rec.status == "done"
    assert {r: s.state for r, s in rec.ranks.items()} == {0: "done", 1: "done"}
    assert all(s.pid and s.host for s in rec.ranks.values())
    assert {m["rank"] for m in rec.metrics} == {0, 1}
    for rank in (0, 1):
        epochs = [m for m in rec.metrics if m["rank"] == rank and m["kind"] == "epoch"]
        last_step = max(m["step"] for m in rec.metrics if m["rank"] == rank)
        # every row a rank sent arrives, the last ones too (2 epochs x 16 steps)
        assert len(epochs) == 2 and last_step == 32, (
            f"rank {rank}: {len(epochs)} epoch rows, last step {last_step}: the rows a rank "
            f"sends in its last moments did not reach the record"
        )
        assert isinstance(epochs[-1]["loss"], float)
    assert {s["rank"] for s in rec.samples} == {0, 1}
    assert all(s["rss_bytes"] > 0 for s in rec.samples)
    pids = {s["rank"]: s["pid"] for s in rec.samples}
    assert pids[0] != pids[1]  # one process per rank
    # every numbered telemetry batch of both ranks arrived (none lost before listening)
    assert kdist_magics.last_run().lost_batches == 0


# -- a saved notebook keeps a static picture (notebook tier) ---------------------------------


def test_an_elastic_run_that_lost_a_rank_shows_the_world_size_and_the_lost_rank():
    rec = RunRecord("horovod", size=4)
    dash = Dashboard(rec, interval=None)
    state = dash.snapshot()[0]
    assert (state["world_size"], state["resize_note"]) == (4, "")
    rec.note_resize([1], 3, error="process was killed by SIGKILL")
    rec.finish("done")
    state = dash.snapshot()[0]
    assert state["world_size"] == 3 and state["size"] == 4
    assert state["resize_note"] == (
        "elastic: world size 4 \u2192 3, rank 1 lost; the others went on from the last commit"
    )
    assert [r["state"] for r in state["ranks"]][1] == "lost"  # finish() leaves it lost
    assert state["resize_note"] in _unescape(dash.html())
    assert "world size 4 \u2192 3 (lost rank 1)" in rec.summary()
    js = (Path(kdist_magics.__file__).parent / "watch" / "static" / "dashboard.js").read_text()
    assert "st.resize_note" in js and "st.world_size" in js and "went on" not in js
    css = (Path(kdist_magics.__file__).parent / "watch" / "static" / "dashboard.css").read_text()
    assert ".kdist-badge.kdist-lost" in css


def _unescape(text):
    import html

    return html.unescape(text)


def test_before_training_the_dashboard_says_which_phase_the_run_is_in():
    now = [1000.0]
    rec = RunRecord("horovod", size=2)
    dash = Dashboard(rec, interval=None, clock=lambda: now[0])
    rec.phase("starting 2 engines")
    rec.phases[-1]["started"] = 1000.0
    rec.phase_detail("1 of 2 registered")
    now[0] = 1003.5
    state = dash.snapshot()[0]
    assert state["phase"] == {"name": "starting 2 engines", "detail": "1 of 2 registered", "elapsed": 3.5}
    assert state["phases"] == [["starting 2 engines", 3.5]]
    rec.phase("setting up Horovod")
    rec.finish("done")
    state = dash.snapshot()[0]
    assert state["phase"] is None and [n for n, _ in state["phases"]] == ["starting 2 engines", "setting up Horovod"]
    assert "starting 2 engines" in dash.html()
    js = (Path(kdist_magics.__file__).parent / "watch" / "static" / "dashboard.js").read_text()
    assert "st.phase" in js and "st.phases" in js and "registered" not in js  # words from Python


def test_a_sharded_run_shows_what_each_device_holds():
    """Once the sharded cell's model exists (the layout table), the dashboard says each device's
    share: the weights and the optimizer state on it (all logical CPU devices share one process,
    so no memory reading could say it)."""
    from kdist_magics.strategies.sharded.layout import LayoutTable

    rec = RunRecord("sharded", size=2)
    rec.mesh = (1, 2)
    dash = Dashboard(rec, interval=None)
    assert dash.snapshot()[0]["layout_note"] == ""  # no model yet
    rec.layout_table = LayoutTable(
        (1, 2),
        rows=[
            {"variable": "d1/kernel", "shape": [512, 512], "spec": "(-, model)", "bytes_per_device": 512 * 256 * 4},
            {"variable": "d1/bias", "shape": [512], "spec": "replicated", "bytes_per_device": 512 * 4},
        ],
        optimizer_bytes=2 * (512 * 256 * 4 + 512 * 4),
    )
    rec.finish("done")
    state = dash.snapshot()[0]
    assert state["layout_note"] == rec.layout_table.per_device_words()
    assert state["layout_note"].startswith("per device: weights ") and ", optimizer state " in state["layout_note"]
    assert state["layout_note"] in _unescape(dash.html())  # the saved, static view too
    js = (Path(kdist_magics.__file__).parent / "watch" / "static" / "dashboard.js").read_text()
    assert "st.layout_note" in js and "optimizer state" not in js  # the words come from Python


def _displayed(monkeypatch) -> list:
    import IPython.display

    displayed = []

    class Handle:
        def update(self, obj, raw=False):
            displayed.append(("update", obj))

    monkeypatch.setattr(
        IPython.display,
        "display",
        lambda obj, raw=False, display_id=None: displayed.append(("display", obj)) or Handle(),
    )
    return displayed


def test_a_cell_that_trained_nothing_looks_finished(monkeypatch):
    """5 of notebook 03's 6 dashboards (cells with no fit) stayed on "waiting for
    fit()..." with an empty loss chart after they had finished."""
    displayed = _displayed(monkeypatch)
    rec = RunRecord("horovod", size=2)
    dash = Dashboard(rec, interval=None).display()
    assert dash.snapshot()[0]["idle_note"] == ""  # running: it may yet train
    rec.finish("done")
    state = dash.snapshot()[0]
    assert state["idle_note"] == "finished: this cell trained nothing (no fit())"
    assert "trained nothing" in displayed[-1][1]["text/html"]  # the static view says so too
    trained = RunRecord("horovod", size=2)
    feed(trained, 0, 5)
    trained.finish("done")
    assert Dashboard(trained, interval=None).snapshot()[0]["idle_note"] == ""


def test_a_cell_that_never_began_leaves_no_dashboard(monkeypatch):
    """A cell refused before it ran (DevicesFixed, StrategyUnavailable) drew a
    "failed, 0/4 ranks" dashboard beside its one line "The cell did not run."."""
    displayed = _displayed(monkeypatch)
    rec = RunRecord("mirrored", size=4)
    Dashboard(rec, interval=None).display()
    rec.finish("not run", "StrategyUnavailable: ... The cell did not run.")
    assert displayed[-1] == ("update", {"text/plain": ""})


@pytest.mark.kernel
def test_a_refused_cell_finishes_its_record_as_not_run(ip, monkeypatch):
    import kdist_magics.watch.dashboard as dashmod
    from kdist_magics.errors import StrategyUnavailable
    from kdist_magics.strategies.kernel.tpu import TPUStrategy

    shown = []
    real_show = dashmod.show
    monkeypatch.setattr(dashmod, "show", lambda record, **kw: shown.append(real_show(record, **kw)))
    ext = kdist_magics._extension
    ext._strategies["tpu"] = TPUStrategy(find=lambda: None)
    try:
        with pytest.raises(StrategyUnavailable):
            ip.run_cell_magic("kdist", "--strategy tpu", "pass")
    finally:
        ext._strategies.pop("tpu")
    assert kdist_magics.last_run().status == "not run" and shown[0]._finished


def test_the_chart_says_what_a_training_point_is(monkeypatch):
    """The loss line steps down at each epoch boundary because each point is Keras'
    running mean of the epoch so far; notebook 01 called it "the loss after every step". The
    widget and the static view say what is plotted."""
    displayed = _displayed(monkeypatch)
    rec = RunRecord("default")
    dash = Dashboard(rec, interval=None).display()
    feed(rec, 0, 10)
    rec.finish("done")
    note = dash.snapshot()[0]["curves_note"]
    assert "running mean over the epoch so far" in note and "steps down where an epoch begins" in note
    assert "running mean over the epoch so far" in displayed[-1][1]["text/html"]


@pytest.mark.notebook
@pytest.mark.browser
@pytest.mark.timeout(600)
def test_an_executed_notebook_exported_to_html_shows_the_finished_dashboard_offline(tmp_path, test_output):
    """A handout as a teacher makes one: ``jupyter nbconvert --execute``, then ``--to html``,
    the page opened in Chromium with the network cut. The finished run's output holds no
    widget (nbclient saves the closed widget's state, which nothing shows), and the page draws
    the dashboard from that output alone: the loss chart with its log and smoothing toggles and
    hover, validation points, badges, phases, the step split. With scripts off, the static
    summary's SVG is there instead."""
    import subprocess
    import sys

    import chromium
    from test_browser import TRAIN as PACED, assert_readable_curves, check_curves

    chromium.require()
    nbformat = pytest.importorskip("nbformat", reason="nbformat is in the test extra")
    from playwright.sync_api import sync_playwright

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext kdist_magics"),
        nbformat.v4.new_code_cell("%%kdist --strategy default\n" + PACED),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "fresh.ipynb")

    def convert(*args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "jupyter", "nbconvert", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    convert("--to", "notebook", "--execute", "--output", "saved", "fresh.ipynb")
    saved = nbformat.read(tmp_path / "saved.ipynb", as_version=4)
    shown = [o for o in saved.cells[1].outputs if o.get("output_type") == "display_data"]
    assert [sorted(o["data"]) for o in shown] == [["text/html", "text/plain"]], shown
    (test_output / "dashboard-saved.ipynb").write_text(nbformat.writes(saved))
    convert("--to", "html", "--output", "handout", "saved.ipynb")
    page_url = (tmp_path / "handout.html").as_uri()

    def cut(route):  # nbconvert's page links MathJax and require.js from a CDN: refused
        return route.continue_() if route.request.url.startswith("file:") else route.abort()

    with sync_playwright() as pw:
        browser = chromium.launch(pw)
        try:
            context = browser.new_context(offline=True, viewport={"width": 1300, "height": 1100})
            context.route("**/*", cut)
            page = context.new_page()
            page.goto(page_url)
            page.wait_for_selector(".kdist-dashboard[data-status='done']", timeout=30_000)
            dash = page.locator(".kdist-dashboard")
            assert dash.count() == 1 and not page.locator(".kdist-static").first.is_visible()
            assert dash.locator(".kdist-rank .kdist-badge.kdist-done").count() == 1
            assert dash.locator(".kdist-progress .kdist-bar-text").inner_text().startswith("epoch 5/5")
            phases = dash.locator(".kdist-phases").inner_text()
            assert "running the cell" in phases and "training" in phases, phases
            split = dash.locator(".kdist-split .kdist-bar-text").all_inner_texts()
            assert len(split) == 1 and split[0].startswith("in step "), split
            dash.screenshot(path=str(test_output / "dashboard-exported.png"))
            assert_readable_curves(check_curves(page, dash), ranks=1, epochs=5)
            context.close()

            plain = browser.new_context(offline=True, java_script_enabled=False)
            page = plain.new_page()
            page.goto(page_url)
            assert page.locator(".kdist-dashboard").count() == 0
            static = page.locator(".kdist-static")
            assert static.is_visible() and static.locator("polyline").count() == 1
            assert "done" in static.inner_text()
            plain.close()
        finally:
            browser.close()


TPU_CHIPS = [
    {
        "index": i,
        "name": f"TPU chip {i}",
        "source": "libtpu monitoring SDK",
        "duty_cycle_percent": 87.5 + i,
        "mem_used_bytes": 3 * 2**30,
        "mem_total_bytes": 16 * 2**30,
    }
    for i in range(2)
]


def _tpu_run():
    """A finished run whose rank sampled two TPU chips (as libtpu's SDK reports them)."""
    rec = RunRecord("tpu", size=1)
    rec.set_rank(0, state="running", host="h", pid=100, device="TPU:0")
    dash = Dashboard(rec, interval=None)
    feed(rec, 0, 6)
    rec.add("sample", sample(0, accelerator="tpu", accelerator_note=None, tpus=TPU_CHIPS))
    rec.set_rank(0, state="done")
    rec.finish("done")
    return dash


def test_the_static_view_shows_each_tpu_chips_figures_and_their_source():
    """The saved view (what an HTML export, GitHub and nbviewer show) says what the live bars
    say: each chip's duty cycle and high-bandwidth memory, and where the figures came from."""
    html = _tpu_run().html()
    assert "<th>accelerators</th>" in html
    assert "TPU0 88% duty cycle, HBM 3.00 GiB / 16.00 GiB" in html
    assert "TPU1 88% duty cycle" in html or "TPU1 89% duty cycle" in html
    assert "(TPU figures: libtpu monitoring SDK)" in html
    plain = Dashboard(RunRecord("default", size=1), interval=None).html()
    assert "accelerators" not in plain  # a CPU-only run: no empty column


@pytest.mark.browser
@pytest.mark.timeout(120)
def test_the_live_view_draws_each_tpu_chips_bars_and_names_their_source():
    """static/dashboard.js, rendered in Chromium from the state the kernel sends: a duty-cycle
    bar and an HBM bar per chip, and the line naming where the TPU figures came from."""
    import chromium
    from kdist_magics.watch.offline import STATIC

    chromium.require()
    from playwright.sync_api import sync_playwright

    state, curves = _tpu_run().snapshot()
    page_html = (
        '<div id="el"></div><script type="module">\n'
        'import dashboard from "/dashboard.js";\n'
        f"const state = {json.dumps(state)}, curves = {json.dumps(json.dumps(curves))};\n"
        'const model = {get: k => k === "state" ? state : curves, on() {}, off() {}};\n'
        'dashboard.render({model, el: document.getElementById("el")});\n'
        "window.kdistDrawn = true;\n</script>"
    )
    with sync_playwright() as pw:
        browser = chromium.launch(pw)
        try:
            page = browser.new_page()
            page.route("http://kdist.test/", lambda r: r.fulfill(body=page_html, content_type="text/html"))
            page.route(
                "http://kdist.test/dashboard.js",
                lambda r: r.fulfill(body=(STATIC / "dashboard.js").read_text(), content_type="text/javascript"),
            )
            page.goto("http://kdist.test/")
            page.wait_for_function("window.kdistDrawn === true", timeout=30_000)
            text = page.inner_text("#el")
        finally:
            browser.close()
    assert "TPU0" in text and "TPU1" in text and "% duty cycle" in text, text
    assert "HBM0" in text and "3.0 GiB / 16.0 GiB" in text.replace("3.00", "3.0").replace("16.00", "16.0"), text
    assert "TPU figures: libtpu monitoring SDK" in text
