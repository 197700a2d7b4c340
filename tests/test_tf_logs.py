"""TensorFlow's Python INFO lines are quiet inside kdist cells, unless KDist.tf_info_logs.

Fast tier: the filter on the ``tensorflow`` logger (no TensorFlow needed). Kernel tier: through
``%%kdist``, with the logger set up as TF sets it in an interactive session (level INFO, its
own handler), a real TF INFO record from inside the cell is dropped, a warning kept, and the
setting brings INFO back.
"""

from __future__ import annotations

import logging

import pytest

from kdist_magics.watch.tf_logs import quiet_info


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, str]] = []

    def emit(self, record):
        self.seen.append((record.levelname, record.getMessage()))


@pytest.fixture
def tf_logger():
    """The ``tensorflow`` logger as TF leaves it in an interactive session: INFO, own handler."""
    logger = logging.getLogger("tensorflow")
    level, handler = logger.level, Collect()
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_info_dropped_inside_warnings_kept_and_all_back_after(tf_logger):
    log = logging.getLogger("tensorflow")
    with quiet_info():
        log.info("Reduce to /job:localhost/replica:0/task:0/device:CPU:0 then broadcast to (...)")
        log.warning("a real warning")
        log.setLevel(logging.INFO)  # TF sets its level at its first log call, maybe in the cell
        log.info("still dropped")
    log.info("after the cell")
    assert tf_logger.seen == [("WARNING", "a real warning"), ("INFO", "after the cell")]


def test_asked_for_info_stays(tf_logger):
    with quiet_info(quiet=False):
        logging.getLogger("tensorflow").info("kept")
    assert tf_logger.seen == [("INFO", "kept")]


CELL = """
import tensorflow as tf
tf.get_logger().info("Reduce to /job:localhost/replica:0/task:0/device:CPU:0 then broadcast to (x)")
tf.get_logger().warning("kdist-test warning")
"""


class SetsUpLoudly:
    """A strategy whose set-up logs at INFO before any cell runs (as MirroredStrategy's
    "Using MirroredStrategy with devices ..." does)."""

    in_kernel = True

    def run(self, cell, ctx):
        logging.getLogger("tensorflow").info("Using MirroredStrategy with devices (...)")
        return "ran"


def test_the_filter_covers_the_strategys_set_up(ip, tf_logger):
    import kdist_magics
    from kdist_magics.watch.record import RunRecord

    ext = kdist_magics._extension
    spec = ext.parse("--strategy default --no-dashboard")
    assert ext.execute(SetsUpLoudly(), "", spec, RunRecord("default", size=1, spec=spec)) == "ran"
    assert tf_logger.seen == []


@pytest.mark.kernel
def test_through_the_magic_and_the_setting(ip, tf_logger):
    ip.run_cell_magic("kdist", "--strategy default --no-dashboard", CELL)
    assert [lvl for lvl, _ in tf_logger.seen] == ["WARNING"]
    ip.run_line_magic("config", "KDist.tf_info_logs = True")
    ip.run_cell_magic("kdist", "--strategy default --no-dashboard", CELL)
    assert [lvl for lvl, _ in tf_logger.seen] == ["WARNING", "INFO", "WARNING"]


NOISE = ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard", "To enable the following")


@pytest.mark.kernel
@pytest.mark.parametrize("keep", [False, True])
def test_tensorflows_start_up_lines_are_quiet_in_a_kernel_with_kdist_unless_asked_for(keep, tmp_path):
    """TensorFlow's C++ start-up lines (absl's pre-init warning and oneDNN's twice,
    the CPU instruction list: 6-9 red lines) showed in a notebook's first TensorFlow cell, also
    a plain one's; TF_CPP_MIN_LOG_LEVEL=2 still left the oneDNN lines. With kdist loaded they
    are dropped, other output on that stream is kept; KDist.tf_info_logs brings them back."""
    pytest.importorskip("tensorflow", reason="TensorFlow's own start-up lines")
    from kernel_driver import Kernel, isolated_env, message_text

    env = isolated_env(tmp_path / "home")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env.pop("PYTEST_CURRENT_TEST", None)  # ipykernel forwards no file descriptor's output under pytest
    env["KERAS_BACKEND"] = "tensorflow"
    k = Kernel(cwd=tmp_path, env=env)
    try:
        if keep:
            k.check("%config KDist.tf_info_logs = True")
        res = k.check(
            "import os\nimport keras\nos.write(2, b'the cell\\'s own line\\n')\nprint(keras.backend.backend())"
        )
        k.check("import time; time.sleep(1)")  # a file descriptor's lines come in a moment later
        text = "".join(message_text(m) for m in k.messages)
        assert "tensorflow" in res.stdout and "the cell's own line" in text, text
        shown = [n for n in NOISE if n in text]
        assert (shown == []) if not keep else ("oneDNN custom operations" in shown), text
    finally:
        k.shutdown()


def test_a_cell_in_the_kernel_drops_tensorflows_known_run_noise_and_nothing_else(capfd):
    """While an in-kernel strategy trains, TensorFlow's C++ warns that the generator feeding
    fit() "will not be optimized", and now and then that a cancelled read aborted a rendezvous
    (W lines a newcomer sees in red, tests/test_notebooks.py): dropped from the process's stderr
    for the cell; every other line passes at once."""
    import os

    from kdist_magics.watch.tf_logs import quiet_info

    noise = (
        b"W0000 00:00:1796527275.780649   31910 dataset.cc:997] Input of GeneratorDatasetOp::"
        b"Dataset will not be optimized because the dataset does not implement the "
        b"AsGraphDefInternal() method needed to apply optimizations.\n"
    )
    cancelled = (  # now and then, as an epoch's iterator over the replicas is dropped (CI, 7 Dec)
        b"W0000 00:00:1796651863.890959   22258 local_rendezvous.cc:412] Local rendezvous is "
        b"aborting with status: CANCELLED: GetNextFromShard was cancelled\n"
        b"\t [[{{node MultiDeviceIteratorGetNextFromShard}}]]\n"
    )
    with quiet_info(True, stderr=True):
        os.write(2, noise)
        os.write(2, cancelled)
        os.write(2, b"E0000 a real error line\n\t [[{{node SomeOtherOp}}]]\n")
    os.write(2, noise)  # outside a kdist cell: as TensorFlow wrote it
    err = capfd.readouterr().err
    assert err.count("GeneratorDatasetOp") == 1 and "E0000 a real error line" in err
    assert "rendezvous" not in err and "MultiDeviceIterator" not in err
    assert "[[{{node SomeOtherOp}}]]" in err  # another op's line is a real error's context
    with quiet_info(False, stderr=True):  # %config KDist.tf_info_logs = True: everything
        os.write(2, noise)
    assert "GeneratorDatasetOp" in capfd.readouterr().err
