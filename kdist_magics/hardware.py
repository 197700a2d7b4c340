"""What hardware this kernel can use, as a plain, serialisable description.

:func:`detect` looks without starting any framework runtime: CPU cores and
memory (``os``/``psutil``), GPUs through NVML when ``nvidia-ml-py`` is
installed (no NVML: no GPUs reported), a TPU from the environment and device
files, the engines of an ipyparallel cluster when one is attached, and whether
Horovod is importable (``importlib.util.find_spec``, no import). It never
imports TensorFlow, Keras, JAX or Horovod.

The advisor reasons on :class:`Hardware` only, so tests (and a teacher showing
what would happen on a cluster) describe machines with plain dictionaries::

    Hardware.from_dict({"cpu_cores": 96, "gpus": [{"name": "A100", "memory_bytes": 80e9}] * 8})

``KDIST_HARDWARE`` may hold such a dictionary as JSON; :func:`detect` then
returns it instead of looking (useful for demos of ``%kdist advise``).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping

GiB = 1024**3

#: HBM per TPU core (TensorFlow replica) by generation, bytes. v4 and later
#: expose one replica per chip (megacore), so this is per chip there.
TPU_MEMORY_PER_CORE = {
    "v2": 8 * GiB,
    "v3": 16 * GiB,
    "v4": 32 * GiB,
    "v5e": 16 * GiB,
    "v5litepod": 16 * GiB,
    "v5p": 95 * GiB,
    "v6e": 32 * GiB,
}

#: the names Google's runtimes give some generations, as people say them
TPU_GENERATION_NAMES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}

#: generations with one TensorFlow replica (and one JAX device) per chip
TPU_ONE_REPLICA_PER_CHIP = ("v4", "v5e", "v5p", "v6e")

#: where :func:`detect_tpu` looks, in the words the error messages use
TPU_PLACES = "COLAB_TPU_ADDR, TPU_NAME, TPU_ACCELERATOR_TYPE, /dev/accel*, /dev/vfio"


@dataclass(frozen=True)
class GPU:
    name: str = "GPU"
    memory_bytes: int = 0


@dataclass(frozen=True)
class TPU:
    #: accelerator type, e.g. "v2-8", or "tpu" when the generation is unknown
    kind: str = "tpu"
    #: TensorFlow replicas (cores) it offers
    cores: int = 8
    memory_per_core_bytes: int = 8 * GiB
    #: "local" for a TPU VM (Colab/Kaggle today), else the address of a TPU node
    target: str = "local"
    #: what revealed it, e.g. "COLAB_TPU_ADDR" or "/dev/accel0"
    found_by: str = ""

    @property
    def name(self) -> str:
        """The kind as people say it: 'v5e-1' for Google's 'v5litepod-1'."""
        generation, sep, count = self.kind.partition("-")
        return TPU_GENERATION_NAMES.get(generation, generation) + sep + count

    @property
    def unit(self) -> str:
        """'chip' where each chip is one replica (v4 and later), else 'core'."""
        return "chip" if self.name.partition("-")[0] in TPU_ONE_REPLICA_PER_CHIP else "core"


@dataclass(frozen=True)
class Hardware:
    """One host's accelerators plus how many hosts/engines are reachable."""

    cpu_cores: int = 1
    memory_bytes: int = 0  # host RAM
    gpus: tuple[GPU, ...] = ()  # on each host (hosts are assumed alike)
    tpu: TPU | None = None
    hosts: int = 1
    engines: int = 0  # ipyparallel engines of an attached cluster
    horovod: bool = False  # importable here
    source: str = "detected"  # or "simulated"

    @property
    def gpu_memory_bytes(self) -> int:
        """Memory of the smallest GPU (what a replicated model must fit in)."""
        return min((g.memory_bytes for g in self.gpus), default=0)

    @property
    def device_memory_bytes(self) -> int:
        """Memory of one device a data-parallel replica would use."""
        if self.tpu is not None:
            return self.tpu.memory_per_core_bytes
        if self.gpus:
            return self.gpu_memory_bytes
        return self.memory_bytes

    def describe(self) -> str:
        """Short words for the hardware: '2 cores, no GPU', '2 hosts x 4 A100 (80 GiB)'."""
        if self.tpu is not None:
            t = self.tpu
            return (
                f"TPU {t.name} ({t.cores} {t.unit}{'s' if t.cores != 1 else ''}, {gib(t.memory_per_core_bytes)} each)"
            )
        if self.gpus:
            names = sorted({g.name for g in self.gpus})
            gpu = f"{len(self.gpus)} {'/'.join(names)} GPU{'s' if len(self.gpus) > 1 else ''} ({gib(self.gpu_memory_bytes)})"
            return f"{self.hosts} hosts x {gpu}" if self.hosts > 1 else gpu
        cpu = f"{self.cpu_cores} core{'s' if self.cpu_cores != 1 else ''}, no GPU"
        return f"{self.hosts} hosts x {cpu}" if self.hosts > 1 else cpu

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Hardware":
        data = dict(data)
        gpus = tuple(
            g if isinstance(g, GPU) else GPU(**{k: (int(v) if k == "memory_bytes" else v) for k, v in g.items()})
            for g in data.pop("gpus", ())
        )
        tpu = data.pop("tpu", None)
        if isinstance(tpu, Mapping):
            tpu = TPU(**tpu)
        elif isinstance(tpu, str):
            tpu = tpu_from_kind(tpu)
        if "memory_bytes" in data:
            data["memory_bytes"] = int(data["memory_bytes"])
        data.setdefault("source", "simulated")
        return cls(gpus=gpus, tpu=tpu, **data)


def gib(n: float) -> str:
    return f"{n / GiB:.0f} GiB" if n >= GiB else f"{n / 1024**2:.0f} MiB"


def tpu_from_kind(kind: str, target: str = "local", found_by: str = "") -> TPU:
    """A TPU description from an accelerator type such as 'v2-8' or 'v5litepod-8'."""
    generation, _, count = kind.partition("-")
    cores = int(count) if count.isdigit() else 8
    generation = TPU_GENERATION_NAMES.get(generation, generation)
    memory = TPU_MEMORY_PER_CORE.get(generation, 8 * GiB)
    return TPU(kind=kind, cores=cores, memory_per_core_bytes=memory, target=target, found_by=found_by)


# -- detection ---------------------------------------------------------------


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def host_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # pragma: no cover - psutil is a dependency
        return 0


def detect_gpus(env: Mapping[str, str] | None = None) -> tuple[GPU, ...]:
    """GPUs through NVML (``nvidia-ml-py``); none when NVML is missing or fails.

    NVML does not start CUDA or TensorFlow. ``CUDA_VISIBLE_DEVICES`` limits the
    count as it limits what the frameworks will see.
    """
    env = os.environ if env is None else env
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except Exception:
        return ()
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            found.append(
                GPU(name=name.replace("NVIDIA ", ""), memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
            )
    except Exception:
        return ()
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        found = found[: len(wanted)]
    return tuple(found)


def nvidia_gpu_present(root: str = "/") -> bool:
    """Whether the NVIDIA driver shows a GPU here (its device files or /proc entries), without
    NVML: tells "CPU only" apart from "there is a GPU, but NVML cannot read it"."""
    places = ("dev/nvidia[0-9]*", "proc/driver/nvidia/gpus/*")
    return any(glob.glob(os.path.join(root, p)) for p in places)


def detect_tpu(env: Mapping[str, str] | None = None, root: str = "/") -> TPU | None:
    """A TPU from the environment or device files, or None. Cheap: no TF, no network.

    * old Colab TPU runtime (a TPU node): ``COLAB_TPU_ADDR`` = host:port -> grpc address
    * a named/addressed TPU: ``TPU_NAME``
    * TPU VMs (Colab and Kaggle today, Cloud TPU VMs): ``/dev/accel*`` (v2-v4) or
      ``/dev/vfio/N`` (v5e and later), with ``TPU_ACCELERATOR_TYPE`` when set.
    """
    env = os.environ if env is None else env
    kind = env.get("TPU_ACCELERATOR_TYPE", "")
    if env.get("COLAB_TPU_ADDR"):
        return tpu_from_kind(kind or "v2-8", target="grpc://" + env["COLAB_TPU_ADDR"], found_by="COLAB_TPU_ADDR")
    name = env.get("TPU_NAME", "")
    if name and name != "local":
        return tpu_from_kind(kind or "tpu", target=name, found_by="TPU_NAME")
    accel = sorted(glob.glob(os.path.join(root, "dev", "accel[0-9]*")))
    vfio = sorted(p for p in glob.glob(os.path.join(root, "dev", "vfio", "*")) if os.path.basename(p).isdigit())
    found = accel or vfio
    if found:
        if not kind:
            # v2/v3 chips have two cores each (/dev/accel per chip); later chips one replica each
            kind = f"tpu-{len(found) * 2}" if accel else f"tpu-{len(found)}"
        return tpu_from_kind(kind, target="local", found_by=found[0][len(root.rstrip("/")) :])
    if name == "local" or kind:
        return tpu_from_kind(kind or "tpu", target="local", found_by="TPU_NAME" if name else "TPU_ACCELERATOR_TYPE")
    return None


def horovod_importable() -> bool:
    """Horovod with its TensorFlow binding is installed (found without importing ``horovod``)."""
    try:
        spec = importlib.util.find_spec("horovod")
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    return any(os.path.isdir(os.path.join(path, "tensorflow")) for path in (spec.submodule_search_locations or ()))


def detect(env: Mapping[str, str] | None = None) -> Hardware:
    """This kernel's hardware (or ``KDIST_HARDWARE``'s simulated one); engines and hosts of a
    cluster kdist holds are added by :func:`kdist_magics.choose.advisor.hardware_for`."""
    env = os.environ if env is None else env
    simulated = env.get("KDIST_HARDWARE")
    if simulated:
        return Hardware.from_dict(json.loads(simulated))
    return Hardware(
        cpu_cores=cpu_cores(),
        memory_bytes=host_memory(),
        gpus=detect_gpus(env),
        tpu=detect_tpu(env),
        hosts=1,
        engines=0,
        horovod=horovod_importable(),
    )
