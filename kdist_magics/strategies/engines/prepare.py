"""An engine prepared for a run, on the engine: thread variables, the strategy's environment,
the working folder and the rank's GPU.

Shared by a run (:mod:`~kdist_magics.strategies.engines.strategy`, :mod:`.grow`) and ``%kdist start`` (:mod:`.warm`,
which warms engines exactly as a run prepares them), so neither imports the other for it.
"""

from __future__ import annotations


def prepare_remote(env, threads, local_size, cwd=None, gpu=None):  # runs on an engine
    """:func:`kdist_magics.engine.engine.prepare` with this host's threads per rank; what it did."""
    from kdist_magics.engine import engine

    return engine.prepare(env, engine.threads_per_rank(local_size, threads), cwd, gpu, local_size)
