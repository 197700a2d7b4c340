"""JAX 0.7-0.12: whether its backends exist yet, asked without starting one (telemetry must
not be the first JAX use in a process)."""

from __future__ import annotations


def jax_backend_ready() -> bool:
    """Whether JAX's backends already exist (then reading TPU memory cannot start them).

    ``jax._src.xla_bridge._backends`` (jax 0.7.2 to 0.12.1); no public accessor. Never starts
    a backend itself."""
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", None))
    except Exception:
        return False
