"""Running a cell on every ipyparallel engine, one engine per rank.

:class:`EngineStrategy` does everything that does not depend on the
distribution library: keeps a warm :class:`~kdist_magics.cluster.EngineCluster`
(restarted when N changes or an engine died), checks the cell's syntax once in
the kernel, sets thread variables, ``--push``, runs the cell with live output
(rank 0's, every rank's prefixed ``[rank N]``, or none), moves telemetry rows
into the RunRecord while the cell runs, supervises (a rank raising, a rank
dying, ``--timeout``, the Stop button), ``--pull`` and the last expression's
value from rank 0.

Hooks for subclasses (Horovod here; MultiWorkerMirroredStrategy later, with
``TF_CONFIG`` per engine):

``ranks(cluster, ctx) -> list[int]``
    rank of each engine, in ``cluster.engines`` order (default: engine order).
``engine_env(cluster, ctx) -> list[dict]``
    extra environment variables per engine, set with the thread variables
    before the cell (and before TF is first imported on a fresh engine).
``before_cell(cluster, ctx, ranks)``
    set up the distribution library on the engines (rendezvous, init, binding
    names such as ``hvd`` or ``strategy``); raise to abort the run.
``after_cell(cluster, ctx, ok)``
    undo ``before_cell`` (always called; ``ok`` False after a failure, when
    some engines may be gone).
``abort_collectives(cluster, ranks)``
    when a run is being stopped (a rank raised, timeout, interrupt): make ranks
    blocked inside collectives return, so they need not be killed.
``bound_names`` (class attribute)
    names the strategy binds in the engine namespace (documentation/status).

State a subclass may use: ``self.cluster`` (the warm EngineCluster, or None),
``self.needs_restart`` (set it to a reason and the next run restarts the
engines first), ``_cluster(ctx)`` (may be extended to re-plan a cluster).

While the cell runs, the kernel polls every 50 ms: a rank's error, a dead
engine process, the timeout; the kernel's main thread does all writing
(stdout, record), so the dashboard's listeners run where widgets expect them.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import sys
import threading
import time
from typing import Any

from ..cluster import EngineCluster
from ..engine import FEED_MIME
from ..errors import CellFailed, KDistError, RankDied, RankFailed, RunTimedOut
from .base import RunContext, Strategy

POLL = 0.05  # seconds between looks while stopping ranks (SIGINT sent, waiting for them)
DEATH_CHECK = 0.25  # seconds between looks at the engines' processes (cheap, but not free)
FEED_INTERVAL = 0.5  # seconds between a rank's telemetry batches (the dashboard redraws at 2/s)
# While a cell runs the supervision loop sleeps on its inbox: output, telemetry and
# "a rank finished" wake it at once; otherwise it wakes for the next death check.


def default_np() -> int:
    """One rank per GPU when NVML sees GPUs, else 2."""
    try:
        import pynvml  # type: ignore

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
        if count:
            return int(count)
    except Exception:
        pass
    return 2


class _Printer:
    """Writes engine output in the kernel: rank 0 only, all ranks prefixed, or nothing.

    With ``all``, output is written a whole line at a time (a line ends at ``\n``
    or at a progress bar's ``\r``), each prefixed ``[rank N]``, so ranks never
    interleave inside a line; :meth:`flush` writes what is left at the end. A progress
    bar's redraw (text after a ``\r``) is shown at once, not held until the next redraw:
    the next one starts with ``\r`` and overwrites it anyway.
    """

    def __init__(self, mode: str):
        self.mode = mode
        self.pending: dict[tuple[int, str], str] = {}

    def write(self, rank: int, name: str, text: str) -> None:
        if self.mode == "none" or (self.mode == "rank0" and rank != 0):
            return
        if self.mode == "all":
            text = self._lines(rank, name, text)
        if text:
            stream = sys.stderr if name == "stderr" else sys.stdout
            stream.write(text)
            stream.flush()

    def _lines(self, rank: int, name: str, text: str, final: bool = False) -> str:
        buf = self.pending.pop((rank, name), "") + text
        pieces = re.split(r"(?<=[\r\n])", buf)
        rest = "" if final else pieces.pop()
        if rest and pieces and pieces[-1].endswith("\r"):  # a progress bar's redraw: show it now
            pieces.append(rest)
            rest = ""
        if rest:
            self.pending[(rank, name)] = rest
        tag = f"[rank {rank}] "
        return "".join(p if p in ("\r", "\n") else tag + p for p in pieces if p)

    def flush(self) -> None:
        for rank, name in list(self.pending):
            text = self._lines(rank, name, "", final=True)
            stream = sys.stderr if name == "stderr" else sys.stdout
            stream.write(text + ("" if text.endswith(("\n", "\r")) else "\n"))
            stream.flush()


class EngineStrategy(Strategy):
    """Base class of strategies whose cell runs on ipyparallel engines (see module doc)."""

    name = "engines"
    in_kernel = False
    bound_names: tuple[str, ...] = ()
    #: --pull and the cell's value run on every rank, not rank 0 alone (see _from_rank0)
    collective_values = False

    def __init__(self):
        self.cluster: EngineCluster | None = None
        self.needs_restart: str | None = None  # why the next run must restart the engines
        self.last_timing: dict[str, float] = {}
        self._feed_seen: dict[int, set[int]] = {}
        self._started: set[int] = set()  # ranks whose engine has begun the current cell

    # -- hooks ---------------------------------------------------------------
    def ranks(self, cluster: EngineCluster, ctx: RunContext) -> list[int]:
        return list(range(len(cluster.engines)))

    def engine_env(self, cluster: EngineCluster, ctx: RunContext) -> list[dict[str, str]]:
        return [{} for _ in cluster.engines]

    def before_cell(self, cluster: EngineCluster, ctx: RunContext, ranks: list[int]) -> None:
        pass

    def after_cell(self, cluster: EngineCluster, ctx: RunContext, ok: bool) -> None:
        pass

    def abort_collectives(self, cluster: EngineCluster, ranks: list[int]) -> None:
        """Make ranks blocked in the library's collectives return (called when stopping a run).

        Signals cannot reach a rank waiting inside a C++ collective; a library that can end
        its collectives from outside (Horovod: a coordinated shutdown) does it here so the
        engines stay warm. Default: nothing (stuck ranks are killed after ``stop_grace``).
        """

    # -- for subclasses whose set-up runs on every engine at once ----------------
    def _setup_results(self, ars, ranks: list[int], what: str, reach: str, timeout: float,
                       failed: str) -> dict[int, Any]:
        """Wait for a set-up call made on every engine at once (the ranks wait for each
        other); ``{rank: result}``. One that does not finish, or any that raise, mark the
        engines for a restart and raise :class:`KDistError` naming the ranks. ``what`` is
        what starts ("jax.distributed"), ``reach`` the addresses every engine must reach,
        ``failed`` the words before the per-rank errors."""
        for ar in ars:
            ar.wait(timeout=timeout)
        results: dict[int, Any] = {}
        failures = []
        for ar, rank in zip(ars, ranks):
            if not ar.ready():
                self.needs_restart = f"{what} did not start"
                raise KDistError(f"{what} did not start on rank {rank} within {timeout:g} s: "
                                 f"can every engine reach {reach}?")
            try:
                results[rank] = ar.get()
            except Exception as exc:
                failures.append(f"rank {rank}: {getattr(exc, 'ename', type(exc).__name__)}: "
                                f"{getattr(exc, 'evalue', exc)}")
        if failures:
            self.needs_restart = f"{what} failed to start"
            raise KDistError(f"{failed}: " + "; ".join(failures))
        return results

    def _end_collective_cell(self, cluster: EngineCluster, ctx: RunContext, ok: bool, what: str,
                             leave, committed: bool = True) -> None:
        """``after_cell`` of a strategy whose ranks share collectives (``what``): after a failed
        run in which some rank neither finished nor raised (stopped, interrupted, timed out)
        they may be out of step, so an owned cluster restarts before the next run and an
        attached one (never restarted by kdist) gets a warning; otherwise ``leave`` runs on
        every engine to undo the cell's set-up. ``committed``: the engines hold the set-up."""
        if not ok and committed and self.needs_restart is None:
            states = {r.state for r in ctx.record.ranks.values()}
            if states - {"failed", "done"}:
                if cluster.owned:
                    self.needs_restart = "the previous run stopped mid-way"
                else:
                    print(f"kdist: the run stopped mid-way; {what} may be out of step on these "
                          f"engines. If the next cell hangs, restart the cluster's engines (kdist "
                          f"does not restart a cluster it did not start).", file=sys.stderr)
        if cluster.running and self.needs_restart is None:
            try:
                cluster.view().apply_async(leave).wait(timeout=10)
            except Exception:
                pass

    # -- Strategy API --------------------------------------------------------
    def size(self, spec) -> int:
        return spec.np or default_np()

    def status(self) -> dict[str, Any]:
        facts = self.cluster.status() if self.cluster is not None else {"engines": "not started"}
        if self.needs_restart:
            facts["restart"] = self.needs_restart
        return facts

    def teardown(self) -> None:
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            cluster.stop()

    # -- the run ---------------------------------------------------------------
    def run(self, cell: str, ctx: RunContext) -> Any:
        spec, record = ctx.spec, ctx.record
        self._check_syntax(cell, ctx)
        pushed = self._pushable(ctx) if spec.push else {}
        t0 = time.monotonic()
        cluster = self._cluster(ctx)
        t_cluster = time.monotonic()
        ranks = self.ranks(cluster, ctx)
        by_rank = dict(zip(ranks, cluster.engines))
        for rank, eng in by_rank.items():
            record.set_rank(rank, state="starting", host=eng.hostname, pid=eng.pid)
        self._prepare(cluster, ctx)
        if pushed:
            cluster.view().push(pushed, block=True)
        ok = False
        try:
            self.before_cell(cluster, ctx, ranks)
            t_ready = time.monotonic()
            self.last_timing = {"cluster_s": t_cluster - t0, "setup_s": t_ready - t_cluster}
            value_ar = self._execute(cell, cluster, ctx, ranks)
            ok = True
        finally:
            self._finish_engines(cluster, ctx, ranks, ok)
        value = self._pull(cluster, ctx, by_rank, value_ar)
        return value

    # -- steps -----------------------------------------------------------------
    def _check_syntax(self, cell: str, ctx: RunContext) -> None:
        """Compile once in the kernel: a syntax error is shown once and no engine runs."""
        shell = ctx.shell
        try:
            source = shell.transform_cell(cell) if shell is not None else cell
            compile(source, "<kdist cell>", "exec")
        except (SyntaxError, ValueError) as exc:
            if shell is not None:
                shell.showsyntaxerror()
            raise CellFailed(exc) from exc

    def _cluster(self, ctx: RunContext) -> EngineCluster:
        spec, config = ctx.spec, ctx.config
        n = self.size(spec)
        key = (n, spec.cluster_id, spec.profile)
        cluster = self.cluster
        if cluster is not None and cluster.running:
            current = (cluster.n, cluster.cluster_id if cluster.attached else None, cluster.profile)
            if current != key:
                print(f"kdist: {n} ranks requested; restarting the engines "
                      f"(had {cluster.n})", file=sys.stderr)
                self.teardown()
                cluster = None
            elif self.needs_restart or cluster.dead():
                why = self.needs_restart or "an engine died"
                print(f"kdist: restarting the engines ({why})", file=sys.stderr)
                if cluster.owned:
                    cluster.restart()
                else:
                    cluster.stop()
                    cluster.start()
        if cluster is None or not cluster.running:
            address = getattr(config, "bind_address", "127.0.0.1") if spec.attach else "127.0.0.1"
            cluster = EngineCluster(n, cluster_id=spec.cluster_id, profile=spec.profile, ip=address)
            if not spec.attach:
                print(f"kdist: starting {n} engines on this machine (loopback only)...", file=sys.stderr)
            self.cluster = cluster
            cluster.start()
        self.needs_restart = None
        return cluster

    def _prepare(self, cluster: EngineCluster, ctx: RunContext) -> None:
        from .. import engine

        threads = getattr(ctx.config, "threads_per_rank", None)
        extra = self.engine_env(cluster, ctx)
        hosts = [e.hostname for e in cluster.engines]
        ars = []
        for eng, env in zip(cluster.engines, extra):
            local_size = hosts.count(eng.hostname)
            cwd = os.getcwd() if cluster.owned else None
            ars.append(cluster.client[eng.engine_id].apply_async(
                _prepare_remote, dict(env), threads, local_size, cwd))
        for ar in ars:
            ar.get(timeout=60)

    def _pushable(self, ctx: RunContext) -> dict[str, Any]:
        """The ``--push`` values, checked before anything starts: defined, and able to travel."""
        from ipyparallel.serialize import serialize_object

        ns = ctx.shell.user_ns
        missing = [n for n in ctx.spec.push if n not in ns]
        if missing:
            raise KDistError(f"--push: {', '.join(missing)} not defined in the notebook")
        values = {}
        for name in ctx.spec.push:
            try:
                serialize_object(ns[name])  # what ipyparallel will do (functions included)
            except Exception as exc:
                raise KDistError(f"--push: {name} ({type(ns[name]).__name__}) cannot travel to the "
                                 f"engines: {type(exc).__name__}: {exc}") from None
            values[name] = ns[name]
        return values

    def _finish_engines(self, cluster, ctx, ranks, ok) -> None:
        """Undo per-run engine state; after a failure, only on engines that still answer."""
        from .. import engine

        printer, self._printer = getattr(self, "_printer", None), None
        if printer is not None:
            printer.flush()
        if self.needs_restart is None and cluster.running:
            try:
                ar = cluster.view().apply_async(engine.end, True)
                ar.wait(timeout=10)
                if ar.ready():
                    ar.wait_for_output(timeout=5)  # the final batch is published before idle
                    self._drain_outputs(ar, ctx, ranks)
            except Exception:
                pass
        if self.lost_batches:
            ctx.record.note_lost_batches(self.lost_batches)
        try:
            self.after_cell(cluster, ctx, ok and self.needs_restart is None)
        except Exception:
            if ok:
                raise

    # -- execute and supervise -------------------------------------------------
    def _execute(self, cell: str, cluster: EngineCluster, ctx: RunContext, ranks: list[int]):
        from .. import engine

        spec, record = ctx.spec, ctx.record
        view = cluster.view()
        freeze_gc = bool(getattr(ctx.config, "freeze_gc", True))
        tf_info = bool(getattr(ctx.config, "tf_info_logs", False))
        begun = [cluster.client[e.engine_id].apply_async(engine.begin, rank, spec.telemetry, FEED_INTERVAL,
                                                         spec.checkpoint, freeze_gc, tf_info)
                 for e, rank in zip(cluster.engines, ranks)]
        for b in begun:
            b.get(timeout=60)
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._started = set()
        printer = self._printer = _Printer(spec.out)
        self._feed_seen: dict[int, set[int]] = {}
        ar = view.execute(cell, silent=False, block=False)
        children = list(ar._children)
        for rank, fut in zip(ranks, children):
            self._listen(fut, rank, inbox)
            fut.add_done_callback(lambda _f, _r=rank: inbox.put((_r, "finished", None)))
        for rank in ranks:
            record.set_rank(rank, state="running")
        timeout = spec.timeout if spec.timeout is not None else getattr(ctx.config, "timeout", None)
        grace = float(getattr(ctx.config, "stop_grace", 5.0) or 5.0)
        started = time.monotonic()
        next_death_check = started
        failures: dict[int, Any] = {}
        first_failure = None
        result_content = None
        wait = 0.0
        try:
            while True:
                result_content = self._drain(inbox, printer, record, wait) or result_content
                done = True
                for rank, fut in zip(ranks, children):
                    if not fut.done():
                        done = False
                        continue
                    if rank in failures or record.ranks[rank].state in ("done", "failed"):
                        continue
                    exc = fut.exception()
                    if exc is None:  # ipyparallel resolves a failed request with its error
                        reply = fut.result()
                        exc = reply if isinstance(reply, BaseException) else None
                    if exc is None:
                        record.set_rank(rank, state="done")
                    else:
                        failures[rank] = exc
                        record.set_rank(rank, state="failed",
                                        error=f"{getattr(exc, 'ename', type(exc).__name__)}: "
                                              f"{getattr(exc, 'evalue', exc)}")
                        first_failure = first_failure or time.monotonic()
                if done:
                    break
                deaths = {}
                if time.monotonic() >= next_death_check:
                    deaths = cluster.dead()
                    next_death_check = time.monotonic() + DEATH_CHECK
                if deaths:
                    by_engine = {e.engine_id: r for e, r in zip(cluster.engines, ranks)}
                    deaths_by_rank = {by_engine[eid]: how for eid, how in deaths.items()}
                    for rank, how in deaths_by_rank.items():
                        record.set_rank(rank, state="failed", error=f"process {how}")
                    self._drain(inbox, printer, record)
                    self._stop(cluster, ranks, children, record, grace, hard=True)
                    raise RankDied(deaths_by_rank)
                if first_failure and time.monotonic() - first_failure > min(1.0, grace):
                    stopped = self._stop(cluster, ranks, children, record, grace)
                    self._drain(inbox, printer, record)
                    raise RankFailed(failures, stopped)
                if timeout and time.monotonic() - started > timeout:
                    busy = [r for r, f in zip(ranks, children) if not f.done()]
                    self._stop(cluster, ranks, children, record, grace)
                    self._drain(inbox, printer, record)
                    raise RunTimedOut(timeout, busy)
                now = time.monotonic()
                wake = [next_death_check]
                if first_failure:
                    wake.append(first_failure + min(1.0, grace))
                if timeout:
                    wake.append(started + timeout)
                wait = min(max(0.0, min(wake) - now), DEATH_CHECK)
        except KeyboardInterrupt:
            print("\nkdist: interrupted; stopping every rank...", file=sys.stderr)
            self._stop(cluster, ranks, children, record, grace)
            self._drain(inbox, printer, record)
            raise
        # every rank is done: wait for the trailing output (IOPub idle) and drain it
        try:
            ar.wait_for_output(timeout=10)
        except Exception:
            pass
        result_content = self._drain(inbox, printer, record) or result_content
        if failures:
            raise RankFailed(failures, [])
        return result_content

    def _listen(self, fut, rank: int, inbox: queue.SimpleQueue) -> None:
        """Forward the engine's IOPub messages for ``fut`` to ``inbox`` (from the client's IO thread)."""
        md = fut.output.metadata
        started = self._started
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

    def _drain_outputs(self, ar, ctx: RunContext, ranks: list[int]) -> None:
        """Feed rows published during an apply (``engine.end``'s final flush) into the record."""
        for rank, fut in zip(ranks, ar._children):
            for content in fut.output.metadata.get("outputs", []):
                self._feed(rank, content, ctx.record)

    def _drain(self, inbox: queue.SimpleQueue, printer: _Printer, record,
               wait: float = 0.0) -> dict | None:
        """Handle everything in ``inbox``; with ``wait``, first sleep up to that long for a message."""
        result = None
        while True:
            try:
                if wait > 0:
                    rank, kind, content = inbox.get(timeout=wait)
                    wait = 0.0
                else:
                    rank, kind, content = inbox.get_nowait()
            except queue.Empty:
                return result
            if kind == "stream":
                printer.write(rank, content.get("name", "stdout"), content.get("text", ""))
            elif kind == "display_data":
                if FEED_MIME in content.get("data", {}):
                    self._feed(rank, content, record)
                elif printer.mode == "all" or (printer.mode == "rank0" and rank == 0):
                    from IPython.display import publish_display_data

                    publish_display_data(content.get("data", {}), content.get("metadata") or {})
            elif kind == "execute_result" and rank == 0:
                result = content

    @property
    def lost_batches(self) -> int:
        """Telemetry batches of the last run that never arrived (gaps in the ranks' numbering)."""
        return sum(max(seen) - len(seen) for seen in self._feed_seen.values() if seen)

    def _feed(self, rank: int, content: dict, record) -> None:
        payload = content.get("data", {}).get(FEED_MIME)
        if not payload:
            return
        seq = payload.get("seq", 0)
        seen = self._feed_seen.setdefault(rank, set())
        if seq in seen:
            return  # already delivered (seen live and again in the final drain)
        seen.add(seq)
        for kind, row in payload.get("rows", []):
            try:
                record.add(kind, row)
            except ValueError:
                pass

    def _stop(self, cluster: EngineCluster, ranks, children, record, grace: float,
              hard: bool = False) -> list[int]:
        """Stop ranks still running: SIGINT, then (after ``grace`` s) SIGKILL and mark for restart.

        Returns the ranks that had to be stopped. With ``hard`` (a rank died, so the
        survivors' collectives can never complete), kill at once.
        """
        busy = [(r, e, f) for r, e, f in zip(ranks, cluster.engines, children) if not f.done()]
        if not busy:
            return []
        if not hard:
            try:
                self.abort_collectives(cluster, [r for r, _, _ in busy])
            except Exception:
                pass
            # SIGINT only reaches a cell that is running: one that lands while the engine
            # is still receiving the request is dropped, or breaks the request so that no
            # reply ever comes. So each rank is interrupted once it has begun the cell
            # (its execute_input was seen), at once or as soon as it begins.
            signalled: set[int] = set()
            deadline = time.monotonic() + grace
            while True:
                ready = [(r, e) for r, e, f in busy if not f.done() and r not in signalled
                         and r in self._started]
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
            self.needs_restart = ("stopped ranks did not answer" if not hard else
                                  "a rank died in the previous run")
        for r, _, _ in busy:
            if record.ranks[r].state not in ("failed",):
                record.set_rank(r, state="stopped")
        return [r for r, _, _ in busy]

    # -- results back ------------------------------------------------------------
    def _from_rank0(self, cluster: EngineCluster, by_rank, fn, *args) -> Any:
        """``fn(*args)`` on rank 0, its result. With :attr:`collective_values` every rank runs it
        too (results dropped): saving a model whose variables span the processes is a
        collective under JAX, which rank 0 alone would wait on forever."""
        if not self.collective_values:
            return cluster.client[by_rank[0].engine_id].apply_sync(fn, *args)
        ars = {rank: cluster.client[e.engine_id].apply_async(fn, *args) for rank, e in by_rank.items()}
        try:
            return ars[0].get()
        finally:
            for ar in ars.values():
                ar.wait(timeout=60)

    def _pull(self, cluster: EngineCluster, ctx: RunContext, by_rank, result_content) -> Any:
        from .. import engine
        from ipyparallel.error import RemoteError

        zero = cluster.client[by_rank[0].engine_id]
        if ctx.spec.pull:
            try:
                packed = self._from_rank0(cluster, by_rank, engine.fetch, list(ctx.spec.pull))
            except RemoteError as exc:
                raise KDistError(f"--pull: {exc.evalue.strip(chr(34)).strip(chr(39))}") from None
            for name, item in packed.items():
                ctx.shell.user_ns[name] = engine.unpack(item)
        if result_content is None:
            return None
        try:
            return engine.unpack(self._from_rank0(cluster, by_rank, engine.last_value,
                                                  result_content.get("execution_count")))
        except Exception:
            # not picklable: show rank 0's rendering of it instead
            from IPython.display import publish_display_data

            publish_display_data(result_content.get("data", {}), result_content.get("metadata") or {})
            return None


def _prepare_remote(env, threads, local_size, cwd=None):  # runs on an engine
    from kdist_magics import engine

    if not threads:
        threads = max(1, engine.cpu_count() // max(1, local_size))
    return engine.prepare(env, threads, cwd)
