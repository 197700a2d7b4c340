"""Where a cluster kdist starts runs its engines, by ``--launcher`` name: "local" (this machine:
:class:`~.cluster.EngineCluster` itself) or a registered launcher. A launcher is a function
``submit(n, ctx, news)`` that returns its cluster (a subclass of ``EngineCluster``, stating
``launcher``), not yet started; ``ctx`` is the run's context and ``news`` how kdist tells what
it does. kdist's own, Slurm's and Ray's, are registered as another package registers one: under
the ``kdist_magics.launchers`` entry point (``pyproject.toml``), ``name = "module:function"``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Callable

GROUP = "kdist_magics.launchers"
LOCAL = "local"
#: kdist's own, also where the package's metadata is not installed (a source tree on sys.path)
BUILT_IN = {"ray": "kdist_magics.cluster.ray_engines:submit", "slurm": "kdist_magics.cluster.slurm_engines:submit"}


def registered() -> dict[str, str]:
    """Every registered launcher's ``module:function``, by name; kdist's own win over a
    package's entry point of the same name."""
    found = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    return {**found, **BUILT_IN}


def names() -> tuple[str, ...]:
    """What ``--launcher`` takes: "local", then every registered launcher by name."""
    return (LOCAL, *sorted(registered()))


def submitter(name: str) -> Callable:
    """The ``submit`` function of launcher ``name``; LookupError where none is registered."""
    value = registered().get(name)
    if value is None:
        raise LookupError(f"no launcher {name!r} is registered (there are: {', '.join(names())})")
    module, _, function = value.partition(":")
    return getattr(importlib.import_module(module), function)
