"""The advisor's rows for ``--strategy sharded`` (Keras on JAX): a model that does not fit one
device, but whose share does when its weights, gradients and optimizer state are split over a
model axis of the devices here. Plain facts only, like :mod:`kdist_magics.advisor`.
"""

from __future__ import annotations

from .facts import human_bytes
from .hardware import gib
from .mesh import pick_model_axis

#: strategies that keep a full copy of the model per device (what a model too big rules out)
REPLICATING = ("mirrored", "tpu", "horovod", "multiworker")


def devices(f: dict) -> int:
    """The devices of one host a mesh can span (GPUs or TPU cores; the CPU counts as one)."""
    if f["tpu"]:
        return f["hw"].tpu.cores
    return f["gpus"]


def plan(f: dict) -> tuple[tuple[int, int], int] | None:
    """``((D, M), bytes per device)`` when sharding makes a model too big for one device fit,
    else None (it fits anyway, the backend is not JAX, or even every device is too few)."""
    if f["fits"] is not False or f["backend"] != "jax":
        return None
    n = devices(f)
    m = pick_model_axis(n, f["train_bytes"], f["device_memory"]) if n > 1 else None
    if m is None:
        return None
    return (n // m, m), int(f["train_bytes"] / m)


def words(f: dict) -> str:
    (d, m), share = plan(f)
    return (f"sharded, mesh {d},{m} (data {d} x model {m}): keras.distribution.ModelParallel "
            f"splits weights, gradients and optimizer state over {m} devices, ~{human_bytes(share)} "
            f"per device of {gib(f['device_memory'])}")


def applies(f: dict) -> bool:
    return plan(f) is not None


def rule_out(f: dict) -> tuple[str, ...]:
    """A model too big for one device rules out the strategies that copy it to every device
    (unless the line asks for engines: --np decides then)."""
    return () if f["engine_opts"] else REPLICATING


def observation(f: dict) -> str:
    from .facts import model_words

    return f"{model_words(f)}, more than one {f['device_word']}'s {gib(f['device_memory'])}"
