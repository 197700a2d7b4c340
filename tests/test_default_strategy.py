"""Kernel tier: --strategy default runs the cell in the notebook's namespace, end to end."""

import pytest

import kdist_magics
from kdist_magics.errors import CellFailed

from conftest import run_cell

pytestmark = pytest.mark.kernel

TRAIN = """
import numpy as np, keras
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ np.array([1., -2., 0.5, 3.], dtype="float32"))[:, None]
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(x, y, epochs=3, batch_size=16, verbose=0)
in_scope = type(strategy).__name__
history.history["loss"][-1]
"""


def test_default_strategy_trains_in_notebook_namespace(ip):
    value = ip.run_cell_magic("kdist", "--strategy default --no-dashboard", TRAIN)
    ns = ip.user_ns
    assert "model" in ns and "history" in ns and "strategy" in ns
    import tensorflow as tf

    assert ns["strategy"] is tf.distribute.get_strategy()
    losses = ns["history"].history["loss"]
    assert losses[-1] < losses[0]
    assert value == losses[-1]  # the cell's last expression is the magic's value
    rec = kdist_magics.last_run()
    assert rec.strategy == "default" and rec.status == "done"
    assert rec.ranks[0].state == "done"
    # telemetry: 4 steps x 3 epochs, step rows throttled (the last step of every epoch is
    # always sent), plus 3 epoch rows, all rank 0
    steps = [m for m in rec.metrics if m["kind"] == "step"]
    epochs = [m for m in rec.metrics if m["kind"] == "epoch"]
    assert 3 <= len(steps) <= 12 and {4, 8, 12} <= {m["step"] for m in steps}
    assert len(epochs) == 3
    assert {m["rank"] for m in rec.metrics} == {0}
    assert epochs[-1]["loss"] == pytest.approx(losses[-1])


def test_last_expression_is_shown_like_a_plain_cell(ip, capsys):
    run_cell(ip, "%%kdist -s default --no-dashboard\n21 * 2")
    assert "42" in capsys.readouterr().out


def test_user_error_is_the_users_traceback(ip, capsys):
    with pytest.raises(CellFailed) as info:
        ip.run_cell_magic("kdist", "-s default --no-dashboard", "x = 1\nraise ValueError('bad data')")
    assert isinstance(info.value.original, ValueError)
    assert info.value._render_traceback_() == []  # shown once, by the inner cell
    out = capsys.readouterr()
    assert "bad data" in out.out + out.err
    rec = kdist_magics.last_run()
    assert rec.status == "failed" and rec.ranks[0].state == "failed"
    # the next cell works
    assert ip.run_cell_magic("kdist", "-s default --no-dashboard", "1 + 1") == 2


FAILS_IN_FIT = """
import numpy as np, keras
class Boom(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        raise ValueError("bad batch")
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.ones((8, 2)), np.ones((8, 1)), epochs=1, verbose=0, callbacks=[Boom()])
"""


def test_a_failure_inside_fit_shows_no_kdist_frame(ip, capsys):
    """kdist wraps ``fit`` (telemetry); its frame is hidden (``__tracebackhide__``)."""
    with pytest.raises(CellFailed):
        ip.run_cell_magic("kdist", "-s default --no-dashboard", FAILS_IN_FIT)
    shown = capsys.readouterr()
    text = shown.out + shown.err
    assert "bad batch" in text and "on_train_batch_end" in text
    assert "kdist_magics" not in text, text[-2000:]


def test_fit_is_restored_after_the_cell(ip):
    import keras

    before = keras.Model.fit
    ip.run_cell_magic("kdist", "-s default --no-dashboard", "pass")
    assert keras.Model.fit is before


def test_syntax_error_reported_once(ip, capsys):
    with pytest.raises(CellFailed) as info:
        ip.run_cell_magic("kdist", "-s default --no-dashboard", "def broken(:\n  pass")
    assert isinstance(info.value.original, SyntaxError)
    out = capsys.readouterr()
    assert (out.out + out.err).count("SyntaxError") == 1


def test_observe_runs_sees_every_new_record_and_its_rows(ip):
    """The public hook for tools and tests: each run's record before it starts, rows as they land."""
    seen, rows = [], []
    stop = kdist_magics._extension.observe_runs(
        lambda record: (seen.append(record), record.subscribe(lambda kind, row: rows.append(kind)))
    )
    try:
        ip.run_cell_magic("kdist", "--strategy default --no-dashboard", TRAIN)
    finally:
        stop()
    assert seen == [kdist_magics.last_run()] and "metric" in rows
    ip.run_cell_magic("kdist", "--strategy default --no-dashboard", "1 + 1")
    assert len(seen) == 1  # stopped
