"""``%%kdist --strategy multiworker`` under ``KERAS_BACKEND=jax``: one JAX process per engine.

Fast tier: each process's part of in-memory arrays (no JAX processes). Engines tier: a fresh
kernel-like process (``KERAS_BACKEND=jax`` must hold before Keras starts) runs the cells
through IPython on 2 engines it starts: the same seed on both, identical weights, a falling
loss, each sample used once per epoch, ``--pull`` of a model that predicts in the kernel, the
coordinator on loopback only, warm reuse, and a restart (with its reason) of engines where JAX
had already started.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import PROCESS_FIT, run_in_fresh_shell
from kdist_magics.strategies.frameworks.fit_data import shard as _shard


pytestmark = pytest.mark.notf  # also in .venv-colab-tpu: no TensorFlow (tests/README.md)


def test_each_process_gets_an_equal_contiguous_part():
    x, y = np.arange(10)[:, None], np.arange(10)
    said = []
    parts = [_shard({"x": x, "y": y, "sample_weight": None}, r, 3, "training", said.append) for r in range(3)]
    assert [p["x"][:, 0].tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert [p["y"].tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert all(p["sample_weight"] is None for p in parts)
    assert said[0] == (
        "kdist: leaving out the last 1 of 10 training samples so every process gets 3 "
        "(the same number of steps on each)"
    )
    dicts = _shard({"x": {"a": x, "b": x * 2}, "y": y, "sample_weight": None}, 1, 2, "training", said.append)
    assert dicts["x"]["b"][:, 0].tolist() == [10, 12, 14, 16, 18]
    with pytest.raises(ValueError, match="cannot be shared by 3 processes"):
        _shard({"x": x[:2], "y": y[:2]}, 0, 3, "training", said.append)


def test_multiworker_follows_the_keras_backend(monkeypatch):
    import sys

    from kdist_magics.strategies.multiworker import tf_workers as multiworker

    monkeypatch.delitem(sys.modules, "keras", raising=False)
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert type(multiworker.for_backend()).__name__ == "JaxMultiWorkerStrategy"
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    from kdist_magics.strategies.frameworks.backends import tensorflow_installed

    if tensorflow_installed():
        assert type(multiworker.for_backend()).__name__ == "MultiWorkerStrategy"
    else:  # Colab's TPU runtime: MultiWorkerMirroredStrategy is refused in one line
        from kdist_magics.errors import StrategyUnavailable

        with pytest.raises(StrategyUnavailable, match="needs TensorFlow, which is not installed"):
            multiworker.for_backend()


TRAIN = (
    PROCESS_FIT
    + """
kd_replicas = strategy.num_replicas_in_sync
kd_eval = float(model.evaluate(x, y, batch_size=16, verbose=0))
"""
)

BODY = f"""
import sys
import numpy as np
import kdist_magics
TRAIN = {TRAIN!r}
value, err = attempt("--strategy multiworker --np 2 --no-dashboard --pull model,history", TRAIN)
out["err"] = repr(err) if err is not None else None
if err is not None:
    import traceback
    print("RESULT " + json.dumps({{"err": "".join(traceback.format_exception(err))[-3000:]}}))
    raise SystemExit(0)
s = kdist_magics._extension._strategies["multiworker"]
out["cls"] = type(s).__name__
out["coordinator"] = s.coordinator
for name in ("kd_weights", "kd_loss", "kd_steps", "kd_replicas", "kd_eval", "kd_first"):
    out[name] = by_rank(name)
model = ip.user_ns["model"]
out["pulled"] = [w.tolist() for w in model.get_weights()]
out["kernel_pred"] = np.asarray(model.predict(np.ones((3, 4), "float32"), verbose=0)).shape
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from kernel_driver import listening_sockets  # each process's own network (a private one too)
out["listening"] = [(x["address"], x["port"]) for x in listening_sockets(s.cluster._process_tree_pids())]
pids = {{e.pid for e in s.cluster.engines}}
value, err = attempt("--strategy multiworker --np 2 --no-dashboard", "kd_again = (strategy.process_index, strategy.num_processes)")
out["again_err"] = repr(err) if err is not None else None
out["again"] = by_rank("kd_again")
out["warm"] = pids == {{e.pid for e in s.cluster.engines}}
# launcher code: the cell's own initialize calls (none, matching) are no-ops; contradicting: one line
value, err = attempt("--strategy multiworker --np 2 --no-dashboard", "import jax, keras\\n"
                     "jax.distributed.initialize()\\nkeras.distribution.initialize()\\n"
                     "jax.distributed.initialize('localhost:1234', num_processes=2, process_id=jax.process_index())\\n"
                     "kd_joined = (jax.process_index(), jax.process_count())")
out["joined"] = by_rank("kd_joined") if err is None else repr(err)
value, err = attempt("--strategy multiworker --np 2 --no-dashboard",
                     "import jax\\njax.distributed.initialize(num_processes=4)")
out["joined_mismatch"] = str(err)
value, err = attempt("--strategy multiworker --np 2 --no-dashboard", "model.predict(np.ones((4, 4)))")
out["predict_err"] = str(err)
# --timeout stops ranks stuck in a collective and in Python alike; the next cell works
import time as _time
t0 = _time.monotonic()
value, err = attempt("--strategy multiworker --np 2 --no-dashboard --timeout 6", "import time\\nfrom jax.experimental import multihost_utils\\nif strategy.process_index == 0:\\n    multihost_utils.sync_global_devices('kd')   # waits for process 1 forever\\nelse:\\n    time.sleep(120)")
out["timeout_s"] = _time.monotonic() - t0
out["timeout_err"] = f"{{type(err).__name__}}: {{err}}"
value, err = attempt("--strategy multiworker --np 2 --no-dashboard", "kd_next = strategy.process_index")
out["next_err"] = repr(err) if err is not None else None
out["next"] = by_rank("kd_next")
# an engine where JAX started outside kdist (simulated: a new engine process that used JAX)
s.cluster.restart()
s.cluster.view().execute("import jax.numpy as jnp; _ = jnp.ones(2) + 1", block=True)
pids = {{e.pid for e in s.cluster.engines}}
value, err = attempt("--strategy multiworker --np 2 --no-dashboard", "kd_after = strategy.process_index")
out["restart_err"] = repr(err) if err is not None else None
out["after"] = by_rank("kd_after")
out["restarted"] = not (pids & {{e.pid for e in s.cluster.engines}})
ip.run_line_magic("kdist", "stop")
"""


@pytest.mark.quick
@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_keras_on_jax_across_two_engine_processes():
    pytest.importorskip("jax", reason="JAX is in the jax extra (make test installs it)")
    r = run_in_fresh_shell(BODY, env={"KERAS_BACKEND": "jax"})
    assert r["err"] is None, r["err"] + r["_stdout"][-3000:] + r["_stderr"][-2000:]
    assert r["cls"] == "JaxMultiWorkerStrategy"
    w0, w1 = r["kd_weights"]
    assert r["kd_first"][0] == r["kd_first"][1]  # the same seed on both processes
    for a, b in zip(w0, w1):  # trained as one model
        np.testing.assert_array_equal(np.array(a), np.array(b))
    loss0, loss1 = r["kd_loss"]
    assert loss0 == loss1 and loss0[-1] < loss0[0] / 2, loss0
    # each process trained on its 128 samples: 8 steps of 16 per epoch, not 17 (the whole array)
    assert r["kd_steps"] == [8 * 4, 8 * 4] and r["kd_replicas"] == [2, 2]
    assert r["kd_eval"][0] == r["kd_eval"][1]
    assert "leaving out the last 1 of 257 training samples" in r["_stdout"]
    for got, want in zip(r["pulled"], w0):  # --pull brought rank 0's model; it predicts here
        np.testing.assert_allclose(np.array(got), np.array(want))
    assert r["kernel_pred"] == [3, 1]
    # JAX's coordinator listens on loopback only (coordinator_bind_address; an IPv6 socket
    # bound to the IPv4-mapped 127.0.0.1), at the planned port; so does every other socket of
    # the cluster's processes (Gloo's included)
    host, port = r["coordinator"].rsplit(":", 1)
    loopback = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
    assert host == "127.0.0.1" and [ip for ip, p in r["listening"] if p == int(port)], r["listening"]
    assert r["listening"] and all(ip in loopback for ip, _ in r["listening"]), r["listening"]
    # jax.distributed.initialize()/keras.distribution.initialize() inside the run join it
    assert r["joined"] == [[0, 2], [1, 2]], r["joined"]
    assert "LauncherMismatch" in r["joined_mismatch"] and "give --np 4" in r["joined_mismatch"]
    # warm engines keep their process group
    assert r["again_err"] is None and r["again"] == [[0, 2], [1, 2]] and r["warm"]
    assert "predict() inside a multiworker JAX cell" in r["predict_err"]
    # JAX already started on the engines: restarted first, and kdist says why
    assert r["restart_err"] is None and r["after"] == [0, 1] and r["restarted"]
    assert "restarting the engines (JAX already started on rank 0, 1" in r["_stdout"] + r["_stderr"]
    # --timeout: a run with a rank stuck in a collective ends, named, and the next cell works
    assert r["timeout_err"].startswith("RunTimedOut"), r["timeout_err"]
    assert r["timeout_s"] < 60, r["timeout_s"]
    assert r["next_err"] is None and r["next"] == [0, 1], r["next_err"]
