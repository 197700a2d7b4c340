"""``--mesh D,M`` for ``--strategy sharded``: reading it, checking it against the devices, and
choosing it when the line does not give one.

Pure Python (no JAX, no Keras): the line parser (:mod:`kdist_magics.spec`) checks a mesh here
before anything starts, and the advisor sizes one here from its facts.
"""

from __future__ import annotations

from IPython.core.error import UsageError

from ... import messages


def parse_mesh(text: str | None) -> tuple[int, int] | None:
    """``"2,2"`` -> ``(2, 2)``; UsageError for anything else than two positive whole numbers."""
    if text is None:
        return None
    parts = [p.strip() for p in str(text).replace("x", ",").split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) != 2 or min(shape) < 1:
        raise UsageError(messages.mesh_unreadable(text))
    return shape  # type: ignore[return-value]


def check_mesh(mesh: tuple[int, int] | None, devices: int | None, np: int | None) -> None:
    """A mesh that cannot work with the devices or processes asked for: UsageError, one line."""
    if mesh is None:
        return
    d, m = mesh
    places = np if np else devices
    if places is None:
        return
    what = f"--np {np}" if np else f"--devices {devices}"
    if m > places:
        raise UsageError(messages.model_axis_too_big(mesh, places, what))
    if np and (d * m) % np:
        raise UsageError(messages.mesh_not_dividing(mesh, np, what))
    if not np and d * m != devices:
        raise UsageError(messages.mesh_not_dividing(mesh, devices, what))


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def pick_model_axis(n: int, train_bytes: int | None, device_bytes: int | None) -> int | None:
    """The smallest model axis (a divisor of ``n``) whose share of ``train_bytes`` (weights,
    gradients, optimizer state) fits ``device_bytes``; None when even ``n`` is too few or the
    sizes are unknown."""
    if not train_bytes or not device_bytes:
        return None
    for m in divisors(n):
        if train_bytes / m <= device_bytes:
            return m
    return None
