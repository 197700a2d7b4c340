"""The strategies, looked up by name and imported only when a cell needs one.

Beside them, what one strategy alone needs: :mod:`.keras_mwms` (Keras 3 ``fit`` under
MultiWorkerMirroredStrategy), :mod:`.compat_backup` (its ``BackupAndRestore`` with several
workers), :mod:`.horovod_build` (Horovod built against this
TensorFlow: ``python -m kdist_magics.strategies.horovod_build``, patches in ``patches/``),
:mod:`.mesh`, :mod:`.layout` and :mod:`.positions` (``sharded``); and what they share:
:mod:`.capabilities` (which strategy honours which option), :mod:`.launcher_env` and
:mod:`.compat_tf_strategy` (code written for a launcher, unchanged), :mod:`.run_script`
(``%kdist run``), and the version shims for Keras, JAX and TensorFlow (:mod:`.compat_keras`,
:mod:`.compat_jax`, :mod:`.compat_tf`).
"""

from __future__ import annotations

import importlib

from ..errors import StrategyUnavailable
from .base import RunContext, Strategy

__all__ = ["RunContext", "Strategy", "create", "REGISTRY"]

#: name -> "module:Class", relative to this package
REGISTRY: dict[str, str] = {
    "default": ".default:DefaultStrategy",
    "mirrored": ".mirrored:MirroredStrategy",
    "tpu": ".tpu:TPUStrategy",
    "horovod": ".horovod:HorovodStrategy",
    "multiworker": ".multiworker:for_backend",  # TF or JAX, by the Keras backend
    "sharded": ".sharded:ShardedStrategy",  # Keras on JAX: ModelParallel over a mesh
}


def create(name: str) -> Strategy:
    """A new strategy object for ``name``; StrategyUnavailable if it is not built."""
    target = REGISTRY.get(name)
    if target is None:
        raise StrategyUnavailable(
            f"--strategy {name} is not available in this version of kdist_magics "
            f"(built: {', '.join(sorted(REGISTRY))})"
        )
    module_name, _, cls = target.partition(":")
    module = importlib.import_module(module_name, __name__)
    return getattr(module, cls)()
