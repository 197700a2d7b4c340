"""``--strategy sharded``: Keras' ModelParallel over a (batch, model) mesh, in the kernel.

Fast tier: the mesh option and its errors, the automatic layout, the layout checks, the
advisor's choice (fake facts), and the one line under another backend. Kernel tier: one fresh
process with 4 logical CPU devices (``XLA_FLAGS`` before JAX starts, as in test_jax_dp.py)
trains the same model, same data and batch order, on one device and sharded over meshes 4x1,
2x2 and 1x4, with identical losses per step and final weights, and reads the layout table.
"""

from __future__ import annotations

import sys

import pytest
from IPython.core.error import UsageError

from conftest import run_in_fresh_shell
from kdist_magics.choose.advisor import decide, facts_for
from kdist_magics.hardware import GiB, Hardware
from kdist_magics.strategies.sharded.mesh import pick_model_axis
from kdist_magics.spec import parse_line
from kdist_magics.strategies.sharded.layout import LayoutError, auto_spec, check_spec


pytestmark = pytest.mark.notf  # also in .venv-colab-tpu: no TensorFlow (tests/README.md)


def test_mesh_option_and_its_errors():
    spec = parse_line("--strategy sharded --devices 4 --mesh 2,2")
    assert spec.mesh == (2, 2) and spec.devices == 4
    assert parse_line("-s sharded --mesh 1,4").mesh == (1, 4)
    cases = {
        "-s sharded --mesh 2": "is not a mesh; give D,M",
        "-s sharded --mesh 0,2": "is not a mesh",
        "-s sharded --devices 4 --mesh 3,1": "--mesh 3,1 has 3 places, not equal to the 4 devices",
        "-s sharded --devices 2 --mesh 1,4": "a model axis of 4 is more than the 2 devices --devices 2",
        "-s mirrored --mesh 1,2": "--mesh applies to sharded, not mirrored",
        "-s sharded --pull model": "applies to engine strategies",
        "-s sharded --np 2 --devices 2": "--devices applies to sharded in the notebook",
    }
    for line, words in cases.items():
        with pytest.raises(UsageError) as err:
            parse_line(line)
        assert words in str(err.value), (line, str(err.value))
        assert "\n" not in str(err.value) or "--pull" in line


def test_automatic_layout_shards_big_variables_on_their_largest_divisible_dimension():
    assert auto_spec((256, 256), "float32", 4) == [None, "model"]  # 256 KiB: sharded, ties: last
    assert auto_spec((1024, 256), "float32", 4) == ["model", None]  # the largest dimension
    assert auto_spec((1022, 256), "float32", 4) == [None, "model"]  # 1022 does not split in 4
    assert auto_spec((256,), "float32", 4) == [None]  # small: replicated
    assert auto_spec((1023, 255), "float32", 4) == [None, None]  # nothing divides: replicated
    assert auto_spec((256, 256), "float32", 1) == [None, None]  # no model axis


def test_layout_checks_name_the_variable():
    with pytest.raises(
        LayoutError, match=r"dense/kernel names mesh axis 'modle', but the mesh has only 'batch', 'model'"
    ):
        check_spec("dense/kernel", (8, 8), (None, "modle"), ("batch", "model"), (1, 4))
    with pytest.raises(
        LayoutError, match=r"dense/kernel \(8, 6\): dimension 1 \(6\) does not split over mesh axis 'model' of 4"
    ):
        check_spec("dense/kernel", (8, 6), (None, "model"), ("batch", "model"), (1, 4))
    check_spec("dense/kernel", (8, 8), (None, "model"), ("batch", "model"), (1, 4))  # fine


def test_smallest_model_axis_that_fits():
    assert pick_model_axis(8, 48, 16) == 4  # 48/3 would fit, but 3 does not divide 8
    assert pick_model_axis(8, 10, 16) == 1
    assert pick_model_axis(2, 48, 16) is None
    assert pick_model_axis(4, None, 16) is None


HUGE = {"name": "llm", "params": 3_000_000_000, "bytes": 12_000_000_000}  # ~48 GB to train
GPUS8 = dict(cpu_cores=64, gpus=[{"name": "V100", "memory_bytes": 16 * GiB}] * 8, horovod=True)


def _advice(hw, model, backend, line=""):
    return decide(facts_for(Hardware.from_dict(hw), parse_line(line), {}, model=model, backend=backend))


def test_advisor_shards_a_model_too_big_for_one_device_on_jax_only():
    advice = _advice(GPUS8, HUGE, "jax")
    assert advice.strategy == "sharded", advice
    assert "mesh 2,4" in advice.reason and "per device" in advice.reason and "warning" not in advice.reason
    assert "\n" not in advice.reason
    tpu = _advice(dict(cpu_cores=96, tpu="v5litepod-8"), HUGE, "jax")  # 16 GiB per chip
    assert tpu.strategy == "sharded" and "mesh 2,4" in tpu.reason
    # a model that fits is never sharded; TF keeps the warning (Keras shards on JAX only)
    assert _advice(GPUS8, {"name": "m", "params": 25e6, "bytes": 100e6}, "jax").strategy != "sharded"
    tf = _advice(GPUS8, HUGE, "tensorflow")
    assert tf.strategy == "mirrored" and "out-of-memory" in tf.reason
    # even 8 devices too few: the warning stays
    assert "out-of-memory" in _advice(GPUS8, dict(HUGE, bytes=60e9), "jax").reason
    assert _advice(dict(cpu_cores=2), None, "jax", "--mesh 1,2").strategy == "sharded"


def test_other_backends_get_one_line_and_nothing_starts(ip, monkeypatch):
    from kdist_magics.errors import StrategyUnavailable

    monkeypatch.delitem(sys.modules, "keras", raising=False)
    before = set(sys.modules)
    for backend in ("tensorflow", "torch"):
        monkeypatch.setenv("KERAS_BACKEND", backend)
        ip.user_ns["marker"] = "before"
        with pytest.raises(StrategyUnavailable) as err:
            ip.run_cell_magic("kdist", "-s sharded --no-dashboard", "marker = 'ran'")
        assert f"runs on {backend}" in str(err.value) and "KERAS_BACKEND=jax" in str(err.value)
        assert "\n" not in str(err.value) and ip.user_ns["marker"] == "before"
        assert not {"keras", "jax"} & (set(sys.modules) - before)  # nothing imported, nothing started


TRAIN = """
import numpy as np, keras
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 256)).astype("float32")
y = rng.normal(size=(64, 8)).astype("float32")
inputs = keras.Input((256,))
hidden = keras.layers.Dense(256, activation="tanh", name="d1")(inputs)     # 256 KiB kernel: sharded
model = keras.Model(inputs, keras.layers.Dense(8, name="d2")(hidden))     # small: replicated
model.set_weights([np.random.default_rng(i).normal(scale=0.05, size=w.shape).astype("float32")
                   for i, w in enumerate(model.weights)])
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
class Steps(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.losses = []
    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
steps = Steps()
model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[steps])
kd_loss = steps.losses
"""

OWN = """
import keras
dist = keras.distribution
mesh = dist.DeviceMesh((1, 4), ["batch", "model"], devices=dist.list_devices())
layout_map = dist.LayoutMap(mesh)
layout_map["e1/kernel"] = (None, "model")     # a Sequential's path is sequential/e1/kernel
layout_map[".*e2/kernel"] = (None, "model")
dist.set_distribution(dist.ModelParallel(layout_map=layout_map, batch_dim_name="batch"))
small = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="e1"), keras.layers.Dense(8, name="e2")])
"""


@pytest.mark.quick
@pytest.mark.kernel
@pytest.mark.timeout(400)
def test_sharded_training_equals_one_device():
    r = run_in_fresh_shell(
        f"""
        import kdist_magics
        runs = {{}}
        for name, line in [("one", "-s default"), ("auto", "-s sharded"), ("2x2", "-s sharded --mesh 2,2"),
                           ("1x4", "-s sharded --mesh 1,4")]:
            value, err = attempt(line + " --no-dashboard --no-telemetry", {TRAIN!r})
            assert err is None, (line, repr(err))
            table = kdist_magics.last_run().layout()
            runs[name] = dict(mesh=kdist_magics.last_run().mesh, loss=ip.user_ns["kd_loss"],
                              weights=[w.tolist() for w in ip.user_ns["model"].get_weights()],
                              rows=table.rows if table else None, text=repr(table),
                              optimizer=table.optimizer_bytes if table else None,
                              replicas=ip.user_ns["strategy"].num_replicas_in_sync if name != "one" else 1)
        out["runs"] = runs
        # sharded variables are created split (Keras would make a 256x256 one whole first)
        import jax, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        from keras.src.backend.jax import core
        mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(1, 4), ("batch", "model"))
        out["split_at_init"] = [core.should_shard_at_init(NamedSharding(mesh, spec), (256, 256))
                                for spec in (P(None, "model"), P(None, None))]
        ip.user_ns.pop("model")
        value, err = attempt("-s sharded --mesh 1,4 --no-dashboard --no-telemetry", {OWN!r})
        assert err is None, repr(err)
        out["own"] = {{r["variable"]: r["spec"] for r in kdist_magics.last_run().layout().rows}}
        # Keras' own rule for a key: 3.15 matches whole paths only, 3.13 anywhere in one
        out["e1_matches"] = ip.user_ns["layout_map"]["sequential/e1/kernel"] is not None
    """,
        dict(
            KERAS_BACKEND="jax",
            JAX_PLATFORMS="cpu",
            TF_CPP_MIN_LOG_LEVEL="2",
            XLA_FLAGS="--xla_force_host_platform_device_count=4",
        ),
    )
    import numpy as np

    runs, stdout = r["runs"], r["_stdout"]
    one = runs.pop("one")
    assert len(one["loss"]) == 8 and one["loss"][-1] < one["loss"][0]
    assert r["split_at_init"] == [True, False]  # (and the weights below equal one device's)
    for name, run in runs.items():
        np.testing.assert_allclose(run["loss"], one["loss"], rtol=1e-5, atol=1e-6, err_msg=name)
        for w, w1 in zip(run["weights"], one["weights"]):
            np.testing.assert_allclose(w, w1, rtol=1e-4, atol=1e-6, err_msg=name)
    # without --mesh: the model in the namespace fits one device, so all data (4x1), said once
    assert "kdist: mesh 4,1 over 4 devices (data axis 4, model axis 1): the smallest model axis" in stdout
    rows = {
        name: {row["variable"]: (row["spec"], row["bytes_per_device"]) for row in run["rows"]}
        for name, run in runs.items()
    }
    assert rows["auto"]["d1/kernel"] == ("replicated", 256 * 256 * 4)
    assert rows["2x2"]["d1/kernel"] == ("(-, model)", 256 * 256 * 4 // 2)
    assert rows["1x4"]["d1/kernel"] == ("(-, model)", 256 * 256 * 4 // 4)
    assert rows["1x4"]["d2/kernel"] == ("replicated", 256 * 8 * 4) and rows["1x4"]["d1/bias"][0] == "replicated"
    assert [runs[n]["replicas"] for n in ("auto", "2x2", "1x4")] == [4, 2, 1]
    assert [runs[n]["mesh"] for n in ("auto", "2x2", "1x4")] == [[4, 1], [2, 2], [1, 4]]  # the dashboard's
    # Adam's moments follow their weights: a quarter of d1's on each device under 1x4
    assert runs["1x4"]["optimizer"] < runs["2x2"]["optimizer"] < runs["auto"]["optimizer"]
    assert "d1/kernel" in runs["1x4"]["text"] and "mesh 1x4 (batch x model)" in runs["1x4"]["text"]
    # the cell's own distribution is honoured; its key that matches nothing is said
    assert r["own"]["sequential/e2/kernel"] == "(-, model)"
    if r["e1_matches"]:  # Keras 3.13: the key is found in the path, and kdist says nothing
        assert r["own"]["sequential/e1/kernel"] == "(-, model)"
        assert "LayoutMap key 'e1/kernel'" not in r["_stderr"]
    else:  # Keras 3.15: left replicated, and said
        assert r["own"]["sequential/e1/kernel"] == "replicated"
        assert "LayoutMap key 'e1/kernel' matched no variable" in r["_stderr"]


GUIDE = (
    """
import keras
dist = keras.distribution
mesh = dist.DeviceMesh((1, 2), ["batch", "model"], devices=dist.list_devices())
layout_map = dist.LayoutMap(mesh)
layout_map["d1/kernel"] = (None, "model")
layout_map["d1/bias"] = ("model",)
dist.set_distribution(dist.ModelParallel(layout_map=layout_map, batch_dim_name="batch"))
"""
    + TRAIN
)


#: TRAIN on one device with the batches a 2x1 mesh over two processes makes: each process takes
#: its contiguous half (rows 0-31, 32-63) and a global batch is 16 rows of each
PAIRS = TRAIN.replace(
    "model.fit(x, y, batch_size=16",
    "order = np.concatenate([np.r_[16 * k:16 * k + 16, "
    "32 + 16 * k:48 + 16 * k] for k in range(2)])\nmodel.fit(x[order], y[order], batch_size=32",
)


@pytest.mark.engines
@pytest.mark.timeout(600)
def test_sharded_over_two_engine_processes_equals_one_device():
    """Keras' guide's ModelParallel cell under multiworker (NumPy arrays, its own distribution),
    and --strategy sharded --np 2 over meshes 1x2 and 2x1 (warm engines), then 1x2 on two
    engines the user started (--cluster-id): each trains as one device does on the same
    batches; --pull model gathers an ordinary model that predicts in the kernel."""
    pytest.importorskip("jax", reason="JAX is in the jax extra (make test installs it)")
    assert PAIRS != TRAIN
    local = "\nkd_local = {v.path: list(v.value.addressable_data(0).shape) for v in model.weights}\n"
    r = run_in_fresh_shell(
        f"""
        import numpy as np
        for name, cell in [("one", {TRAIN!r}), ("pairs", {PAIRS!r})]:
            value, err = attempt("-s default --no-dashboard --no-telemetry", cell)
            assert err is None, repr(err)
            one, x = ip.user_ns["model"], ip.user_ns["x"]
            out[name] = dict(loss=ip.user_ns["kd_loss"], weights=[w.tolist() for w in one.get_weights()],
                             pred=np.asarray(one.predict(x[:4], verbose=0)).tolist())
        pulled = " --pull model,kd_loss,kd_local --no-dashboard --no-telemetry"
        import os, tempfile, keras
        ck = tempfile.mkdtemp()
        for name, line, cell in [("guide", "--strategy multiworker --np 2", {GUIDE + local!r}),
                                 ("1x2", "--strategy sharded --np 2 --mesh 1,2 --checkpoint " + ck, {TRAIN + local!r}),
                                 ("2x1", "--strategy sharded --np 2 --mesh 2,1", {TRAIN + local!r})]:
            value, err = attempt(line + pulled, cell)
            assert err is None, (name, repr(err))
            model = ip.user_ns["model"]
            out[name] = dict(loss=ip.user_ns["kd_loss"], local=ip.user_ns["kd_local"],
                             weights=[w.tolist() for w in model.get_weights()],
                             pred=np.asarray(model.predict(x[:4], verbose=0)).tolist())
            table = kdist_magics.last_run().layout()
            out[name]["specs"] = {{row["variable"]: row["spec"] for row in table.rows}} if table else None
            if name == "guide":
                ip.run_line_magic("kdist", "stop")
        ip.run_line_magic("kdist", "stop")
        # a cluster the user started: attached by --cluster-id, and left running by %kdist stop
        import ipyparallel as ipp
        theirs = ipp.Cluster(n=2, cluster_id="theirs-sharded", controller_ip="127.0.0.1", log_level=40)
        theirs.start_cluster_sync()
        theirs.connect_client_sync().wait_for_engines(2, timeout=120)
        # their processes by pid, for after: ipyparallel's stop can leave JAX engines running
        # (a rehearsal found them orphaned after the session), as conftest's user_cluster says
        from kdist_magics.cluster.exits import kill_pids
        from kdist_magics.cluster.lifetime import process_tree
        tree = process_tree({{theirs.controller.pid}} | {{l.pid for es in theirs.engines.values() for l in es.launchers.values()}})
        try:
            value, err = attempt("--strategy sharded --cluster-id theirs-sharded --mesh 1,2" + pulled,
                                 {TRAIN + local!r})
            assert err is None, ("attached", repr(err))
            out["attached"] = dict(loss=ip.user_ns["kd_loss"], local=ip.user_ns["kd_local"])
            ip.run_line_magic("kdist", "stop")
            out["theirs_left"] = len(theirs.connect_client_sync().ids)
        finally:
            theirs.stop_cluster_sync()
            kill_pids(tree, grace=5)
        saved = keras.saving.load_model(os.path.join(ck, "last.keras"))
        out["checkpoint"] = [w.tolist() for w in saved.get_weights()]
    """,
        env={"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
        unset=("XLA_FLAGS",),
    )
    import numpy as np

    for name, base in (("guide", "one"), ("1x2", "one"), ("2x1", "pairs")):
        run, one = r[name], r[base]
        assert len(run["loss"]) == len(one["loss"]) == (8 if base == "one" else 4), name
        np.testing.assert_allclose(run["loss"], one["loss"], rtol=1e-5, atol=1e-6, err_msg=name)
        # --pull model gathered it whole: an ordinary model with the same weights, predicting here
        for w, w1 in zip(run["weights"], one["weights"]):
            np.testing.assert_allclose(w, w1, rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(run["pred"], one["pred"], rtol=1e-4, atol=1e-5, err_msg=name)
    # the model axis spans the processes: half of d1's kernel on each (2x1: whole on each)
    assert [r[n]["local"]["d1/kernel"] for n in ("guide", "1x2", "2x1")] == [[256, 128], [256, 128], [256, 256]]
    assert r["guide"]["local"]["d1/bias"] == [128] and r["1x2"]["local"]["d1/bias"] == [256]
    # last_run().layout() after an engine run: the table, read from the engines
    assert r["1x2"]["specs"]["d1/kernel"] == "(-, model)" and r["2x1"]["specs"]["d1/kernel"] == "replicated"
    assert r["guide"]["specs"] is None  # a multiworker run keeps no layout table
    # attached to the user's engines: the same training, half of d1 on each, their engines kept
    np.testing.assert_allclose(r["attached"]["loss"], r["one"]["loss"], rtol=1e-5, atol=1e-6)
    assert r["attached"]["local"]["d1/kernel"] == [256, 128] and r["theirs_left"] == 2
    # --checkpoint: gathered on both processes, written by rank 0, loads anywhere
    for w, w1 in zip(r["checkpoint"], r["one"]["weights"]):
        np.testing.assert_allclose(w, w1, rtol=1e-4, atol=1e-6)


HUB = """
import numpy as np, keras, keras_hub
backbone = keras_hub.models.GemmaBackbone(vocabulary_size=64, num_layers=2, num_query_heads=4,
                                          num_key_value_heads=4, hidden_dim=16, intermediate_dim=32, head_dim=8)
tokens = {"token_ids": np.arange(32).reshape(4, 8) % 64, "padding_mask": np.ones((4, 8), "int32")}
if "kd_weights" in globals():
    backbone.set_weights(kd_weights)
kd_weights = backbone.get_weights()
kd_out = np.asarray(backbone(tokens)).tolist()
"""


@pytest.mark.kernel
@pytest.mark.timeout(400)
def test_keras_hub_backbone_uses_its_own_layout_map():
    """A 2-layer Gemma-shaped backbone built from its constructor (no preset download) under
    mesh 2x2 takes its layout from ``GemmaBackbone.get_layout_map``; its output equals the
    same weights' on one device."""
    pytest.importorskip("keras_hub", reason="keras-hub is not installed here (scripts/setup.sh installs it into .venv)")
    r = run_in_fresh_shell(
        f"""
        import kdist_magics
        value, err = attempt("-s sharded --mesh 2,2 --no-dashboard --no-telemetry", {HUB!r})
        assert err is None, repr(err)
        out["specs"] = {{row["variable"]: row["spec"] for row in kdist_magics.last_run().layout().rows}}
        out["sharded"] = ip.user_ns["kd_out"]
        value, err = attempt("-s default --no-dashboard --no-telemetry", {HUB!r})
        assert err is None, repr(err)
        out["one"] = ip.user_ns["kd_out"]
    """,
        dict(
            KERAS_BACKEND="jax",
            JAX_PLATFORMS="cpu",
            TF_CPP_MIN_LOG_LEVEL="2",
            XLA_FLAGS="--xla_force_host_platform_device_count=4",
        ),
    )
    import numpy as np

    specs = r["specs"]
    assert specs["token_embedding/embeddings"] == "(model, batch)", specs
    gating = [spec for path, spec in specs.items() if path.endswith("ffw_gating/kernel")]
    assert len(gating) == 2 and set(gating) == {"(batch, model)"}, specs
    norms = [spec for path, spec in specs.items() if path.endswith("norm/scale")]
    assert norms and set(norms) == {"replicated"}, specs
    np.testing.assert_allclose(r["sharded"], r["one"], rtol=1e-4, atol=1e-5)


def test_advise_shows_the_planned_layout(monkeypatch):
    """%kdist advise under JAX for a model too big for one GPU: the automatic layout it would
    get, from the variables' shapes (a stand-in Keras: no JAX in the fast tier)."""
    import types

    from kdist_magics.choose.advisor import advise

    class Model:
        def __init__(self, weights):
            self.weights = weights

    def var(path, shape):
        return types.SimpleNamespace(path=path, shape=shape, dtype="float32")

    monkeypatch.setitem(sys.modules, "keras", types.SimpleNamespace(Model=Model))
    ns = {"llm": Model([var("embed/embeddings", (512_000, 8192)), var("norm/scale", (8192,))])}
    hw = Hardware.from_dict(dict(cpu_cores=64, gpus=[{"name": "A100", "memory_bytes": 40 * GiB}] * 8))
    advice = advise(ns, parse_line(""), hardware=hw, backend="jax")
    assert advice.strategy == "sharded" and "mesh 4,2" in advice.reason, advice.reason
    rows = {r["variable"]: (r["spec"], r["bytes_per_device"]) for r in advice.layout.rows}
    assert rows == {"embed/embeddings": ("(model, -)", 512_000 * 8192 * 4 // 2), "norm/scale": ("replicated", 8192 * 4)}
    text = repr(advice)
    assert "planned layout (automatic):" in text and "embed/embeddings" in text and "mesh 4x2" in text
    assert "embed/embeddings" in advice._repr_html_()


BUILT_BEFORE = """
import numpy as np, keras
x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
"""
USES_IT = "model.compile(optimizer='sgd', loss='mse')\nkd_hist = model.fit(x, y, epochs=1, verbose=0)"
BUILDS_ITS_OWN = (
    "model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])\n" + USES_IT
)


@pytest.mark.kernel
@pytest.mark.timeout(400)
def test_a_model_built_before_the_cell_is_named_in_one_line_and_nothing_runs():
    """A model built in a plain cell, then compiled and fit in a sharded cell over 4
    logical devices, failed deep in JAX ("Received incompatible devices for jitted
    computation"). kdist names it before the cell runs, and the cell that builds its own
    model trains; a later cell without --mesh says it keeps the mesh."""
    r = run_in_fresh_shell(
        f"""
        ip.run_cell({BUILT_BEFORE!r})
        value, err = attempt("-s sharded --devices 4 --mesh 2,2 --no-dashboard", {USES_IT!r})
        out["refused"] = [type(err).__name__, str(err), "kd_hist" in ip.user_ns]
        value, err = attempt("-s sharded --devices 4 --mesh 2,2 --no-dashboard", {BUILDS_ITS_OWN!r})
        out["own"] = [repr(err), ip.user_ns["kd_hist"].history["loss"]]
        value, err = attempt("-s sharded --devices 4 --no-dashboard", "kd_again = model.predict(x, verbose=0).shape")
        out["again"] = [repr(err), list(ip.user_ns.get("kd_again") or [])]
    """,
        dict(
            KERAS_BACKEND="jax",
            JAX_PLATFORMS="cpu",
            TF_CPP_MIN_LOG_LEVEL="2",
            XLA_FLAGS="--xla_force_host_platform_device_count=4",
        ),
    )
    name, message, trained = r["refused"]
    assert name == "StrategyUnavailable" and not trained, r["refused"]
    assert message.startswith("'model' was built before this cell, outside --strategy sharded")
    assert "Build the model inside the %%kdist --strategy sharded cell" in message
    assert "\n" not in message and message.endswith("The cell did not run.")
    assert r["own"][0] == "None" and len(r["own"][1]) == 1, r["own"]
    assert r["again"] == ["None", [64, 1]], r["again"]  # the mesh's own model: used again
    assert "mesh 2,2 over 4 devices, as the previous sharded cell on them chose" in r["_stdout"]
    import os

    if (os.cpu_count() or 1) < 4:  # 4 logical devices on fewer cores are said to share them
        assert "the 4 devices are logical CPU devices sharing" in r["_stdout"]


def test_the_names_a_cell_reads_and_never_assigns():
    from kdist_magics.strategies.sharded.outside import names_used_not_assigned

    assert names_used_not_assigned(USES_IT) == {"model", "x", "y"}
    assert names_used_not_assigned(BUILDS_ITS_OWN) == {"keras", "x", "y"}
    assert names_used_not_assigned("import keras\ndef f(m):\n    return m\nf(model)") == {"model"}
    assert names_used_not_assigned("this is ( not python") == set()
