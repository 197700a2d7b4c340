"""``--strategy multiworker``: data parallelism over engine processes, by the Keras backend.

:mod:`.tf_workers` (MultiWorkerMirroredStrategy; ``for_backend`` picks the family member:
under Keras on JAX or PyTorch, one framework process per engine, :mod:`..processes`); the
Keras 3 fixes MultiWorkerMirroredStrategy needs (:mod:`.keras_mwms`, :mod:`.compat_backup`);
TensorFlow code written for a launcher, run unchanged (:mod:`..frameworks.compat_tf_strategy`)
and ``%kdist run`` (:mod:`.run_script`).
"""
