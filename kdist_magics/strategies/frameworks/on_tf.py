"""What the strategies ask of TensorFlow, in one place: the devices a MirroredStrategy gets
(:func:`plan_devices`: GPUs, or logical CPU devices made before TF's runtime starts), the TPU
connection (:class:`TPURuntime`: resolve, connect, initialise, the TPUStrategy), the strategy
a cell on one device runs under (:func:`current_strategy`) and a worker's
MultiWorkerMirroredStrategy (:func:`multi_worker_strategy`). The JAX side is :mod:`.on_jax`,
PyTorch's :mod:`.on_torch`; the cell's own ``tf.distribute`` strategies are
:mod:`.compat_tf_strategy`. Importing this module imports no TensorFlow: each call does.
"""

from __future__ import annotations

import logging
from typing import Any

from ...errors import DevicesFixed, StrategyUnavailable
from .backends import CPU_DEFAULT_DEVICES


def plan_devices(wanted: int | None, tf: Any = None) -> tuple[list[str], str]:
    """The device names for MirroredStrategy and a word for what they are (``tf``: the
    module, or a fake in tests).

    Configures logical CPU devices when TF's runtime has not started yet;
    raises :class:`DevicesFixed` when it started with too few.
    """
    if tf is None:
        import tensorflow as tf  # quietly: watch/tf_logs.py's import hook
    gpus = tf.config.list_physical_devices("GPU")  # does not start the runtime
    if gpus:
        n = wanted or len(gpus)
        if n > len(gpus):
            raise StrategyUnavailable(
                f"--devices {n}: this machine has {len(gpus)} GPU{'s' if len(gpus) != 1 else ''} "
                f"visible to TensorFlow; give --devices {len(gpus)} or fewer. The cell did not run."
            )
        return [f"/gpu:{i}" for i in range(n)], "GPU"
    n = wanted or CPU_DEFAULT_DEVICES
    asked = f"--devices {n}" if wanted else f"mirrored's default of {n} CPU devices"
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is None or len(current) < n:
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        except RuntimeError:  # "Virtual devices cannot be modified after being initialized"
            have = len(tf.config.list_logical_devices("CPU"))
            if have < n:
                raise DevicesFixed(
                    f"TensorFlow in this kernel already started with {have} CPU device"
                    f"{'s' if have != 1 else ''}, and it fixes its devices at start-up, so "
                    f"{asked} cannot take effect now. Restart the kernel and run this "
                    f"%%kdist cell before any other TensorFlow code. The cell did not run."
                ) from None
    return [f"/cpu:{i}" for i in range(n)], "logical CPU"


class TPURuntime:
    """TensorFlow's side of a TPU connection (replaced by a fake in tests)."""

    def check(self, target: str, timeout: float = 5.0) -> None:
        """Fail fast when an address-based TPU does not answer (TF would wait a long time)."""
        if not target.startswith("grpc://"):
            return
        import socket

        host, _, port = target[len("grpc://") :].rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
        except (OSError, ValueError) as exc:
            raise ConnectionError(f"{host}:{port} does not answer ({exc})") from None

    def resolver(self, target: str):
        import tensorflow as tf

        return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=target)

    def initialize(self, resolver, target: str) -> None:
        import tensorflow as tf

        if target != "local":  # a TPU node: its TF server is remote
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)

    def strategy(self, resolver):
        import tensorflow as tf

        return tf.distribute.TPUStrategy(resolver)


def current_strategy() -> Any:
    """TensorFlow's default strategy (one device): what ``--strategy default`` binds."""
    import tensorflow as tf  # quietly: watch/tf_logs.py's import hook

    return tf.distribute.get_strategy()


#: whether a worker's TensorFlow logger was set to warnings (once per process)
_LOGGER: dict[str, bool] = {}


def multi_worker_strategy() -> Any:
    """A MultiWorkerMirroredStrategy for this worker (``TF_CONFIG`` already set). In an
    interactive process (an engine is one) TensorFlow's logger defaults to INFO, and the
    strategy logs every collective it builds: warnings only, unless the user chose a level."""
    import tensorflow as tf

    logger = tf.get_logger()
    if logger.level in (logging.NOTSET, logging.INFO) and not _LOGGER.get("set"):
        logger.setLevel(logging.WARNING)
        _LOGGER["set"] = True
    return tf.distribute.MultiWorkerMirroredStrategy()


def mirrored_strategy(devices: list[str]) -> Any:
    """``tf.distribute.MirroredStrategy`` over ``devices``."""
    import tensorflow as tf  # quietly: watch/tf_logs.py's import hook

    return tf.distribute.MirroredStrategy(devices=devices)
