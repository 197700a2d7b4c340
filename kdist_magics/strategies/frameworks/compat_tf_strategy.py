"""TensorFlow 2.16-2.21: ``tf.distribute``'s own strategy classes hand back the run's strategy
inside a kdist cell.

Code written for a ``TF_CONFIG`` launch (TensorFlow's tutorial "Multi-worker training with
Keras", most ``train.py`` files) creates ``tf.distribute.MultiWorkerMirroredStrategy()`` itself
and enters its scope. In a ``--strategy multiworker`` cell kdist's strategy exists already and
its scope is entered, and TensorFlow allows neither a second one (entering its scope raises
``RuntimeError: Mixing different tf.distribute.Strategy objects``; creating one in a process
whose collectives are configured raises ``Collective ops must be configured at program
startup``). That is TensorFlow's design (collectives are configured once per process), not a
bug with an upstream issue, so this module bridges it for kdist's cells only.

While :func:`multiworker` (or :func:`mirrored`) is entered, constructing the class -- or a
subclass, such as the ``tf.distribute.experimental.MultiWorkerMirroredStrategy`` alias --
returns the run's strategy object: the same collectives, the same ``cluster_resolver``
(``task_type``/``task_id``, so the tutorial's chief-only saving works), and ``scope()`` may be
entered again. Arguments that contradict the run (a cluster resolver with another number of
workers or another task, another device list) raise :class:`~kdist_magics.errors.LauncherMismatch`
with one line naming the kdist option; ``communication_options`` and ``cross_device_ops`` are
the run's. The classes are restored exactly when the cell ends.

Checked against TensorFlow 2.21.0 (``CollectiveAllReduceStrategy`` and ``MirroredStrategy`` in
``tensorflow/python/distribute``): the patch sets ``__new__``/``__init__`` on the class, so
``isinstance`` checks and TensorFlow's own references to the class are unchanged; ``__init__``
is restored after the cell, ``__new__`` stays as a pass-through (:func:`_pass_through_new`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

from ...errors import LauncherMismatch
from ...messages import launcher_mismatch


#: class -> (the object its constructor hands back, the argument check), while a cell runs
_ACTIVE: dict[type, tuple[Any, Callable[[type, tuple, dict], None]]] = {}


def _pass_through_new(cls: type) -> None:
    """Give ``cls`` a ``__new__`` that hands back ``_ACTIVE[cls]`` while that is set and
    otherwise does what the inherited one did. It stays after the cell: CPython cannot give a
    class back its inherited ``__new__`` once one was set (deleting it leaves
    ``object.__new__`` refusing the constructor's arguments), so this one passes through."""
    if cls.__dict__.get("_kdist_hands_back"):
        return
    inherited = cls.__new__

    def __new__(klass, *args, **kwargs):
        __tracebackhide__ = True
        active = _ACTIVE.get(cls)
        if active is not None:
            active[1](klass, args, kwargs)
            return active[0]
        if inherited is object.__new__:
            return object.__new__(klass)
        return inherited(klass, *args, **kwargs)

    cls.__new__ = staticmethod(__new__)
    cls._kdist_hands_back = True


@contextlib.contextmanager
def handing_back(cls: type, instance: Any, check: Callable[[type, tuple, dict], None]):
    """While inside, ``cls(...)`` (and a subclass's) returns ``instance`` once ``check(klass,
    args, kwargs)`` accepted the arguments (it raises for ones that contradict ``instance``);
    other objects of ``cls`` keep their own ``__init__``. On exit ``cls`` constructs as before
    (see :func:`_pass_through_new`)."""
    _pass_through_new(cls)
    init = cls.__dict__.get("__init__")
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        if self is not instance:
            original(self, *args, **kwargs)

    cls.__init__ = __init__
    _ACTIVE[cls] = (instance, check)
    try:
        yield instance
    finally:
        _ACTIVE.pop(cls, None)
        if init is not None:
            cls.__init__ = init
        else:
            delattr(cls, "__init__")


def _tasks(resolver) -> int:
    spec = resolver.cluster_spec().as_dict()
    return sum(len(spec.get(role, [])) for role in ("chief", "worker"))


def multiworker_check(workers: int, task: int) -> Callable[[type, tuple, dict], None]:
    """Accepts arguments a ``MultiWorkerMirroredStrategy`` of ``workers`` workers, this one
    ``task``, can stand for: a cluster resolver (positional or keyword) must agree."""

    def check(klass, args, kwargs):
        __tracebackhide__ = True
        call = "tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=...)"
        for resolver in [v for v in (*args, *kwargs.values()) if hasattr(v, "cluster_spec")]:
            n = _tasks(resolver)
            if n != workers:
                raise LauncherMismatch(
                    launcher_mismatch(call, f"{n} workers", f"{workers} (--np {workers})", f"give --np {n}")
                )
            given = getattr(resolver, "task_id", None)
            if given is not None and given != task:
                raise LauncherMismatch(
                    launcher_mismatch(
                        call,
                        f"task {given}",
                        f"this engine as task {task}",
                        "ranks are kdist's (TF_CONFIG describes them)",
                    )
                )

    return check


@contextlib.contextmanager
def multiworker(strategy):
    """During a ``--strategy multiworker`` cell: ``tf.distribute.MultiWorkerMirroredStrategy()``
    (and the ``experimental`` alias) return ``strategy``."""
    import tensorflow as tf

    resolver = strategy.cluster_resolver
    check = multiworker_check(_tasks(resolver), resolver.task_id)
    with handing_back(tf.distribute.MultiWorkerMirroredStrategy, strategy, check):
        yield strategy


def device_key(name) -> tuple[str, int]:
    """``("GPU", 1)`` for ``"/gpu:1"``, ``"GPU:1"``, ``"/job:localhost/.../device:GPU:1"``."""
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(name if isinstance(name, str) else name.name)
    return (spec.device_type or "").upper(), spec.device_index or 0


def mirrored_check(devices: list[str]) -> Callable[[type, tuple, dict], None]:
    """Accepts ``MirroredStrategy`` arguments naming no devices, or the run's ``devices``."""
    want = sorted(device_key(d) for d in devices)

    def check(klass, args, kwargs):
        __tracebackhide__ = True
        given = kwargs.get("devices", args[0] if args else None)
        if given is None:
            return
        given = [given] if isinstance(given, str) else list(given)
        if sorted(device_key(d) for d in given) != want:
            raise LauncherMismatch(
                launcher_mismatch(
                    f"tf.distribute.MirroredStrategy(devices={given!r})",
                    f"{len(given)} devices",
                    f"{len(devices)} ({', '.join(devices)})",
                    f"give --devices {len(given)} (kdist picks the devices)",
                )
            )

    return check


@contextlib.contextmanager
def mirrored(strategy, devices: list[str]):
    """During a ``--strategy mirrored`` cell: the strategy's scope, and
    ``tf.distribute.MirroredStrategy()`` returns ``strategy``."""
    import tensorflow as tf

    with handing_back(tf.distribute.MirroredStrategy, strategy, mirrored_check(devices)):
        with strategy.scope():
            yield strategy
