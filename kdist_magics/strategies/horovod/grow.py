"""``--max-np M``: an elastic Horovod run takes in engines that register during the run.

Made per run by :class:`~.horovod.HorovodStrategy` and stepped by the run's supervisor at every
death check (:meth:`Growth.step`). An engine that registers with the cluster while the run
goes on (``ipcluster engines``, another SLURM job, ``Cluster.start_engines``) and while the
job has fewer than M ranks goes through:

1. **warming**: identified, given the run's thread settings and kdist's per-run state
   (telemetry under its own rank label), and TensorFlow, Horovod and the binding imported,
   in the background (seconds), so that the job waits for it as little as possible;
2. **joining**: the kernel re-forms the rendezvous with it (:meth:`Rendezvous.grow`) and says
   "hosts added" on the abort line, so every rank raises ``HostsUpdatedInterrupt`` at its
   next commit, resets and asks for its new rank; the new engine asks too
   (``on_engine.hvd_join``) and initialises Horovod with the others;
3. **running**: the cell is sent to it; ``hvd.elastic.run`` there syncs rank 0's state.

If the run ends before the ranks reach a commit, a joining engine is let go (it never runs
the cell).
"""

from __future__ import annotations

import os
from typing import Any

from ...cluster.cluster import EngineInfo, _identify
from ...cluster.compat_ipyparallel import children
from ...messages import say


class Growth:
    """The engines joining one elastic run (see the module doc)."""

    def __init__(self, strategy, run, max_np: int, keras_names: dict | None):
        self.strategy = strategy
        self.run = run  # the EngineRun it grows (its cell and --push values)
        self.cluster = run.cluster
        self.ctx = run.ctx
        self.max_np = max_np
        self.keras_names = keras_names
        self.joining: dict[int, dict[str, Any]] = {}  # engine id -> its stage and request
        self.refused: set[int] = set()  # engine ids seen that the run did not take

    # -- one step --------------------------------------------------------------------
    def step(self, final: bool = False) -> list[tuple[int, EngineInfo, Any]]:
        """Advance every joining engine; ``(rank label, engine, cell future)`` of those that
        now run the cell. ``final``: the others are done, let joining engines go."""
        if final:
            self._let_go()
            return []
        self._look_for_engines()
        started = []
        registered = set(self.cluster.client.ids)
        for eid, item in list(self.joining.items()):
            ar = item["ar"]
            if eid not in registered:  # gone while joining: the others must not wait for it
                del self.joining[eid]
                if item["stage"] == "joining":
                    self.strategy.rendezvous.shrink([item["index"]])
                self.ctx.record.set_rank(item["label"], state="failed", error="the engine went away while joining")
                say(f"engine {eid} went away while joining the run", warn=True)
                continue
            if not ar.ready():
                continue
            try:
                ar.get()
            except Exception as exc:
                del self.joining[eid]
                if item["stage"] == "joining":  # the others must not wait for it
                    self.strategy.rendezvous.shrink([item["index"]])
                say(
                    f"engine {eid} could not join the run: {getattr(exc, 'ename', type(exc).__name__)}: "
                    f"{getattr(exc, 'evalue', exc)}",
                    warn=True,
                )
                continue
            if item["stage"] == "warming":
                self._join(eid, item)
            else:
                del self.joining[eid]
                started.append(self._run_cell(eid, item))
        return started

    # -- stages ------------------------------------------------------------------------
    def _look_for_engines(self) -> None:
        cluster, strategy = self.cluster, self.strategy
        known = {e.engine_id for e in cluster.engines} | set(self.joining) | self.refused
        new = sorted(set(cluster.client.ids) - known)
        room = self.max_np - len(strategy.rendezvous.plan.slots) - len(self.joining)
        for eid in new:
            if room <= 0:
                self.refused.add(eid)
                continue
            room -= 1
            self._warm(eid)

    def _warm(self, eid: int) -> None:
        from ...rank import lifecycle
        from ..engines.execute import FEED_INTERVAL
        from ..engines.prepare import prepare_remote
        from .on_engine import warm_imports

        ctx, client = self.ctx, self.cluster.client[eid]
        pid, host, machine = client.apply_sync(_identify)
        label = self.strategy.next_label()
        threads = ctx.options.threads_per_rank
        cwd = None if self.cluster.attached else os.getcwd()
        local_size = 1 + sum(1 for e in self.cluster.engines if e.hostname == host)
        client.apply_sync(prepare_remote, {}, threads, local_size, cwd, None)
        if self.run.pushed:  # what --push gave the others
            client.push(self.run.pushed, block=True)
        spec = ctx.spec
        client.apply_sync(
            lifecycle.begin,
            label,
            spec.telemetry,
            FEED_INTERVAL,
            spec.checkpoint,
            ctx.options.freeze_gc,
            ctx.options.tf_info_logs,
            ctx.options.helper_nice,
        )
        ctx.record.set_rank(label, state="starting", host=host, pid=pid)
        say(f"engine {eid} on {host} registered: rank {label} joins the run at its next commit")
        self.joining[eid] = {
            "stage": "warming",
            "label": label,
            "info": EngineInfo(eid, pid, host, machine),
            "ar": client.apply_async(warm_imports),
        }

    def _join(self, eid: int, item: dict[str, Any]) -> None:
        from .on_engine import HOSTS_ADDED, elastic_env, hvd_join

        rdv = self.strategy.rendezvous
        info = item["info"]
        index, key, _ = rdv.grow(info.hostname)
        self.strategy.labels[index] = item["label"]
        self.strategy.engine_of[index] = info
        iface = None
        if not self.cluster.loopback:  # the engine names its own interface towards the kernel
            from ...cluster.network import route_iface

            iface = self.cluster.client[eid].apply_sync(route_iface, rdv.address)
        env = elastic_env(rdv.common_env(info.hostname, iface))
        abort = (rdv.address, rdv.abort_line.port)
        item.update(
            stage="joining",
            index=index,
            key=key,
            ar=self.cluster.client[eid].apply_async(
                hvd_join, env, (rdv.address, rdv.port), key, abort, self.keras_names
            ),
        )
        rdv.abort_line.tell(HOSTS_ADDED)

    def _run_cell(self, eid: int, item: dict[str, Any]) -> tuple[int, EngineInfo, Any]:
        ar = self.cluster.client[eid].execute(self.run.cell, silent=False, block=False)
        size = len(self.strategy.rendezvous.plan.slots)
        self.ctx.record.note_resize([], size, added=[item["label"]])
        return item["label"], item["info"], children(ar)[0]

    def _let_go(self) -> None:
        plan = self.strategy.rendezvous.plan
        for item in self.joining.values():
            if item["stage"] == "joining":
                plan.withdraw(item["key"])
        for item in self.joining.values():
            try:
                item["ar"].wait(timeout=30)
            except Exception:
                pass
            self.ctx.record.set_rank(item["label"], state="stopped", error="registered too late to join the run")
        self.joining.clear()
