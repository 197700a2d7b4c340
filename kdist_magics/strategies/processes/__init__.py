"""One framework process per engine, all in one process group: what ``--strategy multiworker``
under Keras on JAX or PyTorch and ``--strategy sharded --np N`` stand on.

:mod:`.group` plans such a run (ranks by host, why engines cannot join, restarts);
:mod:`.jax_processes` joins ``jax.distributed`` and runs the cell under a Keras distribution
(DataParallel for multiworker; the sharded family hands its ModelParallel);
:mod:`.torch_processes` joins ``torch.distributed``; :mod:`.launcher_env` runs code written for
a launcher (``torchrun``'s variables, ``jax.distributed.initialize()``) unchanged inside it.
"""
