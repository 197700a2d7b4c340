"""The strategies that run the cell in the notebook's own process.

:mod:`.default`, :mod:`.mirrored` and :mod:`.tpu` (TensorFlow's strategies, or Keras on JAX's
``DataParallel`` through :mod:`.jax_dp`) run the cell with :mod:`.run`, whose ``--timeout`` and
``--checkpoint`` are :mod:`.limits`.
"""
