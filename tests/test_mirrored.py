"""Kernel tier (and one fast test): --strategy mirrored on logical CPU devices, each scenario in a fresh process.

TensorFlow fixes its devices when its runtime starts, and in the pytest process
other kernel tests have started it already, so every scenario runs an IPython
shell script in a subprocess and reports back as JSON.
"""

import pytest

from conftest import run_in_fresh_shell


def run_script(body: str, **env) -> dict:
    """Run the body in a fresh Python; it fills ``out``, returned as a dict."""
    return run_in_fresh_shell(body, dict(KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2", **env))


TRAIN = """
import numpy as np, keras, tensorflow as tf
seen = []  # (per-replica batch size, replica id) of every step
class Probe(keras.layers.Layer):
    def call(self, x):
        ctx = tf.distribute.get_replica_context()
        if ctx is not None:
            tf.py_function(lambda n, r: seen.append((int(n), int(r))) or 0,
                           [tf.shape(x)[0], ctx.replica_id_in_sync_group], tf.int32)
        return x
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ np.array([1., -2., .5, 3.], dtype="float32"))[:, None]
model = keras.Sequential([keras.Input((4,)), Probe(), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=False)
history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
"""


@pytest.mark.quick
@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.timeout(500)
def test_mirrored_two_logical_cpus_end_to_end():
    r = run_script(f"""
        cell = {TRAIN!r}
        value, err = attempt("--devices 2 --no-dashboard", cell)   # auto: --devices means mirrored
        assert err is None, repr(err)
        ns = ip.user_ns
        import tensorflow as tf
        first = ns["strategy"]
        rec = kdist_magics.last_run()
        out["auto"] = [rec.strategy, rec.reason]
        out["strategy"] = type(first).__name__
        out["replicas"] = first.num_replicas_in_sync
        out["mirrored_vars"] = [isinstance(w.value, tf.distribute.DistributedValues) for w in ns["model"].weights]
        out["seen"] = sorted(set(map(tuple, ns["seen"])))
        out["loss"] = ns["history"].history["loss"]
        out["ranks"] = {{str(k): [s.state, s.device] for k, s in rec.ranks.items()}}
        out["status"] = rec.status
        out["steps"] = sorted({{m["step"] for m in rec.metrics if m.get("kind") == "step"}})
        out["epochs"] = len([m for m in rec.metrics if m.get("kind") == "epoch"])

        # the next cell reuses the same strategy; strategy stays bound
        ns["first_seen"] = first
        value, err = attempt("-s mirrored --devices 2 --no-dashboard", "same = strategy is first_seen\\n21 * 2")
        out["reused"] = ns["same"]
        out["value"] = value
        # the cell's own tf.distribute.MirroredStrategy() is the run's; other devices: one line
        value, err = attempt("-s mirrored --devices 2 --no-dashboard",
                             "mine_same = (tf.distribute.MirroredStrategy() is strategy and\\n"
                             "             tf.distribute.MirroredStrategy(['/cpu:1', '/cpu:0']) is strategy)\\n"
                             "tf.distribute.MirroredStrategy(devices=['/cpu:0'])")
        out["handed_back"] = [ns.get("mine_same"), str(err)]
        out["own_after"] = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) is not first
        # ... also after %kdist restart: the model built in the first cell keeps training
        ip.run_line_magic("kdist", "restart")
        value, err = attempt("-s mirrored --devices 2 --no-dashboard",
                             "more = model.fit(x, y, batch_size=16, epochs=1, verbose=2)\\n"
                             "same_after = strategy is first_seen")
        out["after_restart"] = [repr(err), ns.get("same_after")]

        # the user's own error
        value, err = attempt("-s mirrored --devices 2 --no-dashboard", "raise ValueError('bad data')")
        out["user_error"] = [type(err).__name__, type(getattr(err, "original", None)).__name__,
                             err._render_traceback_()]
        out["failed_ranks"] = sorted(s.state for s in kdist_magics.last_run().ranks.values())

        # more devices than TF started with: restart hint, nothing half-done
        ns["marker"] = "before"
        value, err = attempt("-s mirrored --devices 4 --no-dashboard", "marker = 'ran'")
        out["fixed"] = [type(err).__name__, str(err), "".join(err._render_traceback_())]
        out["marker"] = ns["marker"]
        out["still_bound"] = ns["strategy"] is first
    """)
    assert r["auto"][0] == "mirrored" and "--devices 2 given" in r["auto"][1]
    assert "kdist: --strategy auto chose mirrored:" in r["_stdout"]
    assert r["strategy"] == "MirroredStrategy" and r["replicas"] == 2
    assert r["mirrored_vars"] and all(r["mirrored_vars"])
    # every batch of 16 was split 8 + 8 over replicas 0 and 1
    assert r["seen"] == [[8, 0], [8, 1]]
    assert r["loss"][-1] < r["loss"][0]
    assert r["ranks"] == {"0": ["done", "/cpu:0"], "1": ["done", "/cpu:1"]} and r["status"] == "done"
    # telemetry: 4 steps x 3 epochs (step rows are throttled; each epoch's last is always sent)
    assert {4, 8, 12} <= set(r["steps"]) and r["epochs"] == 3
    assert r["reused"] is True and r["value"] == 42
    assert r["handed_back"][0] is True and "LauncherMismatch" in r["handed_back"][1]
    assert "give --devices 1" in r["handed_back"][1] and r["own_after"] is True
    assert r["after_restart"] == ["None", True]
    assert "4/4 - " in r["_stdout"]  # Keras's own per-epoch line, printed as in a plain cell
    assert r["user_error"] == ["CellFailed", "ValueError", []]
    assert "bad data" in r["_stdout"]  # the user's traceback, shown by the inner cell
    assert r["failed_ranks"] == ["failed", "failed"]
    kind, message, rendered = r["fixed"]
    assert kind == "DevicesFixed"
    assert "already started with 2 CPU devices" in message and "Restart the kernel" in message
    assert "The cell did not run" in message and "Traceback" not in rendered
    assert r["marker"] == "before" and r["still_bound"] is True


@pytest.mark.kernel
@pytest.mark.timeout(400)
def test_tf_already_started_with_one_device_runs_nothing():
    r = run_script("""
        import tensorflow as tf
        tf.constant(1.0) + 1          # the notebook used TF first: one CPU device, fixed
        ip.user_ns["marker"] = "before"
        value, err = attempt("--strategy mirrored --devices 2 --no-dashboard", "marker = 'ran'")
        out["error"] = [type(err).__name__, str(err)]
        out["marker"] = ip.user_ns["marker"]
        out["bound"] = "strategy" in ip.user_ns
        rec = kdist_magics.last_run()
        out["record"] = [rec.status, rec.error]
    """)
    kind, message = r["error"]
    assert kind == "DevicesFixed"
    assert "already started with 1 CPU device," in message
    assert "--devices 2 cannot take effect" in message and "Restart the kernel" in message
    assert r["marker"] == "before" and r["bound"] is False
    assert r["record"][0] == "not run" and "Restart the kernel" in r["record"][1]  # never began


def test_plan_devices_on_gpus_with_a_fake_tf():
    """GPU path without a GPU: a fake ``tf.config`` with 4 GPUs."""
    from types import SimpleNamespace

    from kdist_magics.errors import StrategyUnavailable
    from kdist_magics.strategies.frameworks.on_tf import plan_devices

    tf = SimpleNamespace(
        config=SimpleNamespace(list_physical_devices=lambda kind: ["GPU"] * 4 if kind == "GPU" else ["CPU"])
    )
    assert plan_devices(None, tf) == (["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"], "GPU")
    assert plan_devices(2, tf) == (["/gpu:0", "/gpu:1"], "GPU")
    with pytest.raises(StrategyUnavailable) as info:
        plan_devices(8, tf)
    assert "4 GPUs" in str(info.value) and "--devices 4 or fewer" in str(info.value)
