"""``hvd.elastic`` is not provided by the Keras 3 binding.

Horovod's elastic Keras state (``KerasState``, ``CommitStateCallback`` ...) relies on
Keras 2 internals; under Keras 3 use a fixed-size job (kdist's ``--np``).
"""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(
        f"hvd.elastic.{name}: Horovod's elastic Keras API is not available under Keras 3 "
        "(kdist_magics' binding covers the fixed-size API: DistributedOptimizer, callbacks, "
        "collectives)")
