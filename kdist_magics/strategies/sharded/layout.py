"""Where each variable of a ``--strategy sharded`` run lives.

:func:`distribution` makes the run's ``keras.distribution.ModelParallel`` over a mesh with axes
``("batch", "model")``. Keras asks it for a variable's layout when the variable is created;
the answer, in this order:

1. a layout the variable already has (optimizer state takes its weight's);
2. the layout map of the model being built, when its class has one (``get_layout_map(mesh)``,
   as Keras Hub backbones do): a variable it does not match stays replicated, as in Keras;
3. otherwise automatic: a variable of at least :data:`AUTO_MIN_BYTES` is split on its largest
   dimension that the model axis divides (FSDP-like), everything else is replicated.

A distribution the cell sets itself (``keras.distribution.set_distribution`` or its
``scope()``) takes over from this one for what the cell builds under it.

Layouts are checked as they are given out: an axis the mesh lacks, or a dimension its axis does
not divide, is :class:`LayoutError`, one line naming the variable. After the cell,
:func:`table` reads where the variables actually live (their JAX shardings, whoever chose them)
for ``last_run().layout()``, and :func:`unused_keys` finds ``LayoutMap`` keys that matched no
variable (Keras leaves those variables replicated without a word).
"""

from __future__ import annotations

import html
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from ... import messages

#: variables at least this big are sharded by the automatic layout (256 KiB: a 256 x 256
#: float32 kernel); biases, norms and small kernels stay replicated
AUTO_MIN_BYTES = 256 * 1024
AXES = ("batch", "model")


class LayoutError(ValueError):
    """A layout that cannot be applied to a variable on this mesh (one line, naming it)."""


def _itemsize(dtype) -> int:
    import numpy as np

    try:
        return int(np.dtype(str(dtype)).itemsize)
    except TypeError:
        return 2 if "16" in str(dtype) else 4


def auto_spec(shape, dtype, model_axis: int, min_bytes: int = AUTO_MIN_BYTES) -> list:
    """The automatic layout of a variable: its largest dimension ``model_axis`` divides, when
    it holds at least ``min_bytes``; else replicated (all None)."""
    shape = [int(d) for d in shape]
    spec: list = [None] * len(shape)
    if model_axis > 1 and math.prod(shape) * _itemsize(dtype) >= min_bytes:
        for i in sorted(range(len(shape)), key=lambda i: (-shape[i], -i)):
            if shape[i] % model_axis == 0:
                spec[i] = "model"
                break
    return spec


def check_spec(path: str, shape, axes, mesh_names, mesh_shape) -> None:
    """LayoutError when ``axes`` names an axis the mesh lacks or does not divide a dimension."""
    sizes = dict(zip(mesh_names, mesh_shape))
    for dim, axis in enumerate(axes):
        if axis is None:
            continue
        names = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        missing = [a for a in names if a not in sizes]
        if missing:
            raise LayoutError(messages.layout_missing_axis(path, missing[0], mesh_names))
        size = math.prod(sizes[a] for a in names)
        if dim < len(shape) and int(shape[dim]) % size:
            raise LayoutError(messages.layout_not_divisible(path, [int(d) for d in shape], dim, "+".join(names), size))


def _model_layout_map(mesh, cache: dict):
    """The layout map of a model whose constructor is running (a Keras Hub backbone builds its
    layers inside ``__init__``), from the frames above; None when no such model is being built."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            maker = getattr(type(owner), "get_layout_map", None)
            if owner is not None and callable(maker):
                cls = type(owner)
                if cls not in cache:
                    try:
                        cache[cls] = maker(mesh)
                    except Exception:  # a model whose map does not fit this mesh: automatic
                        cache[cls] = None
                return cache[cls]
        frame = frame.f_back
    return None


def distribution(devices, mesh_shape: tuple[int, int]):
    """A ``keras.distribution.ModelParallel`` over ``devices`` in a ``mesh_shape`` mesh that
    lays variables out as the module says."""
    import keras

    from ..frameworks.compat_keras import shard_at_init

    shard_at_init()  # sharded variables are created split, never whole first
    dist = keras.distribution
    mesh = dist.DeviceMesh(shape=tuple(mesh_shape), axis_names=AXES, devices=list(devices))

    class KDistModelParallel(dist.ModelParallel):
        """ModelParallel with kdist's layout order (module doc)."""

        def __init__(self):
            super().__init__(layout_map=dist.LayoutMap(mesh), batch_dim_name="batch", auto_shard_dataset=False)
            self.model_maps: dict = {}

        def get_variable_layout(self, variable):
            if getattr(variable, "_layout", None) is not None:
                return variable._layout
            path, shape = variable.path, tuple(variable.shape)
            layout_map = _model_layout_map(mesh, self.model_maps)
            layout = layout_map[path] if layout_map is not None else None
            if layout is None:
                axes = (
                    [None] * len(shape) if layout_map is not None else auto_spec(shape, variable.dtype, mesh_shape[1])
                )
                layout = dist.TensorLayout(axes, mesh)
            check_spec(path, shape, layout.axes, mesh.axis_names, mesh.shape)
            return layout

    return KDistModelParallel()


# -- after the cell ------------------------------------------------------------------------
def models_in(user_ns: Mapping[str, Any]) -> list:
    keras = sys.modules.get("keras")
    if keras is None:
        return []
    return [v for k, v in list(user_ns.items()) if not k.startswith("_") and isinstance(v, keras.Model)]


def unused_keys(user_ns: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """Keys of the namespace's LayoutMaps (alone or in a ModelParallel) that match no variable
    of its models, and one variable path to show what paths look like."""
    from ..frameworks.compat_keras import layout_key_matches

    keras = sys.modules.get("keras")
    if keras is None:
        return [], None
    maps = []
    for value in list(user_ns.values()):
        if isinstance(value, keras.distribution.LayoutMap):
            maps.append(value)
        elif isinstance(value, keras.distribution.ModelParallel):
            maps.append(getattr(value, "_layout_map", None))
    paths = [v.path for m in models_in(user_ns) for v in m.weights]
    if not paths:
        return [], None
    unused = []
    for layout_map in filter(None, maps):
        for key in layout_map:
            if not any(layout_key_matches(key, p) for p in paths) and key not in unused:
                unused.append(key)
    return unused, paths[0]


@dataclass
class LayoutTable:
    """``last_run().layout()``: each model variable's shape, spec and bytes per device."""

    mesh: tuple[int, int]
    rows: list[dict] = field(default_factory=list)
    optimizer_bytes: int = 0  # optimizer state per device (all models)

    @property
    def weight_bytes(self) -> int:
        return sum(r["bytes_per_device"] for r in self.rows)

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame(self.rows)

    def _lines(self) -> list[tuple[str, str, str, str]]:
        from ...choose.facts import human_bytes

        return [
            (r["variable"], "x".join(map(str, r["shape"])) or "scalar", r["spec"], human_bytes(r["bytes_per_device"]))
            for r in self.rows
        ]

    def per_device_words(self) -> str:
        """What each device holds: ``per device: weights 12 MB, optimizer state 24 MB``."""
        from ...messages import layout_per_device

        return layout_per_device(self.weight_bytes, self.optimizer_bytes)

    def total_words(self) -> str:
        return f"mesh {self.mesh[0]}x{self.mesh[1]} (batch x model); {self.per_device_words()}"

    def __repr__(self) -> str:
        head = ("variable", "shape", "spec", "bytes per device")
        lines = [head, *self._lines()]
        widths = [max(len(row[i]) for row in lines) for i in range(4)]
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines]
        out.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join([*out, "", self.total_words()])

    def _repr_html_(self) -> str:
        esc = html.escape
        body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in self._lines())
        return (
            f"<div class='kdist-layout'><p>{esc(self.total_words())}</p><table><thead><tr>"
            "<th>variable</th><th>shape</th><th>spec</th><th>bytes per device</th></tr></thead>"
            f"<tbody>{body}</tbody></table></div>"
        )


def spec_words(sharding, ndim: int) -> str:
    spec = tuple(getattr(sharding, "spec", ()) or ())
    spec = spec + (None,) * (ndim - len(spec))
    if not any(spec):
        return "replicated"
    return "(" + ", ".join("-" if a is None else "+".join(a) if isinstance(a, tuple) else str(a) for a in spec) + ")"


def _shard_bytes(value) -> int:
    sharding = getattr(value, "sharding", None)
    shape = tuple(value.shape)
    local = sharding.shard_shape(shape) if sharding is not None else shape
    return math.prod(local) * _itemsize(value.dtype)


def table(user_ns: Mapping[str, Any], mesh: tuple[int, int]) -> LayoutTable:
    """Where the namespace's models' variables live now."""
    out = LayoutTable(mesh)
    seen: set[int] = set()
    for model in models_in(user_ns):
        for v in model.weights:
            if id(v) in seen:
                continue
            seen.add(id(v))
            value = v.value
            out.rows.append(
                {
                    "variable": v.path,
                    "shape": tuple(int(d) for d in v.shape),
                    "spec": spec_words(getattr(value, "sharding", None), len(v.shape)),
                    "bytes_per_device": _shard_bytes(value),
                }
            )
        optimizer = getattr(model, "optimizer", None)
        for v in list(getattr(optimizer, "variables", None) or []):
            if id(v) not in seen:
                seen.add(id(v))
                out.optimizer_bytes += _shard_bytes(v.value)
    return out


def engine_rows(mesh: tuple[int, int]) -> dict:  # runs on an engine
    """The layout table of this engine's namespace, as plain data for the kernel."""
    from IPython import get_ipython

    found = table(get_ipython().user_ns, tuple(mesh))
    return {"rows": found.rows, "optimizer_bytes": found.optimizer_bytes}


def engine_distribution(devices, mesh):
    """On an engine (``--strategy sharded --np N``): kdist's ModelParallel over every
    process's devices."""
    from ... import messages
    from ...errors import KDistError

    if mesh[0] * mesh[1] != len(devices):
        raise KDistError(messages.mesh_for_devices(mesh, len(devices)))
    return distribution(devices, mesh)
