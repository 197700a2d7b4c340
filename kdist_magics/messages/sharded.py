"""kdist's words for ``--strategy sharded`` (strategies/sharded/): the mesh, the layout, a model
built outside it. Imported through :mod:`kdist_magics.messages`."""

from __future__ import annotations


def _mesh(mesh) -> str:
    return f"{mesh[0]},{mesh[1]}"


def mesh_unreadable(text) -> str:
    return f"--mesh: {text!r} is not a mesh; give D,M (data axis D, model axis M, whole numbers >= 1), e.g. --mesh 2,2"


def model_axis_too_big(mesh, places: int, what: str) -> str:
    return (
        f"--mesh {_mesh(mesh)}: a model axis of {mesh[1]} is more than the {places} devices "
        f"{what} gives; give M <= {places}"
    )


def mesh_not_dividing(mesh, places: int, what: str) -> str:
    need = "a multiple of" if what.startswith("--np") else "equal to"
    return (
        f"--mesh {_mesh(mesh)} has {mesh[0] * mesh[1]} places, not {need} the {places} "
        f"{'processes' if what.startswith('--np') else 'devices'} {what} gives; "
        f"D x M must be {need} {places}"
    )


def mesh_for_devices(mesh, devices: int) -> str:
    return (
        f"--mesh {_mesh(mesh)} has {mesh[0] * mesh[1]} places for the {devices} devices this "
        f"run has; D x M must equal {devices}. The cell did not run."
    )


def sharded_not_on(backend: str) -> str:
    """--strategy sharded under a Keras backend other than JAX."""
    return (
        f"--strategy sharded needs Keras on JAX (Keras 3.15 shards a model with "
        f"keras.distribution.ModelParallel on JAX only); this kernel's Keras runs on {backend}: "
        f"restart the kernel with KERAS_BACKEND=jax, or keep {backend} and use --strategy "
        f"mirrored (a full copy of the model per device). The cell did not run."
    )


def built_outside_mesh(names: list[str], devices: int) -> str:
    """A sharded cell would use a model built before it, outside its mesh."""
    which = ", ".join(f"'{n}'" for n in names)
    return (
        f"{which} {'was' if len(names) == 1 else 'were'} built before this cell, outside "
        f"--strategy sharded: {'its' if len(names) == 1 else 'their'} weights live on one "
        f"device, and JAX cannot mix them with the mesh's {devices} devices. Build the model "
        f"inside the %%kdist --strategy sharded cell (a model built before only helps kdist "
        f"choose the mesh). The cell did not run."
    )


def mesh_reused(mesh, devices: int) -> str:
    """A sharded cell without --mesh on the devices of an earlier one keeps its mesh."""
    return (
        f"mesh {_mesh(mesh)} over {devices} devices, as the previous sharded cell on them "
        f"chose; --mesh D,M chooses another"
    )


def mesh_chosen(mesh, devices: int, why: str) -> str:
    return (
        f"mesh {_mesh(mesh)} over {devices} devices (data axis {mesh[0]}, model axis "
        f"{mesh[1]}): {why}; --mesh D,M chooses another"
    )


def mesh_why_fits(model: str, share: str, device: str) -> str:
    return f"the smallest model axis whose share of {model} ({share} per device) fits one device ({device})"


def mesh_why_unknown() -> str:
    return "no built model in the namespace to measure, so the model axis takes every device"


def mesh_why_too_big(model: str, share: str, device: str) -> str:
    return (
        f"{model} does not fit one device ({device}) even sharded over every device "
        f"({share} each): expect out-of-memory"
    )


def layout_missing_axis(path: str, axes, names) -> str:
    return f"kdist: the layout of {path} names mesh axis {axes!r}, but the mesh has only {', '.join(map(repr, names))}"


def layout_not_divisible(path: str, shape, dim: int, axis: str, size: int) -> str:
    return (
        f"kdist: {path} {tuple(shape)}: dimension {dim} ({shape[dim]}) does not split over "
        f"mesh axis {axis!r} of {size}; give a layout or a mesh whose axis divides it"
    )


def layout_keys_unused(keys: list[str], example: str | None) -> str:
    shown = ", ".join(repr(k) for k in keys)
    hint = f" (a variable path here: {example!r})" if example else ""
    return (
        f"LayoutMap key{'s' if len(keys) > 1 else ''} {shown} matched no variable, so those "
        f"variables stay replicated; keys must match the whole path (re.fullmatch){hint}"
    )


def layout_per_device(weight_bytes: int, optimizer_bytes: int) -> str:
    """A sharded run's share of the model on each device (the dashboard, ``layout()``)."""
    from ..choose.facts import human_bytes

    return f"per device: weights {human_bytes(weight_bytes)}, optimizer state {human_bytes(optimizer_bytes)}"


def logical_devices_share_cores(devices: int, cores: int) -> str:
    """A sharded cell over more logical CPU devices than cores."""
    return (
        f"the {devices} devices are logical CPU devices sharing {cores} core"
        f"{'s' if cores != 1 else ''}: meshes differ here in where the weights live, not in "
        f"speed (on GPUs or TPUs each device computes on its own)"
    )
