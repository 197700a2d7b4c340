"""What several strategy families need of Keras' backends, so that they import it and not
each other, and the version shims.

:mod:`.backends` (which Keras backend, read without importing Keras), :mod:`.fit_data`
(in-memory data fitted to how a run divides the work), one seam per backend, what every family
asks of it (:mod:`.on_jax`: devices, data parallelism's ``strategy``, batches that split evenly;
:mod:`.on_tf`: MirroredStrategy's devices, the TPU connection, the default and multi-worker
strategies; :mod:`.on_torch`: a process group, ``fit``'s gradients all-reduced),
:mod:`.compat_tf_strategy` (the cell's own ``tf.distribute`` strategies handed the run's), and
the shims for Keras, JAX and TensorFlow (:mod:`.compat_keras`, :mod:`.compat_jax`,
:mod:`.compat_tf`).
"""
