"""keras_mwms: Keras 3 ``fit`` under MultiWorkerMirroredStrategy (keras-team/keras#20585).

Two real TensorFlow workers (subprocesses, TF_CONFIG with two loopback ports)
train a tiny model with ``fit``; each seeds its initial weights differently.
With the fix both end with identical weights and the same falling loss. Stock
Keras must still fail the way the issue says: when that test fails, Keras has
fixed the bug, and ``kdist_magics/strategies/multiworker/keras_mwms.py`` should get ``FIXED_IN`` and go.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT

from kdist_magics.cluster.network import free_ports

WORKER = Path(__file__).parent / "workers" / "keras_mwms_worker.py"


def run_workers(fix: bool, n: int = 2, timeout: float = 300) -> list[dict]:
    """Start ``n`` workers, wait for all, return each one's RESULT/ERROR line as a dict."""
    ports = ",".join(map(str, free_ports(n)))
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), ports, "1" if fix else "0"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            lines = [ln for ln in stdout.splitlines() if ln.startswith(("RESULT ", "ERROR "))]
            assert lines, f"worker said nothing (status {p.returncode}):\n{stderr[-3000:]}"
            kind, _, payload = lines[-1].partition(" ")
            out.append({"kind": kind, **json.loads(payload), "stderr": stderr})
    finally:
        for p in procs:  # only our own children, by handle
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


@pytest.fixture(scope="module")
def fixed():
    return run_workers(fix=True)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fit_with_the_fix_gives_identical_weights_and_falling_loss(fixed):
    assert [r["kind"] for r in fixed] == ["RESULT", "RESULT"], [r.get("message") for r in fixed]
    a, b = fixed
    assert a["fix_active"] and b["fix_active"]
    assert not a["patched_after"] and not b["patched_after"]  # Keras restored after the block
    for wa, wb in zip(a["weights"], b["weights"]):  # different seeds, one synchronised model
        np.testing.assert_array_equal(np.array(wa), np.array(wb))
    assert a["loss"] == b["loss"]  # logs are the mean over both workers
    loss = a["loss"]
    assert loss[-1] < loss[0] / 2, loss
    # validation, evaluate and predict run too, with the same numbers on both workers
    assert a["val_loss"] == b["val_loss"] and a["evaluate"] == b["evaluate"]
    assert a["predict_shape"] == b["predict_shape"] == [40, 1]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_stock_keras_still_fails_as_in_the_issue():
    """When this fails, Keras fixed #20585: set keras_mwms.FIXED_IN and drop the patch."""
    results = run_workers(fix=False)
    assert [r["kind"] for r in results] == ["ERROR", "ERROR"], results
    for r in results:
        assert r["type"] == "ValueError"
        assert "unsupported type" in r["message"] and "PerReplica" in r["message"]


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_applied_leaves_other_strategies_to_keras_and_restores_it():
    code = r"""
import json, os
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np, keras, tensorflow as tf
from keras.src.backend.tensorflow import trainer
from kdist_magics.strategies.multiworker import keras_mwms
build, logs = trainer.TensorFlowTrainer._maybe_symbolic_build, trainer.reduce_per_replica
out = {"needed": keras_mwms.needed()[0]}
x = np.ones((8, 2), "float32"); y = np.ones((8, 1), "float32")
with keras_mwms.applied() as on:
    out["on"] = on
    out["patched"] = trainer.reduce_per_replica is not logs and \
        trainer.TensorFlowTrainer._maybe_symbolic_build is not build
    with keras_mwms.applied() as again:  # nested: still on, restored only at the outer exit
        out["nested"] = again
    out["still_patched"] = keras_mwms.active()
    for strategy in (None, tf.distribute.OneDeviceStrategy("/cpu:0")):
        scope = strategy.scope() if strategy else tf.name_scope("plain")
        with scope:
            m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            m.compile("sgd", "mse")
        out.setdefault("fit", []).append(len(m.fit(x, y, epochs=1, verbose=0).history["loss"]))
out["restored"] = (trainer.reduce_per_replica is logs
                   and trainer.TensorFlowTrainer._maybe_symbolic_build is build
                   and not keras_mwms.active())
print("RESULT " + json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][7:])
    assert out == {
        "needed": True,
        "on": True,
        "patched": True,
        "nested": True,
        "still_patched": True,
        "fit": [1, 1],
        "restored": True,
    }


def test_version_parsing_and_the_issue_link():
    from kdist_magics.strategies.multiworker import keras_mwms

    assert keras_mwms._version("3.15.1") == (3, 15, 1)
    assert keras_mwms._version("3.16.0.dev2026") == (3, 16, 0)
    assert keras_mwms._version("2.15.0") < (3,)
    assert keras_mwms.ISSUE.endswith("/keras-team/keras/issues/20585")
    assert keras_mwms.__doc__ and keras_mwms.ISSUE in keras_mwms.__doc__
