"""What the advisor looks at: plain *facts* about the hardware, the largest built Keras model
and the data in the notebook's namespace, and the words for them.

:func:`facts_for` turns a :class:`~kdist_magics.hardware.Hardware` description, a RunSpec and
the namespace into one flat dict the rules of :mod:`kdist_magics.choose.advisor` read. Nothing here
imports TensorFlow, Keras or JAX: models and data are inspected only through modules the
notebook has already imported (``sys.modules``).
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from ..hardware import Hardware, gib
from ..strategies.frameworks.backends import keras_backend

#: optimizer-state multiplier: weights + gradients + two Adam moments
TRAIN_STATE_FACTOR = 4
#: rough sustained training throughput of one device, FLOP/s (a dense Keras model
#: reaches a fraction of peak); only used to tell "seconds" from "hours"
DEVICE_FLOPS = {"cpu_core": 2e10, "gpu": 1e13, "tpu_core": 2e13}
#: what starting engines costs (ipyparallel engines + TF import + rendezvous), seconds
ENGINE_SETUP_S = 10.0
#: below this estimated time per epoch on one device, distributing is not worth it
SMALL_EPOCH_S = 10.0
#: data this large (bytes) is large data on its own (the article's third criterion)
BIG_DATA_BYTES = 1e9


def human(n: float) -> str:
    """12345 -> '12k', 3.2e9 -> '3.2B'."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            v = n / size
            return f"{v:.1f}{unit}" if v < 10 and v != int(v) else f"{v:.0f}{unit}"
    return f"{n:.0f}"


def human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} bytes"


def human_seconds(s: float) -> str:
    if s < 1:
        return "under a second"
    if s < 120:
        return f"~{s:.0f} s"
    if s < 7200:
        return f"~{s / 60:.0f} min"
    return f"~{s / 3600:.0f} h"


def inspect_model(user_ns: Mapping[str, Any]) -> dict[str, Any] | None:
    """The largest built Keras model in the namespace: name, parameters, bytes."""
    keras = sys.modules.get("keras")
    if keras is None:
        return None
    try:
        model_cls = keras.Model
    except AttributeError:
        return None
    best = None
    for name, value in list(user_ns.items()):
        if name.startswith("_") or not isinstance(value, model_cls):
            continue
        try:
            params, nbytes = 0, 0
            for w in value.weights:
                count = 1
                for d in w.shape:
                    count *= int(d)
                params += count
                dtype = str(getattr(w, "dtype", "float32"))
                nbytes += count * _itemsize(dtype)
        except Exception:  # unbuilt model: nothing to count yet
            continue
        if best is None or params > best["params"]:
            best = {"name": name, "params": params, "bytes": nbytes}
    return best


def _itemsize(dtype: str) -> int:
    for key, size in (("64", 8), ("32", 4), ("16", 2), ("8", 1)):
        if key in dtype:
            return size
    return 4


def inspect_data(user_ns: Mapping[str, Any]) -> dict[str, Any] | None:
    """Arrays/DataFrames/datasets in the namespace: total bytes and the most samples."""
    np = sys.modules.get("numpy")
    pd = sys.modules.get("pandas")
    tf = sys.modules.get("tensorflow")
    total, samples, names = 0, 0, []
    for name, value in list(user_ns.items()):
        if name.startswith("_"):
            continue
        n_bytes = n_rows = None
        if np is not None and isinstance(value, np.ndarray) and value.ndim >= 1:
            n_bytes, n_rows = value.nbytes, value.shape[0]
        elif pd is not None and isinstance(value, (pd.DataFrame, pd.Series)):
            try:
                n_bytes, n_rows = int(value.memory_usage(deep=False).sum()), len(value)
            except Exception:
                continue
        elif tf is not None and _is_dataset(tf, value):
            names.append(name)  # its size is unknown without iterating (cardinality counts batches)
            continue
        if n_bytes is None or n_bytes < 1024:  # skip scalars and small constants
            continue
        total += n_bytes
        samples = max(samples, n_rows)
        names.append(name)
    if not names:
        return None
    return {"names": names, "bytes": total, "samples": samples}


def _is_dataset(tf, value) -> bool:
    try:
        return isinstance(value, tf.data.Dataset)
    except Exception:
        return False


def epoch_seconds(hw: Hardware, params: int | None, samples: int | None) -> float | None:
    """A rough epoch time: forward and backward (6 x parameters x samples FLOPs) at the
    hardware's nominal rate; None without a model or a sample count."""
    if params is None or not samples:
        return None
    if hw.tpu:
        rate = DEVICE_FLOPS["tpu_core"]
    elif hw.gpus:
        rate = DEVICE_FLOPS["gpu"]
    else:
        rate = DEVICE_FLOPS["cpu_core"] * hw.cpu_cores
    return 6.0 * params * samples / rate


def facts_for(
    hw: Hardware,
    spec=None,
    user_ns: Mapping[str, Any] | None = None,
    model: dict | None = None,
    data: dict | None = None,
    backend: str | None = None,
) -> dict[str, Any]:
    """Everything the rules look at, as a flat dict of plain values."""
    if model is None and user_ns is not None:
        model = inspect_model(user_ns)
    if data is None and user_ns is not None:
        data = inspect_data(user_ns)
    given = frozenset(getattr(spec, "given", ()) or ())
    engine_opts = [f"--{o.replace('_', '-')}" for o in ("np", "push", "pull", "cluster_id", "profile") if o in given]
    f: dict[str, Any] = {
        "hw": hw,
        "hardware": hw.describe(),
        "cores": hw.cpu_cores,
        "gpus": len(hw.gpus),
        "hosts": hw.hosts,
        "engines": hw.engines,
        "tpu": hw.tpu is not None,
        "tpu_kind": hw.tpu.kind if hw.tpu else None,
        "horovod": hw.horovod,
        "backend": backend or keras_backend(),
        "devices_given": "devices" in given,
        "devices": getattr(spec, "devices", None),
        "mesh": getattr(spec, "mesh", None),
        "min_np": getattr(spec, "min_np", None) or getattr(spec, "max_np", None),
        "engine_opts": " ".join(engine_opts),
        "device_memory": hw.device_memory_bytes,
        "device_word": f"TPU {hw.tpu.unit}" if hw.tpu else ("GPU" if hw.gpus else "host"),
    }
    f["model"] = model
    f["params"] = model["params"] if model else None
    f["model_bytes"] = model["bytes"] if model else None
    f["train_bytes"] = model["bytes"] * TRAIN_STATE_FACTOR if model else None
    f["fits"] = (f["train_bytes"] <= hw.device_memory_bytes) if model and hw.device_memory_bytes else None
    f["data"] = data
    f["data_bytes"] = data["bytes"] if data else None
    f["samples"] = data["samples"] if data and data["samples"] else None
    f["epoch_s"] = epoch_seconds(hw, f["params"], f["samples"])
    # the job is "big" when the model or the data is, or one epoch takes long
    f["big_job"] = bool(
        (f["params"] is not None and f["params"] >= 50e6)
        or (f["data_bytes"] is not None and f["data_bytes"] >= BIG_DATA_BYTES)
        or (f["epoch_s"] is not None and f["epoch_s"] >= 60)
    )
    f["small_job"] = f["epoch_s"] is not None and f["epoch_s"] < SMALL_EPOCH_S and not f["big_job"]
    return f


def model_words(f) -> str:
    if f["model"] is None:
        return "no built Keras model in the namespace yet"
    return f"model '{f['model']['name']}' of {human(f['params'])} parameters (~{gib(f['train_bytes'])} to train)"


def data_words(f) -> str:
    if f["data"] is None:
        return "no arrays or datasets in the namespace yet"
    size = human_bytes(f["data_bytes"]) if f["data_bytes"] else "size unknown"
    samples = f"{human(f['samples'])} samples, " if f["samples"] else ""
    return f"{samples}{size} ({', '.join(f['data']['names'][:3])})"
