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
an NVIDIA GPU exists). ``psutil``, NVML and the TPU probe (:mod:`.tpu_probe`) are injectable so
tests use fakes.

Nothing here imports TensorFlow, JAX or Keras at module import.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any, Callable

from .tpu_probe import TPU_UNREAD, _tpu_probe

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


#: the device line of a rank with neither GPU nor TPU
CPU_ONLY = "CPU only"


def _accelerators(
    nvml, pid: int, gpu_present: Callable[[], bool] | None, tpu_probe: Callable[[], Any] | None
) -> tuple["_NvmlProbe | None", str | None]:
    """The GPU probe (NVML) for process ``pid`` and the device line where there is none
    (:class:`Sampler`'s arguments of the same names)."""
    gpu, note = None, None
    if nvml is not False:
        if nvml is None:
            try:
                import pynvml as nvml  # type: ignore[no-redef]
            except ImportError:
                nvml = None
                note = "not available: pynvml is not installed (pip install nvidia-ml-py)"
        if nvml is not None:
            try:
                gpu = _NvmlProbe(nvml, pid)
                if not gpu.count:
                    note, gpu = "not available: NVML sees no GPU", None
            except Exception as exc:
                note = f"not available: NVML: {exc or type(exc).__name__}"
                gpu = None
    else:
        note = "not available: GPU sampling disabled"
    if gpu is None and nvml is not False:
        from ..hardware import nvidia_gpu_present

        if not (gpu_present or nvidia_gpu_present)():
            note = CPU_ONLY  # no NVIDIA GPU here: NVML's absence is no news
    if note == CPU_ONLY and tpu_probe is None:
        from ..hardware import detect_tpu

        if detect_tpu() is not None:  # a TPU here that nothing reports on yet
            note = TPU_UNREAD
    return gpu, note


class Sampler:
    """Samples one process (and its accelerators) into ``sink`` from a daemon thread.

    ``psutil``: the module (or a fake with ``Process`` and ``cpu_count``).
    ``nvml``: the ``pynvml`` module, a fake, ``None`` to import ``pynvml`` when
    present, or ``False`` to skip GPUs. ``tpu_probe``: a callable returning a
    list of TPU dicts or None (default: TensorFlow's, when TF is imported).
    ``gpu_present``: whether an NVIDIA GPU exists (default: the driver's files); without
    one the device line is "CPU only", with one that NVML cannot read, NVML's reason.
    """

    def __init__(
        self,
        sink: Sink,
        rank: int = 0,
        interval: float = SAMPLE_INTERVAL,
        *,
        psutil=None,
        nvml=None,
        tpu_probe: Callable[[], Any] | None = None,
        pid: int | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        gpu_present: Callable[[], bool] | None = None,
    ):
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
        self.gpu, self.note = _accelerators(nvml, self.pid, gpu_present, tpu_probe)
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
        row: dict[str, Any] = {
            "rank": self.rank,
            "time": self.clock(),
            "pid": self.pid,
            "host": self.host,
            "cpu_count": self.cpu_count,
            "cpu_percent": None,
            "rss_bytes": None,
        }
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
        self._thread = threading.Thread(target=self._loop, name=f"kdist-sampler-{self.rank}", daemon=True)
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
def sampling(sink: Sink, rank: int = 0, interval: float = SAMPLE_INTERVAL, nice: int = 0, **probes: Any):
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
