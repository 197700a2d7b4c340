"""Failures through a real kernel: what a notebook sees when a rank raises, dies, hangs, is
interrupted, when options or cells are bad; sockets, secrets and leftover processes.

One IPython kernel started with jupyter_client (``python3`` = this Python, isolated
IPYTHONDIR/JUPYTER_* dirs) and one warm ``--np 2`` Horovod cluster serve the module;
everything is checked through execute requests and the IOPub messages the notebook gets.
Times are not asserted (a shared 2-core machine); ``benchmarks/failure_times.py``
measures them. Tests that break the engines come after those that keep them; the module
ends by shutting its kernel down and checking that nothing it started is left.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip(
    "horovod.tensorflow",
    reason="Horovod is not installed here (make test builds it into .venv; the Colab-pinned .venv-colab has none, as Colab has none)",
)
pytest.importorskip("ipyparallel", reason="ipyparallel is a core dependency")
pytest.importorskip("jupyter_client", reason="jupyter_client drives the kernel")
psutil = pytest.importorskip("psutil", reason="processes and sockets are counted with psutil")

from kernel_driver import LOOPBACK, Kernel, connection_keys, wait_gone  # noqa: E402

pytestmark = [pytest.mark.engines, pytest.mark.horovod, pytest.mark.slow, pytest.mark.timeout(600)]

HVD = "%%kdist --strategy horovod --np 2 --no-dashboard"
LINGER = 120  # generous: an ipyparallel nanny may linger ~30 s after stop_cluster


def one_error(res):
    assert res.status == "error", res.text[-2000:]
    assert len(res.errors) == 1, [e["ename"] for e in res.errors]
    return res.errors[0]


@pytest.fixture(scope="module")
def kern(tmp_path_factory):
    """The module's kernel, with warm engines; shut down (and checked) at the end."""
    k = Kernel(cwd=tmp_path_factory.mktemp("nb"))
    try:
        k.check("import kdist_magics")
        k.check(f"{HVD}\nkd_warm = hvd.rank()", timeout=300)
        yield k
    finally:
        k.shutdown()
        left, _ = wait_gone(k.seen_pids, LINGER)
        k.cleanup()
        assert not left, f"still running after kernel shutdown: {left}"


KEYS: set[str] = set()  # every cluster key the module's kernel had (clusters restart)


@pytest.fixture(autouse=True)
def _collect_keys(request):
    yield
    if "kern" in request.fixturenames:
        KEYS.update(connection_keys(request.getfixturevalue("kern").env))


def engine_pids(k):
    """Pids of the horovod strategy's engines, read in the kernel."""
    return set(k.eval("sorted(e.pid for e in kdist_magics._extension._strategies['horovod'].cluster.engines)"))


# -- 5. bad input: nothing starts ---------------------------------------------------------
BAD_LINES = [
    "--np 0",
    "--np two",
    "--timeout -1",
    "--timeout 0",
    "--strategy nope",
    "--out everyone",
    "--push 1x",
    "--pull a,,class",
    "--bogus",
    "--strategy mirrored --np 2",
    "--strategy horovod --devices 2",
    "--np 2 'unbalanced",
]


def test_bad_options_are_one_short_usage_error_and_start_nothing(tmp_path):
    k = Kernel(cwd=tmp_path)  # a fresh kernel: no engines yet, so "nothing started" is visible
    try:
        before = set(k.children())
        for line in BAD_LINES:
            res = k.execute(f"%%kdist {line}\nkd_ran = True")
            reply = res.reply["content"]
            # IPython shows a UsageError as one short stderr line, no traceback, and the
            # execute reply carries ename UsageError (the cell is marked failed)
            assert reply["status"] == "error" and reply["ename"] == "UsageError", (line, reply)
            assert reply["evalue"] and len(reply["evalue"]) < 300 and reply["evalue"].count("\n") <= 2, (line, reply)
            assert not res.errors, (line, res.errors)  # no error output with traceback frames
            assert res.stderr.startswith("UsageError: ") and res.stderr.count("UsageError") == 1, (line, res.stderr)
            assert "Traceback" not in res.text and "File " not in res.text, (line, res.text)
            assert set(k.children()) <= before, (line, k.children())  # no controller, no engines
        assert k.eval("'kd_ran' in globals()") is False
        # an in-kernel strategy's failing cell: the user's own traceback, as one error output
        res = k.execute("%%kdist --strategy default --no-dashboard\ndef f():\n    return 1 / 0\nf()", timeout=240)
        err = one_error(res)
        assert err["ename"] == "ZeroDivisionError" and "return 1 / 0" in res.text, err
        assert res.reply["content"]["status"] == "error"
    finally:
        k.shutdown()
        wait_gone(k.seen_pids, 30)
        k.cleanup()


# -- sockets and secrets during a run ------------------------------------------------------
def test_every_listening_socket_of_the_kernel_tree_is_loopback_during_a_run(kern):
    import threading
    import time

    seen: set[tuple[int, str, int]] = set()
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            seen.update(kern.listening())
            time.sleep(0.2)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        kern.check(
            f"{HVD}\nimport time, tensorflow as tf, horovod.tensorflow as hcore\n"
            "for _ in range(5):\n    hcore.allreduce(tf.ones(2)); time.sleep(0.3)"
        )
    finally:
        stop.set()
        t.join()
    pids = {p for p, _, _ in seen}
    assert kern.pid in pids or len(pids) >= 2, seen  # the controller's and Gloo's listeners at least
    assert len(pids) >= 2, seen
    exposed = sorted((p, ip, port) for p, ip, port in seen if ip not in LOOPBACK)
    assert not exposed, exposed


def test_no_output_ever_contains_the_cluster_key(kern):
    keys = connection_keys(kern.env)
    assert keys, "the running cluster's connection files were not found"
    kern.check("%kdist status")
    for msg in kern.messages:  # every IOPub message of the session so far
        text = repr(msg.get("content", {}))
        assert not any(key in text for key in keys), msg["header"]["msg_type"]


# -- 1. a rank raises ----------------------------------------------------------------------
def test_a_rank_raising_is_one_error_naming_rank_type_message_and_its_traceback(kern):
    pids = engine_pids(kern)
    res = kern.execute(
        f"{HVD}\nimport time\nkd_progress = 'started'\n"
        "def load_shard(r):\n    if r == 1:\n        raise ValueError('bad data on one rank')\n"
        "load_shard(hvd.rank())\ntime.sleep(120)"
    )
    err = one_error(res)
    assert err["ename"] == "RankFailed"
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err["traceback"]))
    assert "rank 1" in err["evalue"] and "ValueError" in err["evalue"] and "bad data on one rank" in err["evalue"]
    assert "traceback on rank 1" in tb and "load_shard" in tb and "raise ValueError" in tb, tb
    assert tb.count("rank 1: ValueError: bad data on one rank") == 1  # the head, once
    assert tb.rstrip().endswith("ValueError: bad data on one rank")  # the rank's own last line
    kern.check(f"{HVD}\nkd_after = kd_progress")
    assert kern.eval("kdist_magics.last_run().status") == "done"
    assert engine_pids(kern) == pids  # same warm engines


def test_forgetting_push_is_said_under_the_ranks_name_error(kern):
    """A name the notebook has, used on the ranks without --push."""
    kern.check("kd_train = [1, 2, 3]")
    err = one_error(kern.execute(f"{HVD}\nprint(len(kd_train))"))
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err["traceback"]))
    assert err["ename"] == "RankFailed" and "name 'kd_train' is not defined" in err["evalue"]
    assert "'kd_train' is in the notebook, not on the engines: add --push kd_train" in tb, tb
    kern.check(f"{HVD} --push kd_train\nkd_n = len(kd_train)")  # as the line says: it runs


# -- 5. syntax error, --pull missing name -------------------------------------------------
def test_syntax_error_is_reported_once_and_no_engine_runs(kern):
    kern.check(f"{HVD}\nkd_marker = 'before'")
    res = kern.execute(f"{HVD}\nkd_marker = 'after'\nif True print(1)")
    err = one_error(res)
    assert err["ename"] == "SyntaxError"
    assert "\n".join(err["traceback"]).count("SyntaxError") == 1 and "if True print(1)" in res.text
    assert not res.stdout.strip() and "rank" not in res.text
    assert kern.check(f"{HVD}\nkd_marker").value() == "'before'"


def test_pull_of_a_missing_name_is_clear_and_engines_keep_state(kern):
    res = kern.execute(f"{HVD} --pull kd_total,kd_missing\nkd_total = 3 * (hvd.rank() + 1)\nkd_kept = 1")
    err = one_error(res)
    assert "kd_missing" in err["evalue"] and "--pull" in err["evalue"], err
    assert len(err["traceback"]) <= 2, err["traceback"]  # a short error, no kdist internals
    res = kern.execute(f"{HVD} --pull kd_gen\nkd_gen = (i for i in range(3))")
    err = one_error(res)
    assert "kd_gen" in err["evalue"] and "cannot travel" in err["evalue"], err
    kern.check("kd_local_gen = (i for i in range(3))")
    res = kern.execute(f"{HVD} --push kd_local_gen\nkd_kept = 'overwritten'")
    err = one_error(res)
    assert "--push" in err["evalue"] and "kd_local_gen" in err["evalue"] and "cannot travel" in err["evalue"], err
    # a cell that assigns `_` itself does not make the value of a later cell stale
    assert kern.check(f"{HVD}\nfor _ in range(3):\n    pass\n(kd_total, kd_kept)").value() == "(3, 1)"
    assert kern.check(f"{HVD}\nkd_kept + 1").value() == "2"


# -- 3. a rank hangs ---------------------------------------------------------------------
def test_timeout_names_the_busy_rank_and_engines_stay_usable(kern):
    pids = engine_pids(kern)
    res = kern.execute(
        f"{HVD} --timeout 5\nimport time\nkd_t = 'in'\ntime.sleep(600 if hvd.rank() == 0 else 0)", timeout=240
    )
    err = one_error(res)
    assert err["ename"] == "RunTimedOut" and "still busy: rank 0" in err["evalue"], err
    assert "rank 1" not in err["evalue"]
    assert kern.check(f"{HVD}\nkd_t").value() == "'in'"
    assert engine_pids(kern) == pids


# -- 4. interrupt ------------------------------------------------------------------------
INTERRUPTED_FIT = """
import keras, numpy as np
X = np.random.default_rng(0).normal(size=(256, 8)).astype('float32')
class Mark(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 0:
            print(f'kd-epoch {epoch + 1}', flush=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss='mse')
model.fit(X, X.sum(1), batch_size=8, epochs=10000, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Mark()])
"""


def assert_interrupted(kern, res, epochs: int) -> None:
    """What a notebook sees after Stop: one line (an Interrupted, a KeyboardInterrupt, with no
    traceback through kdist), every rank stopped, and the record keeps at least ``epochs``
    finished epochs."""
    err = one_error(res)
    assert err["ename"] == "Interrupted" and len(err["traceback"]) == 1, err
    assert "Stop: " in err["traceback"][0] and "stopped" in err["traceback"][0], err
    assert "interrupted; stopping every rank" in res.stdout
    assert kern.eval("kdist_magics.last_run().status") == "interrupted"
    assert kern.eval("sorted({r.state for r in kdist_magics.last_run().ranks.values()})") == ["stopped"]
    done = kern.eval("len([m for m in kdist_magics.last_run().metrics if m.get('kind') == 'epoch'])")
    assert done >= epochs, done


def test_kernel_interrupt_stops_all_ranks_keeps_history_and_checkpoint(kern, tmp_path):
    kern.check("%config KDist.stop_grace = 30.0")  # a loaded test machine may be slow to stop
    asked = {}  # interrupt once rank 0 ends its 3rd epoch: epochs 1-2 are then fully recorded
    # (history, telemetry, checkpoint); the 3rd epoch's own callbacks may still be running

    def on_message(msg, res):
        if "at" not in asked and msg["header"]["msg_type"] == "stream" and "kd-epoch 3" in msg["content"]["text"]:
            import time

            asked["at"] = time.monotonic()
            kern.interrupt()  # the notebook's Stop button

    try:
        res = kern.execute(f"{HVD} --checkpoint {tmp_path}\n{INTERRUPTED_FIT}", timeout=300, on_message=on_message)
    finally:
        kern.check("%config KDist.stop_grace = 5.0")
    assert "at" in asked, res.text[-2000:]
    assert_interrupted(kern, res, epochs=2)
    assert (tmp_path / "last.keras").exists()
    import keras

    assert keras.saving.load_model(tmp_path / "last.keras").count_params() == 9  # a whole archive
    # the next cell works; rank 0 still holds the model and its history so far
    res = kern.check(f"{HVD} --pull model\nlen(model.history.history['loss'])")
    assert int(res.value()) >= 2
    assert kern.eval("type(model).__name__") == "Sequential"


def test_stop_during_kdist_run_stops_every_rank_of_the_script(kern, tmp_path):
    """``%kdist run`` takes a cell's path: Stop stops every rank of a script as of a cell."""
    script = tmp_path / "train.py"
    script.write_text("import horovod.tensorflow.keras as hvd\n\nhvd.init()\n" + INTERRUPTED_FIT)
    asked = {}

    def on_message(msg, res):
        if "at" not in asked and msg["header"]["msg_type"] == "stream" and "kd-epoch 2" in msg["content"]["text"]:
            asked["at"] = True
            kern.interrupt()

    res = kern.execute(
        f"%kdist run --strategy horovod --np 2 --no-dashboard {script}", timeout=300, on_message=on_message
    )
    assert "at" in asked, res.text[-2000:]
    assert_interrupted(kern, res, epochs=1)
    assert kern.check(f"{HVD}\nhvd.size()").value() == "2"  # the next cell runs


MW = "%%kdist --strategy multiworker --np 2 --no-dashboard"
MW_INTERRUPTED_FIT = """
import numpy as np, keras
X = np.random.default_rng(0).normal(size=(256, 8)).astype('float32')
class Mark(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if strategy.cluster_resolver.task_id == 0:
            print(f'kd-mw-epoch {epoch + 1}', flush=True)
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss='mse')
model.fit(X, X.sum(1), batch_size=16, epochs=10000, verbose=0, callbacks=[Mark()])
"""


def test_kernel_interrupt_stops_every_multiworker_worker_and_the_next_cell_runs(kern):
    # MultiWorkerMirroredStrategy's collectives ignore SIGINT: the workers must still stop
    # (killed after the grace time, engines restarted for the next cell), never keep training
    asked = {}

    def on_message(msg, res):
        if "at" not in asked and msg["header"]["msg_type"] == "stream" and "kd-mw-epoch 2" in msg["content"]["text"]:
            asked["at"] = True
            kern.interrupt()

    res = kern.execute(f"{MW}\n{MW_INTERRUPTED_FIT}", timeout=300, on_message=on_message)
    assert "at" in asked, res.text[-2000:]
    assert_interrupted(kern, res, epochs=1)
    # nothing keeps training: every engine process of that run is gone or idle
    # (the run's own processes, from its record: not whatever engines exist now)
    workers = kern.eval("sorted(r.pid for r in kdist_magics.last_run().ranks.values())")
    assert len(workers) == 2 and all(workers), workers
    for pid in workers:  # each is idle, or gone (killed after the grace period): not training
        try:
            cpu = psutil.Process(pid).cpu_percent(interval=1.0)
        except psutil.NoSuchProcess:
            continue
        assert cpu < 50, f"worker {pid} still busy ({cpu:.0f} % CPU) after the interrupt"
    res = kern.check(f"{MW}\nstrategy.cluster_resolver.task_id")
    assert res.value() == "0"


# -- 2. a rank dies ------------------------------------------------------------------------
def test_a_dying_rank_is_rankdied_with_its_status_and_the_next_cell_gets_fresh_engines(kern):
    # twice: the second time on engines restarted after a death (ipyparallel forgets a
    # stopped engine's launcher at once; its exit status must still be reported)
    for _ in range(2):
        old = engine_pids(kern)
        res = kern.execute(f"{HVD}\nimport os, time\nif hvd.rank() == 1:\n    os._exit(3)\ntime.sleep(120)")
        err = one_error(res)
        assert err["ename"] == "RankDied" and "rank 1 exited with status 3" in err["evalue"], err
        res = kern.check(f"{HVD}\n(hvd.rank(), hvd.size())")
        assert res.value() == "(0, 2)" and "restarting the engines" in res.stdout
        assert not engine_pids(kern) & old


# -- 4. nothing left behind ---------------------------------------------------------------
def test_restarting_the_engines_leaves_the_kernels_open_files_flat(kern):
    # every restart used to leave ipyparallel's sync-call thread (selector, wake-up socket
    # pair) and kdist's exit-watch loop open in the kernel: 3-7 file descriptors each
    kern.check("%kdist restart", timeout=300)
    kern.check(f"{HVD}\nkd_x = 1", timeout=300)
    before = psutil.Process(kern.pid).num_fds()
    kern.check("%kdist restart", timeout=300)  # one more: any fd a restart keeps shows (the
    kern.check(f"{HVD}\nkd_x = 1", timeout=300)  # soaks watch the drift over many restarts)
    assert psutil.Process(kern.pid).num_fds() == before


def test_kdist_stop_ends_every_process_and_the_next_cell_starts_again(kern):
    pids = set(kern.children())
    assert len(pids) >= 3  # controller and two engines (+ nannies)
    kern.check("%kdist stop")
    left, _ = wait_gone(pids, LINGER)
    assert not left, f"still running after %kdist stop: {left}"
    assert kern.check(f"{HVD}\nhvd.size()").value() == "2"
    kern.tree()  # remember the new cluster's pids for the module's shutdown check


def test_no_iopub_message_of_the_session_contains_a_cluster_key(kern):
    KEYS.update(connection_keys(kern.env))
    assert len(KEYS) >= 2  # the first cluster's and the one started after the rank died
    texts = [repr(msg.get("content", {})) for msg in kern.messages]
    assert len(texts) > 100
    leaked = [k for k in KEYS if any(k in t for t in texts)]
    assert not leaked


def test_a_sigkilled_kernel_leaves_no_controller_or_engines(tmp_path):
    k = Kernel(cwd=tmp_path)
    try:
        k.check(f"{HVD}\nhvd.size()", timeout=300)
        pids = set(k.tree())
        assert len(pids) >= 4  # kernel, controller, two engines (+ nannies)
        k.kill()
        left, _ = wait_gone(pids, LINGER)
        assert not left, f"still running after the kernel was SIGKILLed: {left}"
    finally:
        k.cleanup()
