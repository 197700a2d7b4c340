"""What this host's TPUs report, for the utilisation sampler (:mod:`.sampling`): each chip's duty
cycle and high-bandwidth memory from libtpu's monitoring SDK, else the memory of a runtime
already up in the process (JAX's ``Device.memory_stats()``, TensorFlow's ``get_memory_info``).
Nothing here starts a runtime or imports one at module import."""

from __future__ import annotations

from typing import Any

from .compat_jax import jax_backend_ready


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
        entry: dict[str, Any] = {
            "index": d.id,
            "name": str(getattr(d, "device_kind", "TPU")),
            "source": TPU_SOURCES["jax"],
        }
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
TPU_SOURCES = {
    "libtpu": "libtpu monitoring SDK",
    "jax": "JAX memory_stats()",
    "tensorflow": "TensorFlow get_memory_info()",
}


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
        data = {name: list(sdk.get_metric(name).data() or []) for name in LIBTPU_METRICS if name in supported}
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
        out.append(
            {
                "index": i,
                "name": f"TPU chip {i}",
                "source": TPU_SOURCES["libtpu"],
                "duty_cycle_percent": value("duty_cycle_pct", i),
                "mem_used_bytes": int(used) if used is not None else None,
                "mem_total_bytes": int(total) if total is not None else None,
            }
        )
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


#: a TPU host where neither libtpu's monitoring SDK nor a running runtime reports figures
TPU_UNREAD = (
    "TPU: no figures available (libtpu's monitoring SDK is not importable here, and "
    "no JAX or TensorFlow runtime in this process has started on it)"
)
