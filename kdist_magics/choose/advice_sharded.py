"""The advisor's rows for ``--strategy sharded`` (Keras on JAX): a model that does not fit one
device, but whose share does when its weights, gradients and optimizer state are split over a
model axis of the devices here. Plain facts only, like :mod:`kdist_magics.choose.advisor`.
"""

from __future__ import annotations

from .facts import human_bytes
from ..hardware import gib
from ..strategies.sharded.mesh import pick_model_axis

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
    return (
        f"sharded, mesh {d},{m} (data {d} x model {m}): keras.distribution.ModelParallel "
        f"splits weights, gradients and optimizer state over {m} devices, ~{human_bytes(share)} "
        f"per device of {gib(f['device_memory'])}"
    )


def applies(f: dict) -> bool:
    return plan(f) is not None


def rule_out(f: dict) -> tuple[str, ...]:
    """A model too big for one device rules out the strategies that copy it to every device
    (unless the line asks for engines: --np decides then)."""
    return () if f["engine_opts"] else REPLICATING


def observation(f: dict) -> str:
    from .facts import model_words

    return f"{model_words(f)}, more than one {f['device_word']}'s {gib(f['device_memory'])}"


def planned(user_ns, mesh: tuple[int, int]):
    """The automatic layout the namespace's models would get on ``mesh`` (``%kdist advise``),
    read from their variables' shapes without JAX; None when there is no built model."""
    import math

    from ..strategies.sharded.layout import LayoutTable, _itemsize, auto_spec, models_in

    table = LayoutTable(tuple(mesh))
    for model in models_in(user_ns):
        for v in list(getattr(model, "weights", [])):
            shape = tuple(int(d) for d in v.shape)
            spec = auto_spec(shape, v.dtype, mesh[1])
            nbytes = math.prod(shape) * _itemsize(v.dtype)
            sharded = any(spec)
            table.rows.append(
                {
                    "variable": v.path,
                    "shape": shape,
                    "spec": "(" + ", ".join(a or "-" for a in spec) + ")" if sharded else "replicated",
                    "bytes_per_device": nbytes // mesh[1] if sharded else nbytes,
                }
            )
    if not table.rows:
        return None
    table.optimizer_bytes = 2 * table.weight_bytes  # Adam's two moments follow their weights
    return table


def mesh_of(f: dict) -> tuple[int, int] | None:
    """The mesh the advice names: the line's --mesh, else the one sharding makes fit."""
    if f.get("mesh"):
        return tuple(f["mesh"])
    p = plan(f)
    return p[0] if p else None
