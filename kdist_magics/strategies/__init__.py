"""The strategies, looked up by name and imported only when a cell needs one.

One folder per family, each with what only it needs beside it:

- :mod:`.kernel`: the strategies that run the cell in the notebook (``default``, ``mirrored``,
  ``tpu``; Keras on JAX's ``DataParallel``) and their ``--timeout``/``--checkpoint``;
- :mod:`.engines`: what every strategy whose cell runs on ipyparallel engines shares (the run's
  steps, its supervisor, waiting, results, the ranks' output, ``%kdist start``);
- :mod:`.horovod`: ``--strategy horovod`` (and elastic growth; Horovod's build and patches);
- :mod:`.multiworker`: ``--strategy multiworker`` on TensorFlow, JAX and PyTorch, code written for
  a launcher, and ``%kdist run``;
- :mod:`.sharded`: ``--strategy sharded`` (the mesh, where each variable lives, data positions);
- :mod:`.frameworks`: what several families need of Keras' backends (which backend, in-memory
  data fitted to a run) and the version shims for Keras, JAX and TensorFlow.

Here: :mod:`.base` (what every strategy provides) and :mod:`.capabilities` (which strategy
honours which option).
"""

from __future__ import annotations

import importlib

from ..errors import StrategyUnavailable
from .base import RunContext, Strategy

__all__ = ["RunContext", "Strategy", "create", "REGISTRY"]

#: name -> "module:Class", relative to this package
REGISTRY: dict[str, str] = {
    "default": ".kernel.default:DefaultStrategy",
    "mirrored": ".kernel.mirrored:MirroredStrategy",
    "tpu": ".kernel.tpu:TPUStrategy",
    "horovod": ".horovod.strategy:HorovodStrategy",
    "multiworker": ".multiworker.tf_workers:for_backend",  # TF or JAX, by the Keras backend
    "sharded": ".sharded.strategy:ShardedStrategy",  # Keras on JAX: ModelParallel over a mesh
}


def create(name: str) -> Strategy:
    """A new strategy object for ``name``; StrategyUnavailable if it is not built."""
    target = REGISTRY.get(name)
    if target is None:
        raise StrategyUnavailable(
            f"--strategy {name} is not available in this version of kdist_magics (built: {', '.join(sorted(REGISTRY))})"
        )
    module_name, _, cls = target.partition(":")
    module = importlib.import_module(module_name, __name__)
    return getattr(module, cls)()
