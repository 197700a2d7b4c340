"""The record of one ``%%kdist`` run: rank states, metric rows and utilisation samples.

Everything that watches a run (the dashboard, ``kdist_magics.last_run()``,
tests) reads this one object. Strategies and the telemetry feed write to it
through :meth:`RunRecord.add`; listeners subscribed with
:meth:`RunRecord.subscribe` are told of every change (from whatever thread the
change happened on).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from . import stragglers as _stragglers
from ..messages import PHASE_CELL, PHASE_TRAINING, lost_batches, push_report, resized_summary, straggler

RANK_STATES = ("starting", "running", "done", "failed", "stopped", "lost")


@dataclass
class RankState:
    rank: int
    state: str = "starting"
    host: str | None = None
    node: str | None = None  # where a scheduler placed it, beside the host ("Ray node 5f0c...")
    pid: int | None = None
    device: str | None = None
    error: str | None = None


class RunRecord:
    """What happened in one run. Rows are plain dicts so they travel and tabulate."""

    def __init__(self, strategy: str, size: int = 1, spec: Any = None, reason: str | None = None):
        self.strategy = strategy
        self.spec = spec
        self.reason = reason  # why --strategy auto chose this strategy
        self.size = size
        self.started_size = size  # ranks the run started with (size counts every rank seen)
        self.started = time.time()
        self.ended: float | None = None
        self.status = "running"  # running | done | failed | interrupted | timeout
        self.error: str | None = None
        self.ranks: dict[int, RankState] = {r: RankState(r) for r in range(size)}
        self.metrics: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.progress: dict[str, Any] = {}  # epochs, steps per epoch, current step, ...
        # telemetry batches the ranks sent that never arrived: their rows are missing from
        # ``metrics``/``samples`` (the curves have gaps there); training itself is unaffected
        self.lost_batches = 0
        #: a rank's compute per step alone, from ``%kdist scale`` of this cell and strategy
        #: (:meth:`kdist_magics.scale.table.ScaleTable.lend`), and the fit's batch it was
        #: measured at (None: not known); ``probe_other``: a probe of this cell that describes
        #: another run (another --np or backend), so not lent
        self.probe_compute_s: float | None = None
        self.probe_batch: int | None = None
        self.probe_other = False
        # an elastic run's re-formings: {"time", "lost": [ranks], "size": world size after}
        self.resizes: list[dict[str, Any]] = []
        # what the run did before and around training, in order: {"name", "started", "ended",
        # "detail"} ("starting 2 engines", "setting up Horovod", "running the cell", ...)
        self.phases: list[dict[str, Any]] = []
        self.layout_table = None  # --strategy sharded: where the variables live (layout.LayoutTable)
        self.mesh: tuple[int, int] | None = None  # --strategy sharded: (data axis, model axis)
        #: what became of each --push value: "shared", "sent" or "unchanged, not sent"
        self.pushed: dict[str, str] = {}
        self._lock = threading.RLock()
        self._listeners: list[Callable[[str, Any], None]] = []

    # -- writing -------------------------------------------------------------
    def subscribe(self, listener: Callable[[str, Any], None]) -> None:
        self._listeners.append(listener)

    def _notify(self, kind: str, payload: Any) -> None:
        for listener in list(self._listeners):
            try:
                listener(kind, payload)
            except Exception:  # a broken view must never break training
                pass

    def add(self, kind: str, row: dict[str, Any]) -> None:
        """Add a ``metric`` or ``sample`` row, or a ``progress`` update."""
        began = None
        with self._lock:
            if kind == "metric":
                self.metrics.append(row)
                if self.phases and self.phases[-1]["name"] == PHASE_CELL and self.ended is None:
                    began = self._begin_phase(PHASE_TRAINING, None)  # the first row from fit()
            elif kind == "sample":
                self.samples.append(row)
            elif kind == "progress":
                self.progress.update(row)
            else:
                raise ValueError(f"unknown record row kind {kind!r}")
        if began is not None:
            self._notify("phase", began)
        self._notify(kind, row)

    def set_rank(self, rank: int, **fields: Any) -> None:
        with self._lock:
            state = self.ranks.setdefault(rank, RankState(rank))
            for key, value in fields.items():
                setattr(state, key, value)
            self.size = max(self.size, len(self.ranks))
        self._notify("rank", state)

    def phase(self, name: str, detail: str | None = None) -> None:
        """The run now does ``name`` (the previous phase ends here)."""
        with self._lock:
            began = self._begin_phase(name, detail)
        self._notify("phase", began)

    def phase_detail(self, detail: str) -> None:
        """More about the current phase ("1 of 2 registered")."""
        with self._lock:
            if not self.phases or self.phases[-1]["ended"] is not None:
                return
            self.phases[-1]["detail"] = detail
            current = dict(self.phases[-1])
        self._notify("phase", current)

    def _begin_phase(self, name: str, detail: str | None) -> dict[str, Any]:
        now = time.time()
        if self.phases and self.phases[-1]["ended"] is None:
            self.phases[-1]["ended"] = now
        self.phases.append({"name": name, "started": now, "ended": None, "detail": detail})
        return dict(self.phases[-1])

    def note_resize(self, lost: list[int], size: int, error: str = "", added: list[int] | None = None) -> None:
        """An elastic run went on without ranks ``lost`` (or took in ranks ``added``); it has
        ``size`` ranks now."""
        with self._lock:
            # the size before: the last re-forming's, or the run's at its start (set_rank
            # below may already have counted a rank that is joining)
            before = self.resizes[-1]["size"] if self.resizes else self.started_size
            for rank in lost:
                state = self.ranks.setdefault(rank, RankState(rank))
                state.state, state.error = "lost", error or state.error
            self.resizes.append(
                {
                    "time": time.time(),
                    "lost": sorted(lost),
                    "added": sorted(added or []),
                    "before": before,
                    "size": int(size),
                }
            )
        self._notify("resize", self.resizes[-1])

    @property
    def world_size(self) -> int:
        """Ranks in the job now (``size`` less any an elastic run went on without)."""
        with self._lock:
            return self.resizes[-1]["size"] if self.resizes else self.size

    @property
    def first_size(self) -> int:
        """Ranks the run started with."""
        with self._lock:
            return self.resizes[0]["before"] if self.resizes else self.size

    def note_lost_batches(self, count: int) -> None:
        """Say how many telemetry batches of this run never arrived."""
        with self._lock:
            self.lost_batches = max(0, int(count))
        self._notify("telemetry", {"lost_batches": self.lost_batches})

    def finish(self, status: str, error: str | None = None) -> None:
        with self._lock:
            self.status = status
            self.error = error
            self.ended = time.time()
            if self.phases and self.phases[-1]["ended"] is None:
                self.phases[-1]["ended"] = self.ended
            final = {"done": "done", "failed": "failed"}.get(status, "stopped")
            for state in self.ranks.values():
                if state.state in ("starting", "running"):
                    state.state = final if status != "failed" else "stopped"
        self._notify("status", status)

    # -- reading -------------------------------------------------------------
    @property
    def duration(self) -> float:
        return (self.ended or time.time()) - self.started

    def to_pandas(self, table: str = "metrics"):
        """``metrics``, ``samples`` or ``ranks`` as a pandas DataFrame."""
        try:
            import pandas as pd
        except ImportError as exc:  # pragma: no cover - pandas is an optional extra
            raise ImportError("RunRecord.to_pandas needs pandas: pip install pandas") from exc
        with self._lock:
            if table == "metrics":
                return pd.DataFrame(list(self.metrics))
            if table == "samples":
                return pd.DataFrame(list(self.samples))
            if table == "ranks":
                return pd.DataFrame([vars(s) for s in self.ranks.values()])
        raise ValueError("table must be 'metrics', 'samples' or 'ranks'")

    def cpu_by_rank(self) -> dict[int, float | None]:
        """Each rank's latest CPU reading (percent of one core)."""
        with self._lock:
            return {
                int(s.get("rank", 0) or 0): s.get("cpu_percent")
                for s in self.samples
                if s.get("cpu_percent") is not None
            }

    def stragglers(self, window: int | None = None) -> list[_stragglers.Straggler]:
        """Ranks clearly slower than the others, over the whole run (or each rank's last
        ``window`` step rows); see :mod:`kdist_magics.watch.stragglers` for how it is judged."""
        with self._lock:
            rows = list(self.metrics)
        return _stragglers.find(rows, self.cpu_by_rank(), window)

    def straggler_notes(self, window: int | None = None) -> list[str]:
        return [straggler(s.rank, s.ratio, s.own_s, s.others_s, s.cpu_percent) for s in self.stragglers(window)]

    def plot(self, metric: str = "loss", ax=None, log: bool | None = None, smooth: bool = False):
        """The dashboard's curves with matplotlib: ``metric`` per rank, ``val_<metric>`` per
        epoch, a log axis when the curve spans more than a decade (see kdist_magics.watch.plot)."""
        from .plot import plot

        return plot(self, metric, ax=ax, log=log, smooth=smooth)

    def layout(self):
        """A sharded run's table: each variable's shape, spec and bytes per device; None, with
        one line saying why, for another strategy's run or one that built no model."""
        if self.layout_table is None:
            from ..messages import no_layout, say

            say(no_layout(self.strategy, self.status))
        return self.layout_table

    def split(self) -> list[dict[str, Any]]:
        """Each rank's mean seconds per step in compute, communication, the wait for slower
        ranks and the rest (:mod:`kdist_magics.watch.split`): measured where the collective is
        timed where it runs (Horovod), else compute and communication inferred once ``%kdist
        scale`` has probed this cell with this strategy (``probe_compute_s``)."""
        return self.split_rows(list(self.metrics))

    def probed_compute(self, rows: list[dict[str, Any]]) -> float | None:
        """The probe's compute where it describes these step rows: lent to this run, and every
        row that says its batch was trained at the batch the probe measured."""
        if self.probe_compute_s is None:
            return None
        batches = {
            r.get("batch_size") for r in rows if r.get("kind", "step") == "step" and r.get("batch_size") is not None
        }
        return self.probe_compute_s if batches <= {self.probe_batch} else None

    def split_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """:func:`kdist_magics.watch.split.split` of ``rows`` with the probe's compute where it
        describes them; a probe of the cell that does not describe them says so."""
        from ..messages import SPLIT_LIVE, SPLIT_OTHER_RUN
        from .split import split

        compute = self.probed_compute(rows)
        out = split(rows, compute)
        if compute is None and (self.probe_other or self.probe_compute_s is not None):
            for r in out:
                if r["source"] == SPLIT_LIVE:
                    r["source"] = SPLIT_OTHER_RUN
        return out

    def summary(self) -> str:
        done = sum(1 for s in self.ranks.values() if s.state == "done")
        last = self.metrics[-1] if self.metrics else {}
        loss = f", last loss {last['loss']:.4g}" if isinstance(last.get("loss"), (int, float)) else ""
        lost = f"; {lost_batches(self.lost_batches)}" if self.lost_batches else ""
        shrunk = f", {resized_summary(self.first_size, self.world_size, self.resizes)}" if self.resizes else ""
        slow = "".join(f"; {note}" for note in self.straggler_notes())
        pushed = f"; {push_report(self.pushed)}" if self.pushed else ""
        return (
            f"{self.strategy}: {self.status} in {self.duration:.1f} s, "
            f"{done}/{len(self.ranks)} ranks done{shrunk}{loss}{lost}{slow}{pushed}"
        )

    def __repr__(self) -> str:
        return f"<RunRecord {self.summary()}>"
