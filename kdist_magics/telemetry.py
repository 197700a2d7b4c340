"""Telemetry: what each rank (or the kernel) reports while a ``%%kdist`` cell trains.

Two entry points, both context managers feeding plain JSON-able dict rows to
``sink(kind, row)`` (``kind`` is ``metric``, ``progress`` or ``sample``), so
rows can cross process boundaries unchanged:

* :func:`attached` -- every ``keras.Model.fit`` called inside the block gets a
  :class:`KDistCallback` appended. It emits

  - ``metric`` rows ``{rank, epoch, step, batch, time, kind: "step", loss, <metrics>,
    lr, steps_per_s, samples_per_s}`` at most every ``min_interval`` seconds
    (plus the last step of every epoch), and ``kind: "epoch"`` rows with the
    epoch logs (validation metrics included) at every epoch end;
  - ``progress`` rows ``{rank, epochs, steps_per_epoch, epoch, step, total_steps,
    fit_started, time, samples_per_s, steps_per_s}`` with the same throttle.

  Throttling keeps the per-step cost to a clock read and a comparison; rows
  (and, on TensorFlow, the learning-rate read) happen a few times a second.
  The callback is ``async_safe``: on backends where Keras runs batch-end
  callbacks on a thread pool (JAX), it does not pull them back onto the
  training loop.

* :func:`sampling` -- a daemon thread samples this process every ``interval``
  seconds: ``{rank, time, pid, host, cpu_percent, cpu_count, rss_bytes,
  accelerator, gpus: [...], gpu_util_percent, gpu_mem_used_bytes,
  gpu_mem_total_bytes, tpus: [...], accelerator_note}``. GPUs come from NVML
  (``pynvml``, from the ``nvidia-ml-py`` package) when it initialises; TPU
  memory from JAX's ``Device.memory_stats()`` or TensorFlow's
  ``get_memory_info``, when that runtime is already up in the process and sees
  TPUs; otherwise ``accelerator`` is None and
  ``accelerator_note`` says why ("not available: ..."). ``psutil``, NVML and
  the TPU probe are injectable so tests use fakes.

Nothing here imports TensorFlow or Keras at module import.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any, Callable

Sink = Callable[[str, dict[str, Any]], None]

#: default seconds between step rows (and progress rows) from one rank
MIN_INTERVAL = 0.2
#: default seconds between utilisation samples
SAMPLE_INTERVAL = 1.0


def _number(value: Any):
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if out == out else None  # NaN -> None keeps rows JSON-able


def _learning_rate(model) -> float | None:
    try:
        return _number(model.optimizer.learning_rate)
    except Exception:
        try:
            import keras

            return _number(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        except Exception:
            return None


def make_callback(sink: Sink, rank: int = 0, batch_size: int | None = None,
                  min_interval: float = MIN_INTERVAL, clock: Callable[[], float] = time.time,
                  step_offset: int = 0, fit_index: int = 0):
    """A Keras callback sending throttled step rows, epoch rows and progress to ``sink``.

    ``batch_size`` (samples per step, when known) turns steps/s into samples/s.
    ``clock`` is injectable for tests. Rows' ``step`` counts from ``step_offset``, so
    several ``fit`` calls in one cell draw one continuous curve (``fit`` says which);
    progress rows count the steps of this ``fit``.
    """
    import keras

    class KDistCallback(keras.callbacks.Callback):
        """Sends loss/metrics/lr/throughput per step (throttled) and per epoch to kdist.

        ``async_safe``: Keras 3 runs batch-end callbacks on a thread pool, off the
        training loop, only when every callback says it is safe; a callback without it
        would make every step wait for its logs. Batch ends may therefore arrive on
        several threads (and slightly out of order): a lock guards the state, and the
        step number comes from (epoch, batch), not from a counter.
        """

        async_safe = True

        def __init__(self):
            super().__init__()
            self._lock = threading.Lock()
            self.rank = rank
            self.batch_size = batch_size
            self.min_interval = min_interval
            self.epoch = 0
            self.step = 0  # steps done in this fit, over all epochs
            self.epochs = None
            self.steps_per_epoch = None
            self.fit_started = None
            self._last_emit = None
            self.lr = None
            # Reading the optimizer from a batch-end callback is only safe where Keras runs
            # those on the training thread (TensorFlow); on JAX they run on a thread pool
            # while the next step may be donating the very buffers, so lr is read at train
            # begin and epoch ends (training thread, state synced) and reused in between.
            self._live_lr = keras.backend.backend() == "tensorflow"
            self._last_emit_step = 0

        # -- helpers ---------------------------------------------------------
        def _rates(self, now: float) -> dict[str, Any]:
            dt = now - self._last_emit if self._last_emit is not None else None
            steps = self.step - self._last_emit_step
            if not dt or dt <= 0 or steps <= 0:
                return {"steps_per_s": None, "samples_per_s": None}
            sps = steps / dt
            return {"steps_per_s": sps,
                    "samples_per_s": sps * self.batch_size if self.batch_size else None}

        def _progress(self, now: float, rates: dict[str, Any]) -> None:
            total = (self.epochs * self.steps_per_epoch
                     if self.epochs and self.steps_per_epoch else None)
            sink("progress", {"rank": rank, "epochs": self.epochs,
                              "steps_per_epoch": self.steps_per_epoch, "epoch": self.epoch,
                              "step": self.step, "total_steps": total,
                              "fit_started": self.fit_started, "time": now, **rates})

        # -- Keras hooks -----------------------------------------------------
        def on_train_begin(self, logs=None):
            params = self.params or {}
            self.epochs = params.get("epochs")
            self.steps_per_epoch = params.get("steps")
            self.fit_started = self._last_emit = clock()
            self.lr = _learning_rate(self.model)
            self._last_emit_step = 0
            self._progress(self.fit_started, {"steps_per_s": None, "samples_per_s": None})

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            with self._lock:
                self._batch_end(batch, logs)

        def _batch_end(self, batch, logs):
            if self.steps_per_epoch:
                self.step = max(self.step, self.epoch * self.steps_per_epoch + batch + 1)
            else:
                self.step += 1
            now = clock()
            last_of_epoch = self.steps_per_epoch is not None and batch + 1 >= self.steps_per_epoch
            if (not last_of_epoch and self._last_emit is not None
                    and now - self._last_emit < self.min_interval):
                return  # throttled: no row
            rates = self._rates(now)
            row = {"rank": rank, "epoch": self.epoch, "step": step_offset + self.step,
                   "batch": batch, "fit": fit_index, "time": now, "kind": "step"}
            row.update({k: _number(v) for k, v in (logs or {}).items()})
            if self._live_lr:
                self.lr = _learning_rate(self.model)
            row["lr"] = self.lr
            row.update(rates)
            sink("metric", row)
            self._progress(now, rates)
            self._last_emit, self._last_emit_step = now, self.step

        def on_epoch_end(self, epoch, logs=None):
            with self._lock:
                self._epoch_end(epoch, logs)

        def _epoch_end(self, epoch, logs):
            now = clock()
            row = {"rank": rank, "epoch": epoch, "step": step_offset + self.step, "fit": fit_index,
                   "time": now, "kind": "epoch"}
            row.update({k: _number(v) for k, v in (logs or {}).items()})
            row["lr"] = self.lr = _learning_rate(self.model)
            elapsed = now - (self.fit_started or now)
            sps = self.step / elapsed if elapsed > 0 else None
            row["steps_per_s"] = sps
            row["samples_per_s"] = sps * self.batch_size if sps and self.batch_size else None
            sink("metric", row)

        def on_train_end(self, logs=None):
            now = clock()
            elapsed = now - (self.fit_started or now)
            sps = self.step / elapsed if elapsed > 0 and self.step else None
            self._progress(now, {"steps_per_s": sps, "samples_per_s":
                                 sps * self.batch_size if sps and self.batch_size else None})

    return KDistCallback()


def _batch_size(args: tuple, kwargs: dict[str, Any]) -> int | None:
    """Samples per step of a ``fit(x, ...)`` call, when it can be known without touching data."""
    if kwargs.get("batch_size"):
        return int(kwargs["batch_size"])
    x = args[0] if args else kwargs.get("x")
    if x is None:
        return None
    if hasattr(x, "shape") or isinstance(x, (list, tuple, dict)):
        return 32  # Keras' default for array-like input
    try:
        spec = getattr(x, "element_spec", None)  # tf.data.Dataset
        first = spec[0] if isinstance(spec, tuple) else spec
        dim = first.shape[0] if first is not None else None
        return int(dim) if dim else None
    except Exception:
        return None


@contextlib.contextmanager
def attached(sink: Sink, rank: int = 0, min_interval: float = MIN_INTERVAL):
    """Within the block, ``keras.Model.fit`` gets the kdist callback appended.

    A ``fit`` that already carries a callback with ``kdist_opt_out = True`` (or is
    called with ``kdist=False``) is left alone: that is the per-call opt-out.
    """
    import keras

    original = keras.Model.fit
    done = {"steps": 0, "fits": 0}  # over the fits of this block (one cell)

    def fit(model, *args, **kwargs):
        __tracebackhide__ = True  # IPython leaves kdist's wrapper out of the user's traceback
        enabled = kwargs.pop("kdist", True)
        callbacks = list(kwargs.pop("callbacks", None) or [])
        cb = None
        if enabled and not any(getattr(c, "kdist_opt_out", False) for c in callbacks):
            cb = make_callback(sink, rank, batch_size=_batch_size(args, kwargs),
                               min_interval=min_interval, step_offset=done["steps"],
                               fit_index=done["fits"])
            callbacks.append(cb)
        try:
            return original(model, *args, callbacks=callbacks, **kwargs)
        finally:
            if cb is not None:
                done["steps"] += cb.step
                done["fits"] += 1

    fit.__wrapped__ = original
    fit.__doc__ = original.__doc__
    keras.Model.fit = fit
    try:
        yield
    finally:
        keras.Model.fit = original


# -- utilisation sampling -------------------------------------------------------

class _NvmlProbe:
    """Per-GPU utilisation and memory through NVML (``pynvml``)."""

    def __init__(self, nvml, pid: int):
        self.nvml = nvml
        self.pid = pid
        nvml.nvmlInit()
        self.count = nvml.nvmlDeviceGetCount()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]
        self.visible = self._visible()

    def _visible(self) -> list[int]:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if env is None or env.strip() == "":
            return list(range(self.count))
        out = []
        for part in env.split(","):
            part = part.strip()
            if part.isdigit() and int(part) < self.count:
                out.append(int(part))
        return out  # UUID lists: fall back on "whose processes run where" below

    def _mine(self) -> list[int]:
        """GPUs on which this process has a context (a Horovod rank's own GPU)."""
        mine = []
        getter = getattr(self.nvml, "nvmlDeviceGetComputeRunningProcesses", None)
        if getter is None:
            return mine
        for i, h in enumerate(self.handles):
            try:
                if any(getattr(p, "pid", None) == self.pid for p in getter(h)):
                    mine.append(i)
            except Exception:
                continue
        return mine

    def read(self) -> list[dict[str, Any]]:
        indices = self._mine() or self.visible or list(range(self.count))
        gpus = []
        for i in indices:
            h = self.handles[i]
            entry: dict[str, Any] = {"index": i}
            try:
                name = self.nvml.nvmlDeviceGetName(h)
                entry["name"] = name.decode() if isinstance(name, bytes) else str(name)
            except Exception:
                entry["name"] = f"GPU {i}"
            try:
                entry["util_percent"] = float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                entry["util_percent"] = None
            try:
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
                entry["mem_used_bytes"], entry["mem_total_bytes"] = int(mem.used), int(mem.total)
            except Exception:
                entry["mem_used_bytes"] = entry["mem_total_bytes"] = None
            gpus.append(entry)
        return gpus

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def _jax_tpu_probe() -> list[dict[str, Any]] | None:
    """TPU memory from JAX (``Device.memory_stats()``), only when JAX is already imported and
    its backend is already up on TPU (this never initialises a backend)."""
    import sys

    jax = sys.modules.get("jax")
    if jax is None or not _jax_backend_ready():  # not initialised yet: leave it alone
        return None
    try:
        devices = [d for d in jax.local_devices() if d.platform == "tpu"]
    except Exception:
        return None
    out = []
    for d in devices:
        entry: dict[str, Any] = {"index": d.id, "name": str(getattr(d, "device_kind", "TPU"))}
        try:
            stats = d.memory_stats() or {}
            entry["mem_used_bytes"] = stats.get("bytes_in_use")
            entry["mem_total_bytes"] = stats.get("bytes_limit")
        except Exception:
            entry["mem_used_bytes"] = None
        out.append(entry)
    return out or None


def _jax_backend_ready() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", None))
    except Exception:
        return False


def _tpu_probe() -> list[dict[str, Any]] | None:
    """What the runtime already running in this process says about its TPUs (JAX, then TF)."""
    return _jax_tpu_probe() or _tensorflow_tpu_probe()


def _tensorflow_tpu_probe() -> list[dict[str, Any]] | None:
    """TPU memory from TensorFlow, only when TensorFlow is already imported and sees TPUs."""
    import sys

    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    try:
        tpus = tf.config.list_logical_devices("TPU")
    except Exception:
        return None
    if not tpus:
        return None
    out = []
    for i, dev in enumerate(tpus):
        entry: dict[str, Any] = {"index": i, "name": dev.name}
        try:
            info = tf.config.experimental.get_memory_info(dev.name)
            entry["mem_used_bytes"] = int(info.get("current", 0))
            entry["mem_peak_bytes"] = int(info.get("peak", 0))
        except Exception:
            entry["mem_used_bytes"] = None
        out.append(entry)
    return out


#: the device line of a rank with neither GPU nor TPU
CPU_ONLY = "CPU only"


class Sampler:
    """Samples one process (and its accelerators) into ``sink`` from a daemon thread.

    ``psutil``: the module (or a fake with ``Process`` and ``cpu_count``).
    ``nvml``: the ``pynvml`` module, a fake, ``None`` to import ``pynvml`` when
    present, or ``False`` to skip GPUs. ``tpu_probe``: a callable returning a
    list of TPU dicts or None (default: TensorFlow's, when TF is imported).
    ``gpu_present``: whether an NVIDIA GPU exists (default: the driver's files); without
    one the device line is "CPU only", with one that NVML cannot read, NVML's reason.
    """

    def __init__(self, sink: Sink, rank: int = 0, interval: float = SAMPLE_INTERVAL, *,
                 psutil=None, nvml=None, tpu_probe: Callable[[], Any] | None = None,
                 pid: int | None = None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 gpu_present: Callable[[], bool] | None = None):
        self.sink = sink
        self.monotonic = monotonic
        self.rank = rank
        self.interval = max(0.05, float(interval))
        self.clock = clock
        self.pid = pid or os.getpid()
        self.host = socket.gethostname()
        if psutil is None:
            try:
                import psutil  # noqa: F811
            except ImportError:  # pragma: no cover - psutil is a core dependency
                psutil = None
        self.psutil = psutil
        self.process = psutil.Process(self.pid) if psutil is not None else None
        self.cpu_count = (psutil.cpu_count() or 1) if psutil is not None else (os.cpu_count() or 1)
        self.gpu, self.note = None, None
        if nvml is not False:
            if nvml is None:
                try:
                    import pynvml as nvml  # type: ignore[no-redef]
                except ImportError:
                    nvml = None
                    self.note = "not available: pynvml is not installed (pip install nvidia-ml-py)"
            if nvml is not None:
                try:
                    self.gpu = _NvmlProbe(nvml, self.pid)
                    if not self.gpu.count:
                        self.note, self.gpu = "not available: NVML sees no GPU", None
                except Exception as exc:
                    self.note = f"not available: NVML: {exc or type(exc).__name__}"
                    self.gpu = None
        else:
            self.note = "not available: GPU sampling disabled"
        if self.gpu is None and nvml is not False:
            from .hardware import nvidia_gpu_present

            if not (gpu_present or nvidia_gpu_present)():
                self.note = CPU_ONLY  # no NVIDIA GPU here: NVML's absence is no news
        self.tpu_probe = tpu_probe if tpu_probe is not None else _tpu_probe
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_since = monotonic()
        if self.process is not None:
            with contextlib.suppress(Exception):
                self.process.cpu_percent(None)  # prime: the next call measures from here

    def sample(self) -> dict[str, Any]:
        """One sample row (also usable without the thread)."""
        row: dict[str, Any] = {"rank": self.rank, "time": self.clock(), "pid": self.pid,
                               "host": self.host, "cpu_count": self.cpu_count,
                               "cpu_percent": None, "rss_bytes": None}
        if self.process is not None:
            # CPU % is over the time since the last reading; under a quarter of the
            # interval (the sample at start, or one at the end right after a periodic one)
            # it is mostly rounding, so it is left out and the window carries on.
            now = self.monotonic()
            if now - self._cpu_since >= 0.25 * self.interval:
                with contextlib.suppress(Exception):
                    row["cpu_percent"] = float(self.process.cpu_percent(None))
                    self._cpu_since = now
            with contextlib.suppress(Exception):
                row["rss_bytes"] = int(self.process.memory_info().rss)
        gpus = []
        if self.gpu is not None:
            with contextlib.suppress(Exception):
                gpus = self.gpu.read()
        tpus = None
        if not gpus:
            with contextlib.suppress(Exception):
                tpus = self.tpu_probe()
        row["gpus"] = gpus
        if gpus:
            row["accelerator"], row["accelerator_note"] = "gpu", None
            first = gpus[0]
            row["gpu_util_percent"] = first.get("util_percent")
            row["gpu_mem_used_bytes"] = first.get("mem_used_bytes")
            row["gpu_mem_total_bytes"] = first.get("mem_total_bytes")
        elif tpus:
            row["accelerator"], row["accelerator_note"] = "tpu", None
            row["tpus"] = tpus
        else:
            row["accelerator"] = None
            row["accelerator_note"] = self.note or CPU_ONLY
        return row

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sink("sample", self.sample())
            except Exception:
                pass  # a failing view or transport never stops sampling, nor training

    def start(self) -> "Sampler":
        with contextlib.suppress(Exception):
            self.sink("sample", self.sample())
        self._thread = threading.Thread(target=self._loop, name=f"kdist-sampler-{self.rank}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, final: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if final:
            with contextlib.suppress(Exception):
                self.sink("sample", self.sample())
        if self.gpu is not None:
            self.gpu.close()


@contextlib.contextmanager
def sampling(sink: Sink, rank: int = 0, interval: float = SAMPLE_INTERVAL, **probes: Any):
    """Within the block, sample this process's utilisation every ``interval`` s into ``sink``.

    One sample is sent at the start and one at the end, so even a short cell
    has two. ``probes`` (``psutil=``, ``nvml=``, ``tpu_probe=``) are for tests.
    """
    sampler = Sampler(sink, rank, interval, **probes).start()
    try:
        yield sampler
    finally:
        sampler.stop()
