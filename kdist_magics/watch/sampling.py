"""Utilisation sampling: what each rank's process uses while a ``%%kdist`` cell runs.

:func:`sampling` -- a daemon thread samples this process every ``interval`` seconds and feeds
``sink("sample", row)`` with ``{rank, time, pid, host, cpu_percent, cpu_count, rss_bytes,
pss_bytes (Linux: the proportional set size, so pages mapped by several processes -- a
``--push``'s shared memory -- count once over the ranks),
accelerator, gpus: [...], gpu_util_percent, gpu_mem_used_bytes, gpu_mem_total_bytes,
tpus: [...], accelerator_note}``. GPUs come from NVML (``pynvml``, from the ``nvidia-ml-py``
package) when it initialises, the rank's own GPU first (``CUDA_VISIBLE_DEVICES``, or where
its process has a context); TPU memory from JAX's ``Device.memory_stats()`` or TensorFlow's
``get_memory_info``, when that runtime is already up in the process and sees TPUs; otherwise
``accelerator`` is None and ``accelerator_note`` says why ("CPU only", or NVML's reason where
an NVIDIA GPU exists). ``psutil``, NVML and the TPU probe are injectable so tests use fakes.

Nothing here imports TensorFlow, JAX or Keras at module import.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any, Callable

from .compat_jax import jax_backend_ready

Sink = Callable[[str, dict[str, Any]], None]

#: default seconds between utilisation samples
SAMPLE_INTERVAL = 1.0
#: seconds between reads of the proportional set size at the least: the kernel walks every
#: mapping for it (~5-20 ms a read in a process with TensorFlow loaded, where the rest of a
#: sample takes ~0.05 ms); between reads it moves with the resident size (pages a process adds
#: are its own)
PSS_EVERY = 10.0
#: the share of one core the PSS reads may take: a read that took longer waits longer for the
#: next (a profile of a loaded 2-core host's training rank saw reads of ~0.1-0.3 s, its
#: mappings' lock held meanwhile)
PSS_SHARE = 0.002


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
    if jax is None or not jax_backend_ready():  # not initialised yet: leave it alone
        return None
    try:
        devices = [d for d in jax.local_devices() if d.platform == "tpu"]
    except Exception:
        return None
    out = []
    for d in devices:
        entry: dict[str, Any] = {"index": d.id, "name": str(getattr(d, "device_kind", "TPU")),
                                 "source": TPU_SOURCES["jax"]}
        try:
            stats = d.memory_stats() or {}
            entry["mem_used_bytes"] = stats.get("bytes_in_use")
            entry["mem_total_bytes"] = stats.get("bytes_limit")
        except Exception:
            entry["mem_used_bytes"] = None
        out.append(entry)
    return out or None


#: libtpu's monitoring SDK (libtpu 0.0.1x, ``libtpu.sdk.tpumonitoring``): per-chip strings
LIBTPU_METRICS = ("duty_cycle_pct", "hbm_capacity_usage", "hbm_capacity_total")
#: where a TPU row's figures came from, as the dashboard names it
TPU_SOURCES = {"libtpu": "libtpu monitoring SDK", "jax": "JAX memory_stats()",
               "tensorflow": "TensorFlow get_memory_info()"}


def _libtpu_monitoring():
    """``libtpu.sdk.tpumonitoring`` once this process has loaded libtpu (JAX or TensorFlow
    brought its TPU runtime up here; Colab's and Kaggle's TPU runtimes ship it), else None: a
    process that has not started the runtime is left alone, as the JAX and TensorFlow probes
    leave theirs, and a sample costs no import look-up."""
    import sys

    if "libtpu" not in sys.modules:
        return None
    try:
        from libtpu.sdk import tpumonitoring
    except Exception:
        return None
    return tpumonitoring


def libtpu_probe(monitoring=None) -> list[dict[str, Any]] | None:
    """Each chip's duty cycle and high-bandwidth memory from libtpu's monitoring SDK
    (``monitoring``: the module, or a fake with its ``list_supported_metrics`` and
    ``get_metric(name).data()``); None where it is not importable or reports no chip."""
    sdk = monitoring if monitoring is not None else _libtpu_monitoring()
    if sdk is None:
        return None
    try:
        supported = set(sdk.list_supported_metrics())
        data = {name: list(sdk.get_metric(name).data() or []) for name in LIBTPU_METRICS
                if name in supported}
    except Exception:
        return None
    chips = max((len(v) for v in data.values()), default=0)
    if not chips:
        return None

    def value(name: str, i: int) -> float | None:
        try:
            return float(data[name][i])
        except (KeyError, IndexError, TypeError, ValueError):
            return None

    out = []
    for i in range(chips):
        used, total = value("hbm_capacity_usage", i), value("hbm_capacity_total", i)
        out.append({"index": i, "name": f"TPU chip {i}", "source": TPU_SOURCES["libtpu"],
                    "duty_cycle_percent": value("duty_cycle_pct", i),
                    "mem_used_bytes": int(used) if used is not None else None,
                    "mem_total_bytes": int(total) if total is not None else None})
    return out


def _tpu_probe() -> list[dict[str, Any]] | None:
    """What this host's TPUs report: libtpu's monitoring SDK (duty cycle and memory), else the
    runtime already running in this process (JAX's memory_stats(), then TensorFlow's)."""
    return libtpu_probe() or _jax_tpu_probe() or _tensorflow_tpu_probe()


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
        entry: dict[str, Any] = {"index": i, "name": dev.name, "source": TPU_SOURCES["tensorflow"]}
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
#: a TPU host where neither libtpu's monitoring SDK nor a running runtime reports figures
TPU_UNREAD = ("TPU: no figures available (libtpu's monitoring SDK is not importable here, and "
              "no JAX or TensorFlow runtime in this process has started on it)")


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
        self.nice = 0  # added to the sampler thread's nice value (kdist_magics.cluster.priority)
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
            from ..choose.hardware import nvidia_gpu_present

            if not (gpu_present or nvidia_gpu_present)():
                self.note = CPU_ONLY  # no NVIDIA GPU here: NVML's absence is no news
        if self.note == CPU_ONLY and tpu_probe is None:
            from ..choose.hardware import detect_tpu

            if detect_tpu() is not None:  # a TPU here that nothing reports on yet
                self.note = TPU_UNREAD
        self.tpu_probe = tpu_probe if tpu_probe is not None else _tpu_probe
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_since = monotonic()
        self._pss: tuple[float, int, int] | None = None  # (next read due, pss, rss then)
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
            with contextlib.suppress(Exception):  # Linux: shared pages split between their users
                row["pss_bytes"] = self._pss_bytes(row["rss_bytes"], now)
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

    def _pss_bytes(self, rss: int | None, now: float) -> int:
        """The proportional set size: read every :data:`PSS_EVERY` s, or less often where a read
        takes over :data:`PSS_SHARE` of that (and at the end); in between the last read moved by
        the resident size's change since."""
        if self._pss is None or rss is None or now >= self._pss[0] or self._stop.is_set():
            pss = int(self.process.memory_full_info().pss)
            took = self.monotonic() - now
            self._pss = (now + max(PSS_EVERY, took / PSS_SHARE), pss, rss if rss is not None else 0)
            return pss
        _, pss, then = self._pss
        return max(0, pss + rss - then)

    def _loop(self) -> None:
        if self.nice:
            from ..cluster.priority import lower

            lower(by=self.nice)  # below the training threads of this process
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
def sampling(sink: Sink, rank: int = 0, interval: float = SAMPLE_INTERVAL, nice: int = 0,
             **probes: Any):
    """Within the block, sample this process's utilisation every ``interval`` s into ``sink``.

    One sample is sent at the start and one at the end, so even a short cell
    has two. ``nice``: added to the sampler thread's nice value. ``probes`` (``psutil=``,
    ``nvml=``, ``tpu_probe=``) are for tests.
    """
    sampler = Sampler(sink, rank, interval, **probes)
    sampler.nice = nice
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()
