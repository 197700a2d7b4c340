"""After the run: ``--tensorboard DIR`` event files and ``last_run().plot()`` (fast tier:
records fed the rows the telemetry sends; TensorBoard's own reader checks the files)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from kdist_magics import spec as specmod
from kdist_magics.watch import tensorboard as tb
from kdist_magics.watch.record import RunRecord


def _feed(rec: RunRecord, ranks: int = 2, epochs: int = 3, steps: int = 4) -> None:
    for r in range(ranks):
        for e in range(epochs):
            for b in range(steps):
                step = e * steps + b + 1
                rec.add(
                    "metric",
                    {
                        "rank": r,
                        "kind": "step",
                        "epoch": e,
                        "batch": b,
                        "step": step,
                        "time": 1000.0 + step,
                        "loss": 10.0 / step + r,
                        "accuracy": 0.1 * e,
                        "lr": 0.01,
                        "steps_per_s": 50.0,
                        "samples_per_s": None,
                        "step_time": 0.01,
                        "gap_time": 0.001,
                    },
                )
            rec.add(
                "metric",
                {
                    "rank": r,
                    "kind": "epoch",
                    "epoch": e,
                    "step": (e + 1) * steps,
                    "time": 1000.0 + (e + 1) * steps,
                    "loss": 1.0 / (e + 1),
                    "val_loss": 2.0 / (e + 1) + r,
                    "lr": 0.01,
                    "steps_per_s": 50.0,
                },
            )


def test_crc32c_is_the_castagnoli_checksum():
    assert tb.crc32c(b"123456789") == 0xE3069283  # the standard check value
    assert tb.crc32c(b"") == 0


def test_tensorboard_reads_every_rank_step_and_epoch_metric(tmp_path):
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="TensorBoard (the test extra) reads the files back",
    )
    rec = RunRecord("horovod", size=2)
    rec.add("metric", {"rank": 0, "kind": "step", "epoch": 0, "step": 0, "loss": 99.0})  # before
    events = tb.attach(rec, str(tmp_path / "tb"))
    _feed(rec)
    rec.finish("done")
    assert events.closed and sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["rank0", "rank1"]
    for r in (0, 1):
        acc = event_accumulator.EventAccumulator(str(tmp_path / "tb" / f"rank{r}"))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"loss", "accuracy", "lr", "steps_per_s", "epoch_loss", "epoch_val_loss"} <= tags
        assert not tags & {"step_time", "gap_time", "samples_per_s", "epoch_steps_per_s"}
        loss = acc.Scalars("loss")
        want = [(0, 99.0)] * (r == 0) + [(s, 10.0 / s + r) for s in range(1, 13)]
        assert [(e.step, e.value) for e in loss] == [(s, pytest.approx(v)) for s, v in want]
        val = acc.Scalars("epoch_val_loss")
        assert [(e.step, e.value) for e in val] == [(4 * (e + 1), pytest.approx(2.0 / (e + 1) + r)) for e in range(3)]
        assert loss[-1].wall_time == pytest.approx(1012.0)


def test_the_tensorboard_option_parses_and_needs_telemetry():
    spec = specmod.parse_line("--strategy horovod --np 2 --tensorboard /tmp/tb")
    assert spec.tensorboard == "/tmp/tb"
    with pytest.raises(UsageError, match="drop --no-telemetry"):
        specmod.parse_line("--tensorboard /tmp/tb --no-telemetry")


def test_plot_draws_each_rank_validation_points_and_a_log_axis():
    matplotlib = pytest.importorskip("matplotlib", reason="plot() draws with matplotlib (test extra)")
    matplotlib.use("Agg")
    rec = RunRecord("horovod", size=2)
    _feed(rec)
    rec.finish("done")
    ax = rec.plot()
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["rank 0", "rank 1", "rank 0 val_loss", "rank 1 val_loss"]
    assert list(ax.get_lines()[1].get_ydata()) == pytest.approx([10.0 / s + 1 for s in range(1, 13)])
    assert ax.get_yscale() == "log"  # 10.0 down to 0.67: more than a decade
    assert rec.plot("accuracy", log=False).get_yscale() == "linear"
    smoothed = rec.plot(smooth=True).get_lines()
    assert len(smoothed) == 6 and smoothed[0].get_alpha() == 0.25  # raw, faded, under each line
    with pytest.raises(ValueError, match="there are: .*accuracy.*loss"):
        rec.plot("auc")
