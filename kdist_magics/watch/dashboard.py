"""The live dashboard: an anywidget view of a :class:`~kdist_magics.watch.record.RunRecord`.

:class:`Dashboard` subscribes to the record. Listeners run on whatever thread
adds a row (Keras' training thread, an engine transport thread, the sampler),
so :meth:`Dashboard._on_change` only updates small in-memory series and marks
the view dirty; a daemon thread (:meth:`Dashboard._loop`) pushes at most one
state update every ``interval`` seconds (default 0.5 s) to the front end. Comm
messages can be sent from a background thread in ipykernel 6/7, so the view
updates while an in-kernel cell keeps the kernel's main thread busy.

The widget (:class:`~.widget.DashboardWidget`) is an ``anywidget.AnyWidget`` whose
front end is one small static ES module (:mod:`.widget`).

The display also carries a ``text/html`` summary with inline SVG loss curves. When the run
ends, the same display (same display id) becomes the finished view of :mod:`.offline` and the
widget is closed, so a saved notebook, an HTML export, GitHub and nbviewer show the same
picture with nothing loaded from the web.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any

from . import stragglers
from ..messages import SPLIT_TIMED
from ..messages import CURVES_NOTE, NOT_RUN, TRAINED_NOTHING, lost_batches, resized_note, say, straggler
from .dashboard_rows import (
    add_sample,
    current_phase,
    fraction_eta,
    layout_note,
    rounded,
    slowest_progress,
    split_entry,
    split_legend,
    thinned,
)
from .widget import DashboardWidget
from .offline import finished_view
from .record import RunRecord
from .svg import PALETTE, static_summary, svg_curves  # noqa: F401  (the widget's colours too)
from ..spec import KERNEL_STRATEGIES

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

#: row fields that are not curves
NOT_CURVES = frozenset(
    {
        "rank",
        "epoch",
        "step",
        "batch",
        "fit",
        "time",
        "kind",
        "steps_per_s",
        "samples_per_s",
        "size",
        "num_steps",
        "step_time",
        "gap_time",
        "collective_time",
        "batch_size",
    }
)
#: at most this many distinct step-level series (loss first)
MAX_SERIES = 8


class Dashboard:
    """A live view of ``record``; ``display()`` shows it, the record's end finalises it.

    ``interval``: seconds between front-end updates (None: no thread; call
    :meth:`flush` yourself, as tests do). ``max_points``: points per curve and
    rank sent to the front end.
    """

    def __init__(
        self, record: RunRecord, interval: float | None = 0.5, max_points: int = 200, clock=time.time, nice: int = 0
    ):
        self.record = record
        self.interval = interval
        self.max_points = max_points
        self.clock = clock
        self.nice = nice  # added to the update thread's nice value (kdist_magics.cluster.priority)
        self.widget = DashboardWidget()
        self.series: dict[str, dict[int, list]] = {}
        self.latest_sample: dict[int, dict[str, Any]] = {}
        self.latest_step: dict[int, dict[str, Any]] = {}
        self.recent_steps: dict[int, collections.deque] = {}  # for the straggler check
        self.progress_by_rank: dict[int, dict[str, Any]] = {}
        self.curves: dict[str, Any] = {"names": [], "series": {}}  # what the front end has
        self._curves_version = 0  # bumped by every new curve point
        self._sent_version = -1  # the version the front end has
        self.sends = 0  # front-end updates sent (coalesced)
        self.handle = None
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._finished = False
        self._thread: threading.Thread | None = None
        with record._lock:
            for row in list(record.metrics):
                self._add_metric(row)
            for row in list(record.samples):
                self.latest_sample[int(row.get("rank", 0) or 0)] = row
        record.subscribe(self._on_change)
        self._dirty.set()
        self.flush()
        if interval is not None and record.status == "running":
            self._thread = threading.Thread(target=self._loop, name="kdist-dashboard", daemon=True)
            self._thread.start()

    # -- feeding (any thread; cheap) -------------------------------------------
    def _add_metric(self, row: dict[str, Any]) -> None:
        rank = int(row.get("rank", 0) or 0)
        x = row.get("step")
        if not isinstance(x, (int, float)):
            return
        kind = row.get("kind", "step")
        with self._lock:
            if kind == "step":
                self.latest_step[rank] = row
                self.recent_steps.setdefault(rank, collections.deque(maxlen=stragglers.WINDOW)).append(row)
            for key, value in row.items():
                if key in NOT_CURVES or not isinstance(value, (int, float)):
                    continue
                if kind == "epoch" and not key.startswith("val_"):
                    continue  # step rows already draw the training curves
                series = self.series.get(key)
                if series is None:
                    if len(self.series) >= MAX_SERIES:
                        continue
                    series = self.series[key] = {}
                pts = series.setdefault(rank, [])
                # [step, value, epoch]: rounded once, here, not per update; the epoch for hover
                pts.append([rounded(x), rounded(value), row.get("epoch")])
                self._curves_version += 1
                if len(pts) > 8 * self.max_points:  # bound memory on very long runs
                    last = pts[-1]
                    pts[:] = pts[::2]
                    if pts[-1] is not last:
                        pts.append(last)

    def _on_change(self, kind: str, payload: Any) -> None:
        if kind == "metric":
            self._add_metric(payload)
        elif kind == "sample":
            rank = int(payload.get("rank", 0) or 0)
            previous = self.latest_sample.get(rank)
            if payload.get("cpu_percent") is None and previous is not None:
                payload = {**payload, "cpu_percent": previous.get("cpu_percent")}  # keep the last
            self.latest_sample[rank] = payload
        elif kind == "progress":
            with self._lock:
                self.progress_by_rank.setdefault(int(payload.get("rank", 0) or 0), {}).update(payload)
        self._dirty.set()
        if kind == "status":
            self.finish()

    # -- the view ----------------------------------------------------------------
    def _sample_for(self, rank: int, device: str | None) -> tuple[dict[str, Any] | None, bool]:
        """The latest sample for ``rank``; in-kernel replicas share rank 0's process."""
        own = self.latest_sample.get(rank)
        if own is not None:
            return own, False
        if self.record.strategy in KERNEL_STRATEGIES and 0 in self.latest_sample:
            return self.latest_sample[0], True
        return None, False

    def snapshot(self, with_curves: bool = True) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(state, curves): what the front end draws, small and JSON-able.

        ``curves`` is None when ``with_curves`` is false (nothing new to draw). The record and
        this view are copied under their locks first, so the view never mixes two moments.
        """
        rec = self.record
        now = self.clock()
        with rec._lock:
            rank_states = [(r, vars(s).copy()) for r, s in sorted(rec.ranks.items())]
            progress = dict(rec.progress)
            phases = [dict(p) for p in rec.phases]
        with self._lock:
            per_rank = [dict(p) for p in self.progress_by_rank.values()]
            recent = [row for rows in self.recent_steps.values() for row in rows]
        timed = stragglers.timings(recent)
        cpu = {r: s.get("cpu_percent") for r, s in self.latest_sample.items()}
        slow = {
            s.rank: straggler(s.rank, s.ratio, s.own_s, s.others_s, s.cpu_percent) for s in stragglers.find(recent, cpu)
        }
        slowest_progress(progress, per_rank)
        rows = rec.split_rows(recent)
        splits = {s["rank"]: split_entry(s) for s in rows}
        ranks, throughput = self._rank_entries(rank_states, timed, slow, splits)
        state = self._state(now, phases, progress, ranks, throughput, slow)
        state["split_legend"] = split_legend(
            splits, rec.probed_compute(recent), any(s["source"] == SPLIT_TIMED for s in rows)
        )
        if not with_curves:
            return state, None
        return state, self._curves()

    def _rank_entries(self, rank_states, timed, slow, splits) -> tuple[list[dict[str, Any]], float | None]:
        """One entry per rank for the table; the ranks' summed samples/s (None: none said)."""
        ranks = []
        throughput = None
        for r, st in rank_states:
            sample, shared = self._sample_for(r, st.get("device"))
            step = self.latest_step.get(r, {})
            entry = {
                "rank": r,
                "state": st.get("state"),
                "host": st.get("host"),
                "node": st.get("node"),
                "pid": st.get("pid"),
                "device": st.get("device"),
                "error": st.get("error"),
                "loss": rounded(step.get("loss")),
                "step": step.get("step"),
                "epoch": step.get("epoch"),
                "shared": shared,
                "total_steps": self.progress_by_rank.get(r, {}).get("total_steps"),
                "own_step_s": rounded(timed[r][0]) if r in timed else None,
                "wait_step_s": rounded(timed[r][1]) if r in timed else None,
                "straggler": slow.get(r),
                # the step split's bar: mean seconds per step (watch/split.py)
                "split": splits.get(r),
            }
            if sample:
                add_sample(entry, sample, st, shared)
            sps = step.get("samples_per_s") or None
            if isinstance(sps, (int, float)) and not shared:
                throughput = (throughput or 0.0) + sps
            ranks.append(entry)
        return ranks, throughput

    def _state(self, now, phases, progress, ranks, throughput, slow) -> dict[str, Any]:
        """The widget's state from the copies :meth:`snapshot` took."""
        rec = self.record
        total = progress.get("total_steps")
        done = progress.get("step")
        fraction, eta = fraction_eta(progress, rec.status, now)
        failed_ranks = [r for r in ranks if r["state"] == "failed"]
        error = rec.error or next((r["error"] for r in failed_ranks if r["error"]), None)
        return {
            "status": rec.status,
            "strategy": rec.strategy,
            "size": len(ranks),
            "mesh": "x".join(map(str, rec.mesh)) if rec.mesh else None,
            # --strategy sharded, once the cell has built its model: each device's share
            "layout_note": layout_note(rec.layout_table),
            "reason": rec.reason,
            "error": (error or "").strip().splitlines()[-1] if error else None,
            "elapsed": round(rec.duration, 1),
            "running": rec.status == "running",
            # a finished cell that trained nothing: said where the progress bar would be
            "curves_note": CURVES_NOTE,
            "idle_note": TRAINED_NOTHING
            if rec.status != "running" and total is None and progress.get("epochs") is None
            else "",
            "lost_batches": rec.lost_batches,
            "world_size": rec.world_size,
            # the current phase, with its time so far; and every phase's time (the summary)
            "phase": current_phase(phases, now if rec.status == "running" else None),
            "phases": [[p["name"], rounded((p["ended"] or now) - p["started"])] for p in phases],
            "resize_note": resized_note(rec.first_size, rec.resizes) if rec.resizes else "",
            "lost_note": lost_batches(rec.lost_batches) if rec.lost_batches else "",
            "stragglers": [slow[r] for r in sorted(slow)],
            "progress": {
                "fraction": rounded(fraction),
                "step": done,
                "total_steps": total,
                "epoch": progress.get("epoch"),
                "epochs": progress.get("epochs"),
                "steps_per_epoch": progress.get("steps_per_epoch"),
                "eta_s": rounded(eta),
                "samples_per_s": rounded(throughput)
                if throughput is not None
                else rounded(progress.get("samples_per_s")),
                "steps_per_s": rounded(progress.get("steps_per_s")),
            },
            "ranks": ranks,
        }

    def _curves(self) -> dict[str, Any]:
        """The curves, thinned to ``max_points`` per rank: loss first, validation last."""
        with self._lock:
            names = sorted(self.series, key=lambda k: (k != "loss", k.startswith("val_"), k))
            series = {
                name: {str(r): thinned(pts, self.max_points) for r, pts in sorted(self.series[name].items())}
                for name in names
            }
        return {"names": names, "series": series}

    def flush(self) -> bool:
        """Send the current view if anything changed; True when something was sent."""
        if not self._dirty.is_set():
            return False
        self._dirty.clear()
        version = self._curves_version
        state, curves = self.snapshot(with_curves=version != self._sent_version)
        with self.widget.hold_sync():
            if curves is not None:  # samples alone (1/s) do not resend the curves
                self.curves = curves
                self.widget.curves_json = json.dumps(curves, separators=(",", ":"))
                self._sent_version = version
            self.widget.state = state
        self.sends += 1
        return True

    def _loop(self) -> None:
        from ..cluster.priority import lower

        lower(by=self.nice)  # below the training threads (an in-kernel run shares the process)
        while not self._stop.wait(self.interval):
            try:
                self.flush()
            except Exception:
                pass  # the view never breaks the run

    # -- lifecycle -----------------------------------------------------------------
    def bundle(self) -> dict[str, Any]:
        return {
            "text/plain": f"kdist dashboard: {self.record.summary()}",
            "text/html": self.html(),
            WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.widget.model_id},
        }

    def display(self):
        """Show the dashboard in the cell's output (with a static HTML fallback).

        In a terminal IPython (no kernel, so no front end to draw a widget) nothing is
        shown: the record and ``last_run()`` still hold everything.
        """
        from IPython import get_ipython
        from IPython.display import display

        shell = get_ipython()
        if shell is not None and type(shell).__name__ == "TerminalInteractiveShell":
            return self
        self.handle = display(self.bundle(), raw=True, display_id=True)
        return self

    def finish(self) -> None:
        """Stop the update thread, send the final state, then replace the widget with the
        finished view (:mod:`.offline`) and close it."""
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._dirty.set()
        try:
            self.flush()
        except Exception:
            pass
        if self.handle is not None:
            try:  # a cell that never began keeps its one error line, and no dashboard
                bundle = {"text/plain": ""} if self.record.status == NOT_RUN else self.finished_bundle()
                self.handle.update(bundle, raw=True)
            except Exception:
                pass
        try:  # nothing shows it any more: nothing live is left in the kernel or the front end
            self.widget.close()
        except Exception:
            pass

    # -- static views ----------------------------------------------------------------
    def html(self) -> str:
        """A self-contained HTML summary with an inline SVG of the loss curves."""
        return static_summary(*self.snapshot())

    def finished_bundle(self) -> dict[str, Any]:
        """What the output holds once the run ended: no widget, the view drawn from the final
        state by the widget's own script where scripts run, the static summary where not."""
        return {"text/plain": f"kdist dashboard: {self.record.summary()}", "text/html": finished_view(*self.snapshot())}


def show(record: RunRecord, **kwargs: Any) -> Dashboard:  # kwargs: Dashboard's (nice, interval)
    """Create and display a dashboard for ``record`` (what ``%%kdist`` does). On Colab, the
    first one turns on Colab's custom widget manager, which third-party widgets need there."""
    from .compat_colab import colab_widgets_enabled

    if colab_widgets_enabled():
        say("enabled Colab's custom widget manager (the dashboard is a third-party widget)")
    return Dashboard(record, **kwargs).display()
