"""Telemetry: the sampler (fast tier, fakes for psutil/NVML/TPU) and the Keras callback
(kernel tier: real Keras, a fake clock, logs fed by hand and by a tiny real fit)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import types
from pathlib import Path

import pytest

from kdist_magics.watch import sampling as sampling_mod
from kdist_magics.watch import step_probe, tpu_probe
from kdist_magics.watch import telemetry


# -- fakes ---------------------------------------------------------------------------


class FakeProcess:
    def __init__(self, pid):
        self.pid = pid
        self.calls = 0

    def cpu_percent(self, interval=None):
        self.calls += 1
        return 150.0

    def memory_info(self):
        return types.SimpleNamespace(rss=123_456_789)


class FakePsutil:
    def __init__(self):
        self.processes = []

    def Process(self, pid):
        p = FakeProcess(pid)
        self.processes.append(p)
        return p

    def cpu_count(self):
        return 4


class FakeNvml:
    """Two GPUs; this process (pid 4242) runs on GPU 1."""

    def __init__(self, pid=4242, fail_init=False):
        self.pid = pid
        self.fail_init = fail_init
        self.shutdown = False

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"FakeGPU"

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=[10, 87][h], memory=5)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=[1, 6][h] * 2**30, total=16 * 2**30, free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=self.pid)] if h == 1 else []


def no_tpu():
    return None


# -- sampler -----------------------------------------------------------------------------


class Ticks:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_cpu_percent_needs_a_window_of_a_quarter_interval():
    ticks = Ticks()
    ps = FakePsutil()
    s = sampling_mod.Sampler(lambda k, r: None, interval=1.0, psutil=ps, nvml=False, tpu_probe=no_tpu, monotonic=ticks)
    assert s.sample()["cpu_percent"] is None  # at once: no window yet
    ticks.t = 1.0
    assert s.sample()["cpu_percent"] == 150.0
    ticks.t = 1.1
    row = s.sample()
    assert row["cpu_percent"] is None and row["rss_bytes"] == 123_456_789
    ticks.t = 1.3
    assert s.sample()["cpu_percent"] == 150.0  # the window carried on from 1.0


def test_sample_row_with_fake_gpus_picks_this_process_gpu():
    ticks = Ticks()
    s = sampling_mod.Sampler(
        lambda k, r: None,
        rank=3,
        psutil=FakePsutil(),
        nvml=FakeNvml(),
        tpu_probe=no_tpu,
        pid=4242,
        clock=lambda: 100.0,
        monotonic=ticks,
    )
    ticks.t = 5.0
    row = s.sample()
    assert row["rank"] == 3 and row["time"] == 100.0 and row["pid"] == 4242
    assert row["cpu_percent"] == 150.0 and row["cpu_count"] == 4
    assert row["rss_bytes"] == 123_456_789
    assert row["accelerator"] == "gpu" and row["accelerator_note"] is None
    assert [g["index"] for g in row["gpus"]] == [1]  # the GPU this pid runs on
    assert row["gpu_util_percent"] == 87.0
    assert row["gpu_mem_used_bytes"] == 6 * 2**30 and row["gpu_mem_total_bytes"] == 16 * 2**30
    assert row["gpus"][0]["name"] == "FakeGPU"
    json.dumps(row)  # rows cross process boundaries as JSON


def test_all_visible_gpus_before_this_process_has_a_context(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    s = sampling_mod.Sampler(lambda k, r: None, psutil=FakePsutil(), nvml=FakeNvml(pid=1), tpu_probe=no_tpu, pid=999)
    assert [g["index"] for g in s.sample()["gpus"]] == [0, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    s = sampling_mod.Sampler(lambda k, r: None, psutil=FakePsutil(), nvml=FakeNvml(pid=1), tpu_probe=no_tpu, pid=999)
    assert [g["index"] for g in s.sample()["gpus"]] == [1]


def test_gpu_that_nvml_cannot_read_says_why():
    s = sampling_mod.Sampler(
        lambda k, r: None,
        psutil=FakePsutil(),
        nvml=FakeNvml(fail_init=True),
        tpu_probe=no_tpu,
        gpu_present=lambda: True,
    )
    row = s.sample()
    assert row["accelerator"] is None and row["gpus"] == []
    assert row["accelerator_note"].startswith("not available")
    assert "NVML Shared Library Not Found" in row["accelerator_note"]
    assert "gpu_util_percent" not in row


def test_no_gpu_at_all_is_cpu_only_whatever_nvml_says():
    for nvml in (FakeNvml(fail_init=True), None):
        s = sampling_mod.Sampler(
            lambda k, r: None, psutil=FakePsutil(), nvml=nvml, tpu_probe=no_tpu, gpu_present=lambda: False
        )
        assert s.sample()["accelerator_note"] == "CPU only"


def test_real_machine_without_gpu_says_cpu_only():
    # This machine has no GPU (no NVIDIA driver files), with or without pynvml installed.
    from kdist_magics.hardware import nvidia_gpu_present

    if nvidia_gpu_present():
        pytest.skip("this machine has an NVIDIA GPU")
    sampler = sampling_mod.Sampler(lambda k, r: None, interval=0.2, tpu_probe=no_tpu)
    import time

    time.sleep(0.1)
    row = sampler.sample()
    assert row["cpu_percent"] is not None and row["rss_bytes"] > 0
    assert row["accelerator"] is None and row["accelerator_note"] == "CPU only"


def test_nvidia_gpu_present_reads_the_driver_files(tmp_path):
    from kdist_magics.hardware import nvidia_gpu_present

    assert not nvidia_gpu_present(root=str(tmp_path))
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")  # the control node alone is no GPU
    assert not nvidia_gpu_present(root=str(tmp_path))
    (tmp_path / "dev" / "nvidia0").write_text("")
    assert nvidia_gpu_present(root=str(tmp_path))


def test_tpu_probe_is_used_when_there_is_no_gpu():
    tpus = [{"index": 0, "name": "/device:TPU:0", "mem_used_bytes": 2048}]
    s = sampling_mod.Sampler(lambda k, r: None, psutil=FakePsutil(), nvml=False, tpu_probe=lambda: tpus)
    row = s.sample()
    assert row["accelerator"] == "tpu" and row["tpus"] == tpus


def test_jax_tpu_probe_reads_memory_stats(monkeypatch):
    class Dev:
        platform, device_kind = "tpu", "TPU v5 lite"

        def __init__(self, i):
            self.id = i

        def memory_stats(self):
            return {"bytes_in_use": 1000 * (self.id + 1), "bytes_limit": 16_000}

    fake_jax = types.SimpleNamespace(local_devices=lambda: [Dev(0), Dev(1)])
    monkeypatch.setitem(sys.modules, "jax", fake_jax)
    monkeypatch.setattr(tpu_probe, "jax_backend_ready", lambda: True)
    row = sampling_mod.Sampler(lambda k, r: None, psutil=FakePsutil(), nvml=False).sample()
    assert row["accelerator"] == "tpu"
    assert [(t["index"], t["mem_used_bytes"], t["mem_total_bytes"]) for t in row["tpus"]] == [
        (0, 1000, 16_000),
        (1, 2000, 16_000),
    ]
    monkeypatch.setattr(tpu_probe, "jax_backend_ready", lambda: False)  # never starts JAX
    assert tpu_probe._jax_tpu_probe() is None


def test_broken_probes_never_raise():
    def boom():
        raise RuntimeError("runtime gone")

    class BadProcess(FakeProcess):
        def memory_info(self):
            raise OSError("gone")

    ps = FakePsutil()
    ps.Process = lambda pid: BadProcess(pid)
    ticks = Ticks()
    sampler = sampling_mod.Sampler(lambda k, r: None, psutil=ps, nvml=False, tpu_probe=boom, monotonic=ticks)
    ticks.t = 5.0
    row = sampler.sample()
    assert row["rss_bytes"] is None and row["cpu_percent"] == 150.0
    assert row["accelerator"] is None


@pytest.mark.timeout(60)
def test_sampling_block_sends_samples_from_a_thread_and_stops():
    rows, threads = [], set()
    got_two = threading.Event()

    def sink(kind, row):
        rows.append((kind, row))
        threads.add(threading.current_thread().name)
        if len(rows) >= 3:
            got_two.set()

    nvml = FakeNvml()
    with sampling_mod.sampling(
        sink, rank=1, interval=0.05, psutil=FakePsutil(), nvml=nvml, tpu_probe=no_tpu
    ) as sampler:
        assert got_two.wait(30), "the sampler thread sent nothing"
    n = len(rows)
    assert all(kind == "sample" and row["rank"] == 1 for kind, row in rows)
    assert "kdist-sampler-1" in threads  # periodic rows come from the daemon thread
    assert sampler._thread is None and nvml.shutdown
    import time

    time.sleep(0.2)
    assert len(rows) == n  # stopped: nothing after the block


def test_failing_sink_does_not_stop_the_sampler():
    calls = []

    def sink(kind, row):
        calls.append(1)
        raise RuntimeError("transport down")

    with sampling_mod.sampling(sink, interval=0.05, psutil=FakePsutil(), nvml=False, tpu_probe=no_tpu):
        import time

        deadline = time.time() + 20
        while len(calls) < 3 and time.time() < deadline:
            time.sleep(0.02)
    assert len(calls) >= 3


def test_loading_telemetry_imports_no_framework():
    import subprocess
    import sys

    code = (
        "import sys, kdist_magics.watch.telemetry, kdist_magics.watch.dashboard; "
        "bad=[m for m in ('tensorflow','keras','horovod','jax') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_batch_size_inference():
    import numpy as np

    assert step_probe.fit_batch_size((np.zeros((10, 2)),), {"batch_size": 8}) == 8
    assert step_probe.fit_batch_size((np.zeros((10, 2)),), {}) == 32
    assert step_probe.fit_batch_size((), {}) is None
    assert step_probe.fit_batch_size((object(),), {}) is None


# -- the Keras callback -------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_callback_throttles_steps_and_reports_progress():
    import keras

    rows = []
    clock = Clock()
    cb = telemetry.make_callback(lambda k, r: rows.append((k, r)), rank=2, batch_size=16, min_interval=0.5, clock=clock)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.125), loss="mse", metrics=["mae"])
    cb.set_model(model)
    cb.set_params({"epochs": 2, "steps": 10, "verbose": 0})
    cb.on_train_begin()
    for epoch in range(2):
        cb.on_epoch_begin(epoch)
        for batch in range(10):
            clock.t += 0.1  # 10 steps/s; rows at most every 0.5 s
            cb.on_train_batch_end(batch, {"loss": 1.0 / (epoch * 10 + batch + 1), "mae": 0.5})
        cb.on_epoch_end(epoch, {"loss": 0.1, "mae": 0.5, "val_loss": 0.2})
    cb.on_train_end()

    metrics = [r for k, r in rows if k == "metric"]
    steps = [r for r in metrics if r["kind"] == "step"]
    epochs = [r for r in metrics if r["kind"] == "epoch"]
    progress = [r for k, r in rows if k == "progress"]
    assert [r["epoch"] for r in epochs] == [0, 1] and epochs[1]["val_loss"] == 0.2
    # throttled: far fewer than 20 step rows, but the last step of each epoch is always there
    assert 4 <= len(steps) < 20
    assert {10, 20} <= {r["step"] for r in steps}
    assert all(r["rank"] == 2 and r["mae"] == 0.5 for r in steps)
    assert steps[-1]["lr"] == pytest.approx(0.125)
    # throughput from the fake clock: 10 steps/s x 16 samples
    timed = [r for r in steps if r["steps_per_s"] is not None]
    assert timed and all(r["steps_per_s"] == pytest.approx(10.0) for r in timed)
    assert all(r["samples_per_s"] == pytest.approx(160.0) for r in timed)
    # progress carries totals from Keras' params, for the ETA
    assert progress[0]["epochs"] == 2 and progress[0]["total_steps"] == 20
    assert progress[-1]["step"] == 20 and progress[-1]["steps_per_s"] == pytest.approx(10.0)
    assert all(p["fit_started"] == 1000.0 for p in progress)
    json.dumps(rows)


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_attached_adds_callback_and_opt_outs(monkeypatch):
    import keras
    import numpy as np

    rows = []
    x = np.ones((32, 2), "float32")
    y = np.ones((32, 1), "float32")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    original = keras.Model.fit
    with telemetry.attached(lambda k, r: rows.append((k, r)), rank=1):
        model.fit(x, y, epochs=2, batch_size=8, verbose=0)
        n = len(rows)
        model.fit(x, y, epochs=1, batch_size=8, verbose=0, kdist=False)  # per-call opt-out
        optout = keras.callbacks.Callback()
        optout.kdist_opt_out = True
        model.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[optout])
        model.fit(x, y, epochs=1, batch_size=8, verbose=0)  # a second fit in the same cell
    assert keras.Model.fit is original
    second = [r for k, r in rows[n:] if k == "metric"]
    assert second and all(r["fit"] == 1 for r in second)
    assert second[-1]["step"] == 8 + 4  # the curve continues after the first fit's 8 steps
    assert [r for k, r in rows[n:] if k == "progress"][-1]["step"] == 4  # progress of this fit
    rows = rows[:n]
    assert len(rows) == n and n > 0
    epochs = [r for k, r in rows if k == "metric" and r["kind"] == "epoch"]
    assert len(epochs) == 2 and all(r["rank"] == 1 for k, r in rows if k == "metric")
    assert all(isinstance(r["loss"], float) for r in epochs)
    assert any(k == "progress" and r["total_steps"] == 8 for k, r in rows)


KEEPS_ASYNC = r"""
import json, threading, numpy as np, keras
from kdist_magics.watch import telemetry
assert keras.backend.backend() == "jax", keras.backend.backend()
threads = []
def sink(kind, row):
    if kind == "metric" and row["kind"] == "step":
        threads.append(threading.current_thread() is threading.main_thread())
x = np.ones((64, 2), "float32")
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
with telemetry.attached(sink, min_interval=0.0):
    model.fit(x, x[:, :1], epochs=2, batch_size=8, verbose=0)
print("RESULT", json.dumps(threads))
"""


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_callback_keeps_keras_batch_ends_off_the_training_loop():
    """Keras 3 dispatches batch-end callbacks to a thread pool (thread-safe backends: JAX)
    only when every callback is async-safe: ours must not pull them back onto the loop."""
    import os
    import subprocess
    import sys

    pytest.importorskip("jax", reason="the jax extra gives Keras a thread-safe backend")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", KEEPS_ASYNC], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    on_main = json.loads(out.stdout.split("RESULT", 1)[1])
    assert len(on_main) == 16  # min_interval=0: every step, none lost or doubled
    assert not any(on_main)  # all ran on Keras' callback threads


def test_rows_carry_the_all_reduce_time_where_the_optimizer_times_it(monkeypatch):
    """kdist's Horovod binding sums its all-reduce's seconds on the rank: each step row carries
    the mean per step since the row before; without that binding, rows carry none."""
    import keras

    done = {"seconds": 0.0, "count": 0}
    seen = []

    def collective_timing(optimizer):
        seen.append(optimizer)
        return (done["seconds"], done["count"]) if done["count"] else None

    monkeypatch.setitem(
        sys.modules, "kdist_magics.keras_horovod._optimizer", types.SimpleNamespace(collective_timing=collective_timing)
    )
    rows, clock = [], Clock()
    cb = telemetry.make_callback(lambda k, r: rows.append(r), rank=0, batch_size=16, min_interval=0.5, clock=clock)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    cb.set_model(model)
    cb.set_params({"epochs": 1, "steps": 10, "verbose": 0})
    cb.on_train_begin()
    cb.on_epoch_begin(0)
    for batch in range(10):
        clock.t += 0.1
        done["seconds"] += 0.004 if batch < 5 else 0.010  # slower all-reduces later
        done["count"] += 1
        cb.on_train_batch_end(batch, {"loss": 1.0})
    steps = [r for r in rows if r.get("kind") == "step"]
    timed = [r["collective_time"] for r in steps if "collective_time" in r]
    assert timed and timed[0] == pytest.approx(0.004) and timed[-1] == pytest.approx(0.010)
    assert seen[0] is model.optimizer
    monkeypatch.delitem(sys.modules, "kdist_magics.keras_horovod._optimizer")
    rows.clear()
    clock.t += 1.0
    cb.on_train_batch_end(9, {"loss": 1.0})
    assert rows and "collective_time" not in rows[0]
    # a clock kdist keeps on the optimizer where it issues the collective itself (Keras on
    # PyTorch): the same figure, and none once the fit took it off again
    from kdist_magics.watch.collective import CollectiveClock

    kept = CollectiveClock.on(model.optimizer)
    for seconds in (0.002, 0.004):
        kept.add(seconds)
    rows.clear()
    clock.t += 1.0
    cb.on_train_batch_end(9, {"loss": 1.0})
    assert rows[0]["collective_time"] == pytest.approx(0.003)
    assert not model.optimizer.variables or all(v is not kept for v in model.optimizer.variables)
    CollectiveClock.off(model.optimizer)
    rows.clear()
    clock.t += 1.0
    cb.on_train_batch_end(9, {"loss": 1.0})
    assert "collective_time" not in rows[0]


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_other_callbacks_time_counts_between_steps_not_inside_them():
    """The straggler check needs the step itself timed: the user's callbacks (here 20 ms at
    batch begin and 20 ms at batch end) fall between steps, whatever their order."""
    import time as _time

    import keras
    import numpy as np

    class Slow(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            _time.sleep(0.02)

        def on_train_batch_end(self, batch, logs=None):
            _time.sleep(0.02)

    rows = []
    x = np.ones((256, 2), "float32")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with telemetry.attached(lambda k, r: rows.append((k, r)), min_interval=0.0):
        model.fit(x, x[:, :1], epochs=1, batch_size=8, verbose=0, callbacks=[Slow()])
    steps = [r for k, r in rows if k == "metric" and r["kind"] == "step"]
    assert len(steps) == 32
    later = steps[2:]  # the first steps trace the train function
    assert all(r["gap_time"] >= 0.039 for r in later)  # both sleeps, every step
    in_step = sorted(r["step_time"] for r in later)
    assert in_step[len(in_step) // 2] < 0.02  # neither sleep is inside the step


class FakeTpuMonitoring:
    """libtpu.sdk.tpumonitoring as libtpu 0.0.2x offers it: per-chip strings per metric."""

    def __init__(self, chips: int, duty: float = 87.5):
        gib = 2**30
        self.values = {
            "duty_cycle_pct": [f"{duty + i:.2f}" for i in range(chips)],
            "hbm_capacity_usage": [str(3 * gib + i) for i in range(chips)],
            "hbm_capacity_total": [str(16 * gib)] * chips,
            "tensorcore_util": ["50.0"] * chips,
        }

    def list_supported_metrics(self):
        return list(self.values)

    def get_metric(self, name):
        return types.SimpleNamespace(data=lambda: self.values[name], description=lambda: name)


@pytest.mark.parametrize("chips", [1, 8])  # Colab's v5e-1 / v6e-1, Kaggle's v5e-8
def test_the_tpus_own_duty_cycle_and_memory_come_from_libtpus_monitoring_sdk(monkeypatch, chips):
    """Duty cycle and high-bandwidth memory per chip, sampled as GPUs are, from
    libtpu's monitoring SDK where it is importable; the row says which source it read."""
    monkeypatch.setattr(tpu_probe, "_libtpu_monitoring", lambda: FakeTpuMonitoring(chips))
    row = sampling_mod.Sampler(lambda k, r: None, psutil=FakePsutil(), nvml=False).sample()
    assert row["accelerator"] == "tpu" and len(row["tpus"]) == chips
    first = row["tpus"][0]
    assert first["duty_cycle_percent"] == 87.5 and first["mem_used_bytes"] == 3 * 2**30
    assert first["mem_total_bytes"] == 16 * 2**30 and first["source"] == "libtpu monitoring SDK"
    assert row["tpus"][-1]["duty_cycle_percent"] == 87.5 + chips - 1


def test_a_tpu_that_nothing_reports_on_is_said_and_a_broken_sdk_falls_back(monkeypatch):
    from kdist_magics import hardware

    class Broken:
        def list_supported_metrics(self):
            raise RuntimeError("TPU busy")

    assert tpu_probe.libtpu_probe(Broken()) is None
    monkeypatch.setattr(tpu_probe, "_libtpu_monitoring", lambda: None)
    monkeypatch.setattr(hardware, "detect_tpu", lambda *a, **k: hardware.tpu_from_kind("v5litepod-1"))
    monkeypatch.setattr(hardware, "nvidia_gpu_present", lambda: False)
    row = sampling_mod.Sampler(lambda k, r: None, psutil=FakePsutil(), nvml=None).sample()
    assert row["accelerator"] is None and row["accelerator_note"] == sampling_mod.TPU_UNREAD


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="PSS needs Linux's /proc/<pid>/smaps_rollup")
def test_memory_shared_with_another_process_counts_once_in_the_proportional_set_size():
    """A --push's shared segment is mapped by every local engine: each one's RSS counts all of
    it, its PSS half of it when two processes map it, so the ranks' PSS add up to the host's."""
    import subprocess
    import sys
    from multiprocessing import shared_memory

    size = 64 * 2**20
    seg = shared_memory.SharedMemory(create=True, size=size)
    try:
        seg.buf[::4096] = b"\x01" * (size // 4096)  # this process maps every page
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                (
                    "import sys, time; from multiprocessing import shared_memory as s; "
                    # not tracked: a killed child's resource tracker would remove the name under us
                    f"kw = {{'track': False}} if sys.version_info >= (3, 13) else {{}}; "
                    f"m = s.SharedMemory(name={seg.name!r}, **kw); sum(m.buf[::4096]); print('in', flush=True); "
                    "time.sleep(60)"
                ),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout.readline().strip() == "in"
            row = sampling_mod.Sampler(lambda k, r: None, pid=child.pid, nvml=False, tpu_probe=no_tpu).sample()
        finally:
            child.kill()
            child.wait()
    finally:
        seg.close()
        with contextlib.suppress(FileNotFoundError):  # (before 3.13 the child's tracker may have)
            seg.unlink()
    assert row["rss_bytes"] - row["pss_bytes"] > 0.4 * size, row  # half the segment is ours


def test_libtpus_sdk_is_asked_only_once_this_process_loaded_libtpu(monkeypatch):
    """A process whose JAX or TensorFlow has not brought the TPU runtime up is left alone:
    no import of libtpu's SDK from the sampler (a sample costs no look-up either)."""
    import sys

    fake = types.ModuleType("libtpu")
    sdk = types.ModuleType("libtpu.sdk")
    sdk.tpumonitoring = FakeTpuMonitoring(1)
    monkeypatch.setitem(sys.modules, "libtpu.sdk", sdk)
    monkeypatch.delitem(sys.modules, "libtpu", raising=False)
    assert tpu_probe._libtpu_monitoring() is None  # libtpu not loaded: not even imported
    monkeypatch.setitem(sys.modules, "libtpu", fake)
    assert tpu_probe._libtpu_monitoring() is sdk.tpumonitoring  # loaded: its SDK is read


def test_the_proportional_set_size_is_read_every_few_seconds_not_every_sample():
    """The PSS read walks every mapping (~5 ms with TensorFlow loaded): once per PSS_EVERY
    seconds and at the end; in between it moves with the resident size."""
    reads = []

    class Proc:
        rss = 100

        def cpu_percent(self, _):
            return 10.0

        def memory_info(self):
            return types.SimpleNamespace(rss=self.rss)

        def memory_full_info(self):
            reads.append(self.rss)
            return types.SimpleNamespace(pss=self.rss // 2)

    proc = Proc()
    fake = types.SimpleNamespace(Process=lambda pid: proc, cpu_count=lambda: 2)
    clock = [0.0]
    sampler = sampling_mod.Sampler(
        lambda k, r: None, psutil=fake, nvml=False, tpu_probe=lambda: None, monotonic=lambda: clock[0]
    )
    rows = []
    for t in range(12):
        clock[0] = float(t)
        proc.rss = 100 + 10 * t
        rows.append(sampler.sample())
    assert reads == [100, 200]  # at 0 s and at 10 s
    assert rows[3]["pss_bytes"] == 50 + 30  # the last read moved by the resident size's change
    assert rows[10]["pss_bytes"] == 100
    sampler.stop(final=False)
    proc.rss = 400
    assert sampler.sample()["pss_bytes"] == 200 and reads[-1] == 400  # the end reads it


def test_a_slow_proportional_set_size_read_is_made_rarer():
    """A PSS read that takes 0.1 s (a loaded host, a process with many mappings) waits 0.1 /
    PSS_SHARE = 50 s for the next, so the reads stay under PSS_SHARE of a core."""
    reads, clock = [], [0.0]

    class Proc:
        def cpu_percent(self, _):
            return 10.0

        def memory_info(self):
            return types.SimpleNamespace(rss=100)

        def memory_full_info(self):
            reads.append(clock[0])
            clock[0] += 0.1  # the read itself
            return types.SimpleNamespace(pss=50)

    fake = types.SimpleNamespace(Process=lambda pid: Proc(), cpu_count=lambda: 2)
    sampler = sampling_mod.Sampler(
        lambda k, r: None, psutil=fake, nvml=False, tpu_probe=lambda: None, monotonic=lambda: clock[0]
    )
    for t in range(120):
        clock[0] = float(t)
        assert sampler.sample()["pss_bytes"] == 50
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    assert len(reads) == 3 and all(50 <= g <= 51 for g in gaps), reads  # one-second samples
    assert max(0.1 / g for g in gaps) <= sampling_mod.PSS_SHARE
