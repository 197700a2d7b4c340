"""Kernel tier (and one fast test): Keras 3 on JAX with keras.distribution.DataParallel over host devices.

Each scenario runs in a fresh process with ``KERAS_BACKEND=jax`` (JAX, like TF,
fixes its devices when its backend starts).
"""

import sys

import pytest

from conftest import run_in_fresh_shell


pytestmark = pytest.mark.notf  # also in .venv-colab-tpu: no TensorFlow (tests/README.md)


def run_script(body: str, **env) -> dict:
    return run_in_fresh_shell(
        body, dict(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", **env), unset=("XLA_FLAGS",)
    )


TRAIN = """
import numpy as np, keras, jax
shardings = []  # (devices, per-device shape) of the batch entering the model, every traced step
class Probe(keras.layers.Layer):
    def call(self, x):
        jax.debug.inspect_array_sharding(
            x, callback=lambda s: shardings.append([len(s.device_set), list(s.shard_shape(x.shape))]))
        return x
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ np.array([1., -2., .5, 3.], dtype="float32"))[:, None]
model = keras.Sequential([keras.Input((4,)), Probe(), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
"""

ODD = """
shardings.clear()
odd = model.fit(x[:63], y[:63], batch_size=33, epochs=1, verbose=0, validation_split=0.25)
score = model.evaluate(x[:63], y[:63], batch_size=33, verbose=0)
pred = model.predict(x[:63], verbose=0)
"""


@pytest.mark.quick
@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.timeout(500)
def test_data_parallel_over_forced_host_devices():
    r = run_script(
        f"""
        import keras
        before = [keras.Model.fit, keras.Model.evaluate, keras.Model.predict]
        value, err = attempt("-s mirrored --devices 2 --no-dashboard", {TRAIN!r})
        assert err is None, repr(err)
        ns = ip.user_ns
        s = ns["strategy"]
        out["strategy"] = [type(s).__name__, s.num_replicas_in_sync, type(s.distribution).__name__]
        out["batch"] = [list(b) for b in ns["shardings"]]
        out["weights"] = [len(w.value.sharding.device_set) for w in ns["model"].weights]
        out["loss"] = ns["history"].history["loss"]
        rec = kdist_magics.last_run()
        out["ranks"] = sorted(s.state for s in rec.ranks.values())
        out["backend"] = rec.strategy

        value, err = attempt("-s mirrored --devices 2 --no-dashboard", {ODD!r})
        assert err is None, repr(err)
        out["odd_batches"] = [list(b) for b in ns["shardings"]]
        out["odd_val"] = "val_loss" in ns["odd"].history
        out["pred"] = list(ns["pred"].shape)
        out["score"] = float(ns["score"])

        # outside kdist the same call is XLA's IndivisibleError: the pitfall is real
        try:
            with ns["strategy"].scope():
                ns["model"].fit(ns["x"][:63], ns["y"][:63], batch_size=33, epochs=1, verbose=0)
            out["raw"] = "ok"
        except Exception as exc:
            out["raw"] = type(exc).__name__
            out["raw_msg"] = str(exc)[:400]
        out["restored"] = [keras.Model.fit, keras.Model.evaluate, keras.Model.predict] == before

        # more devices than JAX started with
        ns["marker"] = "before"
        value, err = attempt("-s mirrored --devices 4 --no-dashboard", "marker = 'ran'")
        out["fixed"] = [type(err).__name__, str(err)]
        out["marker"] = ns["marker"]

        # --timeout and --checkpoint mean here what they mean everywhere (capabilities.py)
        value, err = attempt("-s mirrored --devices 2 --no-dashboard --timeout 1",
                             "import time\\nfor kd_i in range(40):\\n    time.sleep(0.5)")
        out["timeout"] = [type(err).__name__, ns["kd_i"], kdist_magics.last_run().status]
        import tempfile
        folder = tempfile.mkdtemp(prefix="kdist-jax-ckpt-")
        value, err = attempt(f"-s mirrored --devices 2 --no-dashboard --checkpoint {{folder}}",
                             "model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])\\n"
                             "model.compile('sgd', 'mse')\\nmodel.fit(x, y, batch_size=16, epochs=2, verbose=0)")
        saved = keras.saving.load_model(folder + "/last.keras").get_weights()
        out["checkpoint"] = all((a == b).all() for a, b in zip(saved, ns["model"].get_weights()))
    """,
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
    )
    kind, replicas, dist = r["strategy"]
    assert (kind, replicas, dist) == ("DataParallelStrategy", 2, "DataParallel")
    # every batch of 16 entered the model split over both devices, 8 rows each
    assert r["batch"] and all(b == [2, [8, 4]] for b in r["batch"])
    assert r["weights"] and all(n == 2 for n in r["weights"])  # replicated on both
    assert r["loss"][-1] < r["loss"][0]
    assert r["ranks"] == ["done", "done"] and r["backend"] == "mirrored"
    # batch 33 -> 32 (16 per device), 63 samples -> the last one left out; said once each
    stdout = r["_stdout"]
    assert stdout.count("kdist: batch_size 33 does not split over 2 devices; using 32 (16 per device)") == 1
    assert "kdist: leaving out the last 1 of 47 training samples" in stdout  # 63 * 0.75 -> 47
    assert "kdist: leaving out the last 1 of 63 evaluation samples" in stdout
    assert all(b[0] == 2 and b[1][0] * 2 in (32, 14, 16, 30) for b in r["odd_batches"])
    assert r["odd_val"] is True and r["pred"] == [63, 1]  # predict pads and cuts: every row
    # XLA's IndivisibleError (jax >= 0.8), a ValueError saying "divisible" on jax 0.7 (Colab's)
    assert r["raw"] == "IndivisibleError" or (r["raw"] == "ValueError" and "divisible" in r["raw_msg"]), r
    assert r["restored"] is True
    kind, message = r["fixed"]
    assert kind == "DevicesFixed" and "JAX in this kernel has 2 CPU devices" in message
    assert "xla_force_host_platform_device_count=4" in message and "did not run" in message
    assert r["marker"] == "before"
    kind, reached, status = r["timeout"]
    assert kind == "KernelRunTimedOut" and reached < 39 and status == "timeout"
    assert r["checkpoint"] is True


@pytest.mark.kernel
@pytest.mark.timeout(400)
def test_devices_configured_before_jax_starts():
    """No XLA_FLAGS: kdist asks JAX for N host devices itself, as on a laptop."""
    r = run_script("""
        value, err = attempt("-s mirrored --devices 3 --no-dashboard --no-telemetry",
                             "import jax\\nn = len(jax.devices())\\nreplicas = strategy.num_replicas_in_sync")
        assert err is None, repr(err)
        out["n"] = ip.user_ns["n"]
        out["replicas"] = ip.user_ns["replicas"]
        # without --devices: every host device JAX has (at least the default 2)
        value, err = attempt("-s mirrored --no-dashboard --no-telemetry", "again = strategy.num_replicas_in_sync")
        assert err is None, repr(err)
        out["again"] = ip.user_ns["again"]
    """)
    assert r["n"] == 3 and r["replicas"] == 3 and r["again"] == 3


@pytest.mark.kernel
@pytest.mark.timeout(400)
def test_jax_started_with_one_device_runs_nothing():
    r = run_script("""
        import jax
        jax.numpy.zeros(1)             # the notebook used JAX first: one CPU device, fixed
        ip.user_ns["marker"] = "before"
        value, err = attempt("-s mirrored --no-dashboard", "marker = 'ran'")   # default: 2 devices
        out["error"] = [type(err).__name__, str(err)]
        out["marker"] = ip.user_ns["marker"]
        out["bound"] = "strategy" in ip.user_ns
    """)
    kind, message = r["error"]
    assert kind == "DevicesFixed" and "JAX in this kernel has 1 CPU device," in message
    assert "Restart the kernel" in message and "did not run" in message
    assert r["marker"] == "before" and r["bound"] is False


def test_divisible_batches_with_a_fake_model_class(monkeypatch):
    """The adjustments themselves, on a stand-in ``keras.Model`` (no JAX needed)."""
    import types

    import numpy as np

    calls = []

    class Model:
        def fit(
            self,
            x=None,
            y=None,
            batch_size=None,
            epochs=1,
            validation_split=0.0,
            validation_data=None,
            sample_weight=None,
            validation_batch_size=None,
            steps_per_epoch=None,
        ):
            calls.append(
                (
                    "fit",
                    len(x),
                    batch_size,
                    validation_data and len(validation_data[0]),
                    None if sample_weight is None else len(sample_weight),
                )
            )

        def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, steps=None):
            calls.append(("evaluate", len(x), batch_size))

        def predict(self, x, batch_size=None, steps=None):
            calls.append(("predict", len(x), batch_size))
            return x * 2

    monkeypatch.setitem(sys.modules, "keras", types.SimpleNamespace(Model=Model))
    from kdist_magics.strategies.frameworks.on_jax import divisible_batches

    before = (Model.fit, Model.evaluate, Model.predict)

    said = []
    x = np.arange(10, dtype="float32")[:, None]
    x20 = np.arange(20, dtype="float32")[:, None]
    with divisible_batches(4, say=said.append):
        m = Model()
        m.fit(x, x, 6, sample_weight=np.ones(10))
        m.fit(x[:8], x[:8], batch_size=8)  # already fine: untouched
        m.fit(x20, x20, validation_split=0.3)  # 14 + 6 rows -> 12 + 4
        m.evaluate(x, x)
        p = m.predict(x, batch_size=3)
    assert calls == [
        ("fit", 8, 4, None, 8),
        ("fit", 8, 8, None, None),
        ("fit", 12, 32, 4, None),
        ("evaluate", 8, 32),
        ("predict", 12, 4),
    ]
    assert p.shape == (10, 1) and (p[:, 0] == np.arange(10) * 2).all()
    assert "kdist: batch_size 6 does not split over 4 devices; using 4 (1 per device)" in said
    assert (Model.fit, Model.evaluate, Model.predict) == before
