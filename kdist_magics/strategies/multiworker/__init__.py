"""``--strategy multiworker``: data parallelism over engine processes, by the Keras backend.

:mod:`.tf_workers` (MultiWorkerMirroredStrategy; ``for_backend`` picks the family member),
:mod:`.jax_processes` and :mod:`.torch_processes` (one framework process per engine, sharing
:mod:`.processes`); the Keras 3 fixes MultiWorkerMirroredStrategy needs (:mod:`.keras_mwms`,
:mod:`.compat_backup`); code written for a launcher, run unchanged (:mod:`.launcher_env`,
with :mod:`..frameworks.compat_tf_strategy`) and ``%kdist run`` (:mod:`.run_script`).
"""
