"""``%%kdist --strategy multiworker`` under ``KERAS_BACKEND=torch``: one torch process per engine.

Engines tier: a fresh kernel-like process (``KERAS_BACKEND=torch`` must hold before Keras
starts) runs, on 2 engines it starts, Keras' guide "Multi-GPU distributed training with
PyTorch" (a Keras model in ``DistributedDataParallel``, a ``DistributedSampler``, a torch
loop) and an ordinary ``model.fit``: identical weights on both processes, a falling loss, each
sample used once per epoch, ``--pull`` of a model that predicts in the kernel, the store and
Gloo on loopback only, the process group gone after the cell, and a restart (with its reason)
of engines whose Keras already ran on another backend.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import PROCESS_FIT, run_in_fresh_shell

pytestmark = pytest.mark.torch

# Keras' guide, as a cell: the process group is kdist's, so no setup_device()/cleanup()
GUIDE = """
import numpy as np, psutil, torch, keras
from kdist_magics.cluster.compat_psutil import net_connections
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 6)).astype("float32")
y = (x[:, :3].sum(axis=1) > 0).astype("int64")
dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=16)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(2)])
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
loss_fn = torch.nn.CrossEntropyLoss()
kd_guide_loss, kd_batches = [], 0
for epoch in range(5):
    total = 0.0
    for inputs, targets in loader:
        loss = loss_fn(ddp(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
        kd_batches += 1
    kd_guide_loss.append(total)
kd_guide_weights = [w.tolist() for w in model.get_weights()]
kd_listening = [(c.laddr.ip, c.laddr.port) for c in net_connections(psutil.Process(), "inet")
                if c.status == psutil.CONN_LISTEN]
kd_group = (torch.distributed.get_rank(), torch.distributed.get_world_size(),
            torch.distributed.get_backend(), strategy.num_replicas_in_sync)
"""

FIT = (
    PROCESS_FIT
    + """
kd_pred = model.predict(x[:5], verbose=0).tolist()   # every process predicts with the same model
"""
)

BODY = f"""
import numpy as np
import kdist_magics
GUIDE, FIT = {GUIDE!r}, {FIT!r}
value, err = attempt("--strategy multiworker --np 2 --no-dashboard", GUIDE)
if err is not None:
    import traceback
    print("RESULT " + json.dumps({{"err": "".join(traceback.format_exception(err))[-3000:]}}))
    raise SystemExit(0)
s = kdist_magics._extension._strategies["multiworker"]
out["cls"] = type(s).__name__
for name in ("kd_guide_weights", "kd_guide_loss", "kd_batches", "kd_listening", "kd_group"):
    out[name] = by_rank(name)
out["group_after"] = s.cluster.view().apply_sync(
    lambda: __import__("torch.distributed").distributed.is_initialized())
pids = {{e.pid for e in s.cluster.engines}}
value, err = attempt("--strategy multiworker --np 2 --no-dashboard --pull model,history", FIT)
out["fit_err"] = repr(err) if err is not None else None
out["fit_split"] = kdist_magics.last_run().split()
for name in ("kd_weights", "kd_loss", "kd_steps", "kd_pred"):
    out[name] = by_rank(name)
out["warm"] = pids == {{e.pid for e in s.cluster.engines}}
model = ip.user_ns["model"]
out["pulled"] = [w.tolist() for w in model.get_weights()]
out["kernel_pred"] = np.asarray(model.predict(np.ones((3, 4), "float32"), verbose=0)).shape
value, err = attempt("--strategy multiworker --np 2 --no-dashboard", "raise ValueError('bad shape here')")
out["raise_err"] = str(err)
# --timeout stops ranks stuck in a collective and in Python alike; the next cell works
import time as _time
t0 = _time.monotonic()
value, err = attempt("--strategy multiworker --np 2 --no-dashboard --timeout 6", "import time, torch\\nif strategy.rank == 0:\\n    torch.distributed.barrier()   # waits for rank 1 forever\\nelse:\\n    time.sleep(120)")
out["timeout_s"] = _time.monotonic() - t0
out["timeout_err"] = f"{{type(err).__name__}}: {{err}}"
value, err = attempt("--strategy multiworker --np 2 --no-dashboard", "kd_next = strategy.rank")
out["next_err"] = repr(err) if err is not None else None
out["next"] = by_rank("kd_next")
# an engine whose Keras already runs on another backend (simulated: a new engine that imported Keras on jax)
s.cluster.restart()
s.cluster.view().execute("import os; os.environ['KERAS_BACKEND'] = 'numpy'; import keras", block=True)
pids = {{e.pid for e in s.cluster.engines}}
value, err = attempt("--strategy multiworker --np 2 --no-dashboard", "kd_after = strategy.rank")
out["restart_err"] = repr(err) if err is not None else None
out["after"] = by_rank("kd_after")
out["restarted"] = not (pids & {{e.pid for e in s.cluster.engines}})
# GPU placement end to end with two (pretend) GPUs the engines are told of
# (CUDA_VISIBLE_DEVICES): one each, and the same again on the warm engines (each remembers
# the host's GPUs, not the one kdist left it). One GPU for two ranks (refused, then shared) is
# benchmarks/gpu_check.py's dry run, on torch too (tests/test_gpu_check.py)
import os
ip.run_line_magic("config", "KDist.rank_gpus = 'own'")
os.environ["CUDA_VISIBLE_DEVICES"] = "6,7"
ip.run_line_magic("kdist", "stop")
out["own"] = []
for _ in range(2):
    value, err = attempt("--strategy multiworker --np 2 --no-dashboard",
                         "import os; kd_gpu = os.environ['CUDA_VISIBLE_DEVICES']")
    out["own"].append(by_rank("kd_gpu") if err is None else str(err))
ip.run_line_magic("kdist", "stop")
"""


@pytest.mark.quick
@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_keras_on_torch_across_two_engine_processes():
    pytest.importorskip("torch", reason="PyTorch is in the torch extra (make test installs it)")
    r = run_in_fresh_shell(BODY, env={"KERAS_BACKEND": "torch"})
    assert r.get("err") is None, r["err"] + r["_stdout"][-3000:] + r["_stderr"][-2000:]
    assert r["cls"] == "TorchMultiWorkerStrategy"
    # Keras' torch guide: DDP kept both replicas identical, the loss fell, each process saw
    # its half of the data (8 of 16 batches per epoch)
    g0, g1 = r["kd_guide_weights"]
    for a, b in zip(g0, g1):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    assert r["kd_batches"] == [5 * 8, 5 * 8]
    loss = r["kd_guide_loss"][0]
    assert loss[-1] < loss[0] * 0.8, loss
    assert r["kd_group"] == [[0, 2, "gloo", 2], [1, 2, "gloo", 2]]
    # the store (rank 0) and Gloo's pairs listen on loopback only, while the group exists
    loopback = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
    listening = r["kd_listening"][0] + r["kd_listening"][1]
    assert r["kd_listening"][0] and all(ip in loopback for ip, _ in listening), r["kd_listening"]
    assert r["group_after"] == [False, False]  # torn down after the cell
    # model.fit: kdist averages every step's gradients, so the processes end identical
    assert r["fit_err"] is None, r["fit_err"]
    # kdist's all_reduce of the gradients is timed where it runs (Gloo, on the CPU): the split
    # is measured, communication one figure for both ranks, each rank's wait its own
    split = r["fit_split"]
    assert [row["rank"] for row in split] == [0, 1], split
    assert all("all-reduce timed on every rank" in row["source"] for row in split), split
    assert split[0]["communication_s"] == split[1]["communication_s"] > 0, split
    assert min(row["wait_s"] for row in split) == 0.0, split
    w0, w1 = r["kd_weights"]
    for a, b in zip(w0, w1):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-6, atol=1e-7)
    l0 = r["kd_loss"][0]
    assert l0[-1] < l0[0] / 2, l0
    assert r["kd_steps"] == [8 * 4, 8 * 4]  # 128 samples each, batches of 16
    np.testing.assert_allclose(np.array(r["kd_pred"][0]), np.array(r["kd_pred"][1]), rtol=1e-5)
    assert "leaving out the last 1 of 257 training samples" in r["_stdout"]
    for got, want in zip(r["pulled"], w0):  # --pull brought rank 0's model; it predicts here
        np.testing.assert_allclose(np.array(got), np.array(want))
    assert r["kernel_pred"] == [3, 1] and r["warm"]
    assert "rank 0" in r["raise_err"] and "bad shape here" in r["raise_err"], r["raise_err"]
    # Keras already on another backend on the engines: restarted first, and kdist says why
    assert r["restart_err"] is None and r["after"] == [0, 1] and r["restarted"]
    assert "restarting the engines (Keras already runs on numpy on rank 0)" in r["_stdout"] + r["_stderr"]
    assert r["own"] == [["6", "7"], ["6", "7"]], r["own"]
    # --timeout: a run with a rank stuck in a collective ends, named, and the next cell works
    assert r["timeout_err"].startswith("RunTimedOut"), r["timeout_err"]
    assert r["timeout_s"] < 60, r["timeout_s"]
    assert r["next_err"] is None and r["next"] == [0, 1], r["next_err"]


@pytest.mark.engines
@pytest.mark.slow
def test_switching_the_keras_backend_between_cells_gets_engines_for_the_new_one():
    """As a newcomer hit it: a multiworker cell on TensorFlow, then
    ``os.environ['KERAS_BACKEND'] = 'torch'`` and the same cell: it ran on the old TensorFlow
    engines, and with ``--np 3`` every start died (SIGABRT: TensorFlow preloaded under torch)."""
    cell = "import keras\nkd_backend = keras.backend.backend()"
    out = run_in_fresh_shell(
        f"""
import os
for np_, backend in ((2, "tensorflow"), (2, "torch"), (3, "torch")):
    os.environ["KERAS_BACKEND"] = backend
    _, exc = attempt(f"--strategy multiworker --np {{np_}} --no-dashboard", {cell!r})
    out[f"{{backend}} {{np_}}"] = [repr(exc), by_rank("kd_backend") if exc is None else None]
ip.run_line_magic("kdist", "stop")
""",
        {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert out["tensorflow 2"] == ["None", ["tensorflow"] * 2], out
    assert out["torch 2"] == ["None", ["torch"] * 2], out["_stdout"][-2000:]
    assert out["torch 3"] == ["None", ["torch"] * 3], out["_stdout"][-2000:]
    assert "Keras' backend is now torch (it was tensorflow" in out["_stdout"]
