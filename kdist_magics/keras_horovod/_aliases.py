"""Making ``import horovod.tensorflow.keras`` (and ``horovod.keras``) resolve to
:mod:`kdist_magics.keras_horovod` while Keras 3 is the active Keras; :func:`uninstall` restores
Horovod's own modules."""

from __future__ import annotations

import importlib
import os
import sys

PACKAGE = __name__.rpartition(".")[0]  # kdist_magics.keras_horovod
_ALIASES = ("horovod.tensorflow.keras", "horovod.keras")
_saved: dict | None = None


def keras3_active() -> bool:
    """True when ``import keras`` / ``tf.keras`` gives Keras 3 (not tf_keras / Keras 2).

    Decided without importing Keras when it is not imported yet (from the installed
    distribution's version and ``TF_USE_LEGACY_KERAS``).
    """
    if os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes"):
        return False
    return _keras_major() >= 3


def _keras_major() -> int:
    version = None
    mod = sys.modules.get("keras")
    if mod is not None:
        version = getattr(mod, "__version__", None)
        if version is None and callable(getattr(mod, "version", None)):
            version = mod.version()
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("keras")
        except Exception:  # no keras distribution at all
            return 0
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


def is_installed() -> bool:
    return _saved is not None


def install() -> bool:
    """Alias this module as ``horovod.tensorflow.keras`` and ``horovod.keras`` (and their
    ``.callbacks`` and ``.elastic``) when Keras 3 is active; returns whether it did. Idempotent."""
    global _saved
    if _saved is not None:
        return True
    if not keras3_active():
        return False
    me = importlib.import_module(PACKAGE)
    cb = importlib.import_module(f"{PACKAGE}.callbacks")
    elastic = importlib.import_module(f"{PACKAGE}.elastic")
    saved: dict = {"modules": {}, "attrs": []}
    for alias in _ALIASES:
        for name, module in ((alias, me), (f"{alias}.callbacks", cb), (f"{alias}.elastic", elastic)):
            saved["modules"][name] = sys.modules.get(name)
            sys.modules[name] = module
        parent_name, _, child = alias.rpartition(".")
        parent = sys.modules.get(parent_name)
        if parent is not None:
            saved["attrs"].append((parent, child, parent.__dict__.get(child, _MISSING)))
            setattr(parent, child, me)
    _saved = saved
    return True


def uninstall() -> None:
    """Undo :func:`install` (restore Horovod's own modules and attributes)."""
    global _saved
    if _saved is None:
        return
    for name, module in _saved["modules"].items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
    for parent, child, old in _saved["attrs"]:
        if old is _MISSING:
            parent.__dict__.pop(child, None)
        else:
            setattr(parent, child, old)
    _saved = None


class _Missing:
    pass


_MISSING = _Missing()
