"""What several strategy families need of Keras' backends, and the version shims.

:mod:`.backends` (which Keras backend, read without importing Keras), :mod:`.fit_data`
(in-memory data fitted to how a run divides the work), and the shims for Keras, JAX and
TensorFlow (:mod:`.compat_keras`, :mod:`.compat_jax`, :mod:`.compat_tf`).
"""
