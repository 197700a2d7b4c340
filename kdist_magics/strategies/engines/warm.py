"""``%kdist start``: warm an engine strategy's engines while the user writes the first cell.

:class:`Warming` starts (or reuses) the strategy's cluster in a background thread, exactly as
the first cell would, then sets each engine's thread variables and imports the strategy's
framework there (``EngineStrategy.warm_modules``: TensorFlow and Horovod for horovod,
TensorFlow for multiworker, JAX or torch for their backends), so the first cell finds warm
engines. The cell waits for a warming still under way (and says so); if warming failed, the
cell starts the engines itself, as without ``%kdist start``.

Nothing is printed from the background thread (its lines would land in whatever cell runs
then): ``%kdist status`` tells how it went, and the first cell says it used the warm engines.

Engines that see NVIDIA GPUs skip the imports: a rank's GPU is chosen when its cell starts,
and TensorFlow must not have touched CUDA before that.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable


class Warming:
    """One ``%kdist start`` of one strategy: a thread, and what it found."""

    def __init__(self, n: int, work: Callable[[], dict[str, Any]]):
        self.n = n
        self.started = time.time()
        self.finished: float | None = None
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self._work = work
        self.thread = threading.Thread(target=self._run, name="kdist-warm", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self._work()
        except BaseException as exc:  # noqa: BLE001 - reported by status and the first cell
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.finished = time.time()

    @property
    def busy(self) -> bool:
        return self.thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def describe(self) -> str:
        """For ``%kdist status``."""
        if self.busy:
            return f"warming {self.n} engines ({time.time() - self.started:.0f} s so far)"
        if self.error:
            return f"%kdist start failed: {self.error}"
        took = (self.finished or self.started) - self.started
        imported = ", ".join((self.result or {}).get("imported") or []) or "nothing"
        skipped = (self.result or {}).get("skipped")
        return (
            f"{self.n} engines warmed by %kdist start in {took:.1f} s (imported {imported}"
            + (f"; {skipped}" if skipped else "")
            + ")"
        )


def warm_remote(
    threads: int | None, local_size: int, cwd: str | None, modules: tuple[str, ...]
) -> dict[str, Any]:  # runs on an engine
    """Thread variables as the run sets them, then ``modules`` imported; what was done."""
    import importlib

    from kdist_magics.cluster.placement import visible_gpus
    from kdist_magics.strategies.engines.prepare import prepare_remote

    if visible_gpus(os.environ):
        return {"imported": [], "skipped": "GPUs here: the framework starts with the first cell"}
    prepare_remote({}, threads, local_size, cwd)  # as a run prepares its ranks
    t0 = time.monotonic()
    for name in modules:
        importlib.import_module(name)
    return {"imported": list(modules), "seconds": time.monotonic() - t0}


def start(strategy, ctx) -> Warming:
    """Warm ``strategy``'s engines for runs like ``ctx.spec``, in the background (the strategy
    keeps it: :meth:`~.strategy.EngineStrategy.warm`)."""
    from ...cluster.placement import local_ranks

    def work() -> dict[str, Any]:
        t0 = time.monotonic()
        cluster = strategy._cluster(ctx)
        hosts = [e.hostname for e in cluster.engines]
        cwd = os.getcwd() if cluster.owned else None
        ars = [
            cluster.client[e.engine_id].apply_async(
                warm_remote, ctx.options.threads_per_rank, size, cwd, strategy.warm_modules
            )
            for e, (_, size) in zip(cluster.engines, local_ranks(hosts, list(range(len(hosts)))))
        ]
        results = [ar.get(timeout=600) for ar in ars]
        skipped = next((r["skipped"] for r in results if r.get("skipped")), None)
        return {
            "imported": [] if skipped else list(strategy.warm_modules),
            "skipped": skipped,
            "seconds": time.monotonic() - t0,
        }

    return Warming(strategy.size(ctx.spec), work)


def wait_for(warming: Warming, cluster, quiet: bool = False) -> None:
    """Before a run (or another start): let a ``%kdist start`` under way finish; say what it
    left (``cluster``: the strategy's, after it)."""
    from ...messages import say, warm_failed, warm_used, warm_waiting

    if warming.busy:
        if not quiet:
            say(warm_waiting(warming.n))
        warming.wait()
    if quiet:
        return
    if warming.error:
        say(warm_failed(warming.error), warn=True)
    elif cluster is not None and cluster.running:
        say(warm_used(warming.n, time.time() - (warming.finished or time.time())))
