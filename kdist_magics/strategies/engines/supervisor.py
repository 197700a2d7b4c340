"""Watching one engine run: :class:`RunSupervisor`, made per run by
:class:`~kdist_magics.strategies.engines.strategy.EngineStrategy`.

While the cell runs on every engine, the supervisor

* **listens** to each rank's IOPub messages (:meth:`RunSupervisor.listen`, on the client's IO
  thread) and queues them in its inbox, so the kernel's main thread does all writing (stdout,
  record) and the dashboard's listeners run where widgets expect them;
* **prints** the ranks' output (:class:`~.printer.Printer`: rank 0's, every rank's prefixed, or none);
* **takes in telemetry** (:meth:`RunSupervisor.feed`): numbered batches into the RunRecord, each
  once, gaps counted (:attr:`RunSupervisor.lost_batches`);
* **supervises** (:meth:`RunSupervisor.watch`): a rank raising, an engine process dying, the
  timeout, an interrupt (the Stop button); then **stops** the ranks still running
  (:meth:`RunSupervisor.stop`: the library's abort, SIGINT once a rank has begun, SIGKILL after
  the grace period) and says whether the engines need a restart (:attr:`needs_restart`).

The loop sleeps on its inbox: output, telemetry and "a rank finished" wake it at once;
otherwise it wakes for the next death check.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from typing import Any, Callable

from ...cluster.compat_ipyparallel import children as list_children
from ...rank.feed import FEED_MIME, FeedIntake
from ...errors import ControllerDied, Interrupted, RankDied, RankFailed, RunTimedOut
from ...messages import interrupted, say
from .printer import Printer
from .waiting import DEATH_SHOWS_WITHIN, engine_died

POLL = 0.05  # seconds between looks while stopping ranks (SIGINT sent, waiting for them)
DEATH_CHECK = 0.25  # seconds between looks at the engines' processes (cheap, but not free)
VANISHED_GRACE = DEATH_SHOWS_WITHIN  # seconds an "engine died" reply waits for the death check to confirm it


class RunSupervisor:
    """Everything that watches one run (see the module doc); made per run, then dropped.

    ``record``: the run's RunRecord; ``out``: whose output is printed (``rank0|all|none``);
    ``abort_collectives(ranks)``: the strategy's way to make ranks blocked in the library's
    collectives return (called first when stopping). ``on_lost({rank: how})``: an elastic
    strategy's way to go on without dead ranks; it returns ``{rank: new rank}`` for the ranks
    left, or None when the run cannot go on (then a death stops the run, as without it).
    ``on_grow(final)``: engines joining the run now, ``[(rank, EngineInfo, cell future)]``,
    supervised from then on like the others (``final``: the run is over, let joiners go).
    """

    def __init__(
        self,
        record,
        out: str = "rank0",
        abort_collectives: Callable[[list[int]], None] = lambda ranks: None,
        on_lost: Callable[[dict[int, str]], dict[int, int] | None] | None = None,
        on_grow: Callable[[bool], list] | None = None,
    ):
        self.record = record
        self.on_lost = on_lost
        self.on_grow = on_grow
        self.lost: dict[int, str] = {}  # ranks an elastic run went on without: how they ended
        self.vanishing: dict[int, tuple[float, Any]] = {}  # "engine died" replies not yet seen dead
        self.late_failures: dict[int, Any] = {}  # ... that the death check never confirmed
        self.printer = Printer(out)
        self.abort_collectives = abort_collectives
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.started: set[int] = set()  # ranks whose engine has begun the cell (may be interrupted)
        self.intake = FeedIntake(record)
        self.needs_restart: str | None = None  # set when stopping had to kill, or a rank died

    # -- intake ------------------------------------------------------------------
    def listen(self, fut, rank: int) -> None:
        """Forward the engine's IOPub messages for ``fut`` to the inbox (from the client's IO thread)."""
        md = fut.output.metadata
        started, inbox = self.started, self.inbox
        lock = threading.Lock()
        catch_up: dict[int, Any] | None = {}  # displays forwarded while catching up, by id

        def forward(kind, content):
            with lock:  # the IO thread and the catch-up below may both see a display
                if kind == "display_data" and catch_up is not None:
                    if id(content) in catch_up:
                        return
                    catch_up[id(content)] = content  # kept alive, so its id stays its own
                inbox.put((rank, kind, content))

        def callback(msg):
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "execute_input":
                started.add(rank)
            if kind == "display_data" and FEED_MIME in content.get("data", {}):
                # the client keeps every display output of a request; telemetry batches
                # are delivered here, so do not let a long run pile them up there
                outputs = md.get("outputs") or []
                if outputs and outputs[-1] is content:
                    outputs.pop()
            forward(kind, content)

        fut.iopub_callbacks.append(callback)
        if md.get("execute_input") is not None:  # it began before we listened
            started.add(rank)
        # displays that arrived before the callback was there (the first telemetry batch
        # is published as the cell starts, often before execute() has returned here)
        for content in list(md.get("outputs") or []):
            forward("display_data", content)
        with lock:
            catch_up = None
        for name in ("stdout", "stderr"):  # anything that arrived before we listened
            if md.get(name):
                inbox.put((rank, "stream", {"name": name, "text": md[name]}))
        if md.get("execute_result"):  # a quick cell's value may have come already, too
            inbox.put((rank, "execute_result", md["execute_result"]))

    def drain(self, wait: float = 0.0) -> dict | None:
        """Handle everything in the inbox; with ``wait``, first sleep up to that long for a
        message. Returns rank 0's ``execute_result`` when one came."""
        result = None
        printer = self.printer
        while True:
            try:
                if wait > 0:
                    rank, kind, content = self.inbox.get(timeout=wait)
                    wait = 0.0
                else:
                    rank, kind, content = self.inbox.get_nowait()
            except queue.Empty:
                return result
            if kind == "stream":
                printer.write(rank, content.get("name", "stdout"), content.get("text", ""))
            elif kind == "display_data":
                if FEED_MIME in content.get("data", {}):
                    self.feed(rank, content)
                elif printer.mode == "all" or (printer.mode == "rank0" and rank == 0):
                    from IPython.display import publish_display_data

                    publish_display_data(content.get("data", {}), content.get("metadata") or {})
            elif kind == "execute_result" and rank == printer.lead:
                result = content

    def drain_outputs(self, ar, ranks: list[int]) -> None:
        """Feed rows published during an apply (``engine.end``'s final flush) into the record."""
        for rank, fut in zip(ranks, list_children(ar)):
            for content in fut.output.metadata.get("outputs", []):
                self.feed(rank, content)

    def feed(self, rank: int, content: dict) -> None:
        """One telemetry batch into the record, unless it was delivered already."""
        self.intake.take(rank, content)

    @property
    def lost_batches(self) -> int:
        """Telemetry batches that never arrived (gaps in the ranks' numbering)."""
        return self.intake.lost

    # -- supervision ---------------------------------------------------------------
    def watch(self, cluster, ranks: list[int], ar, timeout: float | None, grace: float):
        """Until every rank has finished: print, take in telemetry, mark ranks done or failed.

        A dead engine raises :class:`RankDied` (survivors killed: their collectives can never
        complete), a raising rank :class:`RankFailed` (the others stopped after a moment, so
        their own errors are seen too), the timeout :class:`RunTimedOut`, an interrupt
        :class:`~kdist_magics.errors.Interrupted` (a ``KeyboardInterrupt``, one line); each after stopping the ranks still running. Returns rank 0's
        ``execute_result`` content (or None).
        """
        children = list_children(ar)
        try:
            result_content, failures = self._loop(cluster, ranks, children, timeout, grace)
        except KeyboardInterrupt:
            say("\ninterrupted; stopping every rank...")
            stopped = self.stop(cluster, ranks, children, grace)
            self.drain()
            raise Interrupted(interrupted(stopped or ranks)) from None  # one line, no frames
        self._trailing_output(ar, ranks, children)
        result_content = self.drain() or result_content
        if failures:
            raise RankFailed(failures, [])
        return result_content

    def _loop(
        self, cluster, ranks: list[int], children: list, timeout: float | None, grace: float
    ) -> tuple[Any, dict[int, Any]]:
        """The supervision loop and its wake-up times, until every rank is done: (rank 0's
        result content, the ranks that raised). Each way out but the last raises."""
        started = time.monotonic()
        next_death_check = started
        failures: dict[int, Any] = {}
        first_failure = None
        result_content = None
        wait = 0.0
        while True:
            result_content = self.drain(wait) or result_content
            if self._settle(ranks, children, failures):
                first_failure = first_failure or time.monotonic()
            now = time.monotonic()
            gone = self._vanished(now)  # ipyparallel says an engine died: look now
            if not gone and all(f.done() for r, f in zip(ranks, children) if r not in self.lost):
                if self.on_grow is not None:
                    self.on_grow(True)
                return result_content, failures
            if now >= next_death_check and self.on_grow is not None:
                for rank, info, fut in self.on_grow(False):
                    self.take(cluster, ranks, children, rank, info, fut)
            if now >= next_death_check or gone:
                next_death_check = self._check_deaths(cluster, ranks, children, grace)
            if first_failure and now - first_failure > min(1.0, grace):
                stopped = self.stop(cluster, ranks, children, grace)
                self.drain()
                raise RankFailed(failures, stopped)
            if timeout and now - started > timeout:
                busy = [r for r, f in zip(ranks, children) if not f.done()]
                self.stop(cluster, ranks, children, grace)
                self.drain()
                raise RunTimedOut(timeout, busy)
            wake = [next_death_check]
            if first_failure:
                wake.append(first_failure + min(1.0, grace))
            if timeout:
                wake.append(started + timeout)
            wait = min(max(0.0, min(wake) - time.monotonic()), DEATH_CHECK)

    def _check_deaths(self, cluster, ranks: list[int], children: list, grace: float) -> float:
        """Raise :class:`ControllerDied` or :class:`RankDied` (after stopping the ranks) where
        the controller or an engine the run cannot go on without died; when to look next."""
        record = self.record
        controller = cluster.controller_gone()
        if controller:  # nothing can reach or report from the ranks any more
            for rank in ranks:
                record.set_rank(rank, state="failed", error=f"the controller {controller}")
            self.stop(cluster, ranks, children, grace, hard=True)
            self.needs_restart = "the controller died in the previous run"
            raise ControllerDied(controller, owned=cluster.owned)
        deaths = cluster.dead()
        next_death_check = time.monotonic() + DEATH_CHECK
        by_engine = {e.engine_id: r for e, r in zip(cluster.engines, ranks)}
        deaths_by_rank = {by_engine[eid]: how for eid, how in deaths.items() if by_engine[eid] not in self.lost}
        if deaths_by_rank and self._go_on(deaths_by_rank):
            deaths_by_rank = {}
        if deaths_by_rank:
            for rank, how in deaths_by_rank.items():
                record.set_rank(rank, state="failed", error=f"process {how}")
            self.drain()
            self.stop(cluster, ranks, children, grace, hard=True)
            raise RankDied(deaths_by_rank, owned=cluster.owned)
        return next_death_check

    def _trailing_output(self, ar, ranks: list[int], children: list) -> None:
        """Every rank is done: wait for the trailing output (IOPub idle)."""
        try:
            if not self.lost and len(children) == len(list_children(ar)):
                ar.wait_for_output(timeout=10)
            else:  # a lost rank's output never ends; a joined rank's request is its own
                for rank, fut in zip(ranks, children):
                    if rank not in self.lost:
                        fut.output.result(timeout=10)
        except Exception:
            pass

    def take(self, cluster, ranks: list[int], children: list, rank: int, info, fut) -> None:
        """Supervise one more rank from now on (an engine that joined an elastic run): its
        engine, rank and request are appended together, so they stay aligned."""
        cluster.engines.append(info)
        ranks.append(rank)
        children.append(fut)
        self.listen(fut, rank)
        fut.add_done_callback(lambda _f, _r=rank: self.inbox.put((_r, "finished", None)))
        self.record.set_rank(rank, state="running", host=info.hostname, pid=info.pid)

    def _vanished(self, now: float) -> bool:
        """True while a rank's request ended with "engine died" and the death check has not
        yet seen the process gone; after ``VANISHED_GRACE`` s it counts as that rank's error."""
        waiting = False
        for rank, (since, exc) in list(self.vanishing.items()):
            if rank in self.lost or self.record.ranks[rank].state == "failed":
                del self.vanishing[rank]
            elif now - since > VANISHED_GRACE:
                del self.vanishing[rank]
                self.late_failures[rank] = exc
            else:
                waiting = True
        return waiting

    def _go_on(self, deaths: dict[int, str]) -> bool:
        """An elastic run re-forms without ranks that died; True when it goes on."""
        if self.on_lost is None:
            return False
        renumbered = self.on_lost(deaths)
        if renumbered is None:
            return False
        from ...messages import went_on_without

        before = self.record.world_size
        self.lost.update(deaths)
        self.printer.lead = min(renumbered, key=renumbered.get)
        self.record.note_resize(
            sorted(deaths), len(renumbered), error="; ".join(f"process {how}" for how in deaths.values())
        )
        self.drain()
        say(went_on_without(deaths, len(renumbered), before))
        return True

    def _settle(self, ranks, children, failures: dict[int, Any]) -> bool:
        """Mark ranks whose request finished done or failed; True when one newly failed."""
        record, failed = self.record, False
        for rank, fut in zip(ranks, children):
            if (
                not fut.done()
                or rank in self.lost
                or rank in failures
                or record.ranks[rank].state in ("done", "failed")
            ):
                continue
            exc = fut.exception()
            if exc is None:  # ipyparallel resolves a failed request with its error
                reply = fut.result()
                exc = reply if isinstance(reply, BaseException) else None
            if exc is not None and engine_died(exc):
                # the engine died: the death check names how (and an elastic run goes on)
                if rank not in self.late_failures:
                    self.vanishing.setdefault(rank, (time.monotonic(), exc))
                    continue
            if exc is None:
                record.set_rank(rank, state="done")
            else:
                failures[rank] = exc
                record.set_rank(
                    rank,
                    state="failed",
                    error=f"{getattr(exc, 'ename', type(exc).__name__)}: {getattr(exc, 'evalue', exc)}",
                )
                failed = True
        return failed

    def stop(self, cluster, ranks, children, grace: float, hard: bool = False) -> list[int]:
        """Stop ranks still running: SIGINT, then (after ``grace`` s) SIGKILL and mark for restart.

        Returns the ranks that had to be stopped. With ``hard`` (a rank died, so the
        survivors' collectives can never complete), kill at once.
        """
        busy = [(r, e, f) for r, e, f in zip(ranks, cluster.engines, children) if not f.done() and r not in self.lost]
        if not busy:
            return []
        if not hard:
            try:
                self.abort_collectives([r for r, _, _ in busy])
            except Exception:
                pass
            # SIGINT only reaches a cell that is running: one that lands while the engine
            # is still receiving the request is dropped, or breaks the request so that no
            # reply ever comes. So each rank is interrupted once it has begun the cell
            # (its execute_input was seen), at once or as soon as it begins.
            signalled: set[int] = set()
            deadline = time.monotonic() + grace
            while True:
                ready = [(r, e) for r, e, f in busy if not f.done() and r not in signalled and r in self.started]
                if ready:
                    cluster.signal(signal.SIGINT, [e.engine_id for _, e in ready])
                    signalled |= {r for r, _ in ready}
                if time.monotonic() >= deadline or all(f.done() for _, _, f in busy):
                    break
                time.sleep(POLL)
        stuck = [(r, e) for r, e, f in busy if not f.done()]
        if stuck or hard:
            if cluster.owned:
                cluster.kill([e.engine_id for _, e in stuck])
            self.needs_restart = "stopped ranks did not answer" if not hard else "a rank died in the previous run"
        for r, _, _ in busy:
            if self.record.ranks[r].state not in ("failed",):
                self.record.set_rank(r, state="stopped")
        return [r for r, _, _ in busy]
