"""A Keras model built before the sharded cell, outside its mesh, that the cell goes on to use.

Keras on JAX places such a model's variables on one device; compiled and fit inside
``ModelParallel`` over several devices, JAX refuses the step ("Received incompatible devices
for jitted computation", after Keras warns of "a mix of local ... and distributed
variables"). The cell is read before it runs: a model it uses by a name it never assigns,
whose variables sit on one device while the mesh has more, is named in one line and the cell
does not run.
"""

from __future__ import annotations

import ast
import sys
from typing import Any, Mapping


def names_used_not_assigned(source: str) -> set[str]:
    """Names ``source`` reads and never assigns (anywhere in it)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    read, stored = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else stored).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stored.add(node.name)
        elif isinstance(node, ast.arg):  # a function's own parameters
            stored.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            stored.update((a.asname or a.name).split(".")[0] for a in node.names)
    return read - stored


def _devices_of(model) -> int:
    """How many devices the model's variables are on (the most of any one variable)."""
    most = 0
    for variable in getattr(model, "variables", []):
        sharding = getattr(getattr(variable, "value", None), "sharding", None)
        if sharding is not None:
            most = max(most, len(sharding.device_set))
    return most


def built_outside(source: str, user_ns: Mapping[str, Any], mesh_devices: int) -> list[str]:
    """Names of the notebook's models the cell uses whose variables sit on one device while the
    mesh has ``mesh_devices`` (more than one)."""
    keras = sys.modules.get("keras")
    if keras is None or mesh_devices < 2:
        return []
    found = []
    for name in sorted(names_used_not_assigned(source)):
        value = user_ns.get(name)
        if isinstance(value, keras.Model) and _devices_of(value) == 1:
            found.append(name)
    return found
