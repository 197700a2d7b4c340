"""What the dashboard shows, worked out from the record's rows: pure functions, no widget.

A rank's table entry with its utilisation sample, the run's progress bounded by its slowest
rank, the fraction done and the time left, the phase a running run is in, what each device
holds of a sharded model, the thinning of long curves, and each rank's step split (the bar) with
its legend. :mod:`.dashboard` calls them to
build its state; each takes plain dicts and returns plain values.
"""

from __future__ import annotations

import math
from typing import Any

from ..messages import SPLIT_LEGEND_LIVE, SPLIT_LEGEND_PROBED, SPLIT_LEGEND_TIMED, SPLIT_TITLE, SPLIT_UNTIMED


def rounded(v: float | None) -> float | None:
    if v is None or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(f"{v:.5g}")


def thinned(points: list, limit: int) -> list:
    """At most ``limit`` points, evenly strided, always keeping the last."""
    n = len(points)
    if n <= limit:
        return list(points)
    stride = math.ceil(n / limit)
    out = points[::stride]
    if out[-1] is not points[-1]:
        out = out[: limit - 1] + [points[-1]]
    return out


def current_phase(phases: list[dict[str, Any]], now: float | None) -> dict[str, Any] | None:
    """The phase a running run is in: name, detail ("1 of 2 registered") and seconds so far."""
    if now is None or not phases or phases[-1]["ended"] is not None:
        return None
    p = phases[-1]
    return {"name": p["name"], "detail": p.get("detail"), "elapsed": rounded(now - p["started"])}


def slowest_progress(progress: dict[str, Any], per_rank: list[dict[str, Any]]) -> None:
    """Where ranks report their own progress, the slowest one bounds the run's (in place)."""
    if not per_rank:
        return
    slowest = min(per_rank, key=lambda p: p.get("step") or 0)
    progress.update({k: v for k, v in slowest.items() if v is not None})
    for key in ("total_steps", "epochs", "steps_per_epoch"):
        values = [p[key] for p in per_rank if p.get(key)]
        progress[key] = max(values) if values else progress.get(key)
    starts = [p["fit_started"] for p in per_rank if p.get("fit_started")]
    progress["fit_started"] = min(starts) if starts else None


def add_sample(entry: dict[str, Any], sample: dict[str, Any], st: dict[str, Any], shared: bool) -> None:
    """A rank's table entry with its utilisation sample (in-kernel replicas: their own GPU)."""
    gpus = list(sample.get("gpus") or [])
    dev = str(st.get("device") or "")
    if shared and gpus and dev.rsplit(":", 1)[-1].isdigit():
        idx = int(dev.rsplit(":", 1)[-1])
        gpus = [g for g in gpus if g.get("index") == idx] or gpus
    entry.update(
        {
            "host": entry["host"] or sample.get("host"),
            "pid": entry["pid"] or sample.get("pid"),
            "cpu_percent": rounded(sample.get("cpu_percent")),
            "cpu_count": sample.get("cpu_count"),
            "rss_bytes": sample.get("rss_bytes"),
            "pss_bytes": sample.get("pss_bytes"),
            "gpus": gpus,
            "tpus": sample.get("tpus") or [],
            "accelerator_note": sample.get("accelerator_note"),
        }
    )


def layout_note(table) -> str:
    try:
        return table.per_device_words() if table is not None else ""
    except Exception:  # the table is a view: never a reason for the dashboard to fail
        return ""


def fraction_eta(progress: dict[str, Any], status: str, now: float):
    """(fraction done, seconds left) of the run's steps; None where not known."""
    total = progress.get("total_steps")
    done = progress.get("step")
    fraction = eta = None
    if isinstance(total, (int, float)) and total and isinstance(done, (int, float)):
        fraction = min(1.0, done / total)
        started = progress.get("fit_started")
        t = progress.get("time")
        if started and t and t > started and done:
            rate = done / (t - started)
            eta = max(0.0, (total - done) / rate - (now - t if status == "running" else 0))
    if status == "done" and fraction is not None:
        eta = 0.0
    return fraction, eta


def split_entry(row: dict[str, Any]) -> dict[str, Any] | None:
    """A rank's split for the bar: ``compute``/``communication`` once probed, else ``in_step``;
    ``rest``; None where its rows carry no step timing (Keras on JAX)."""
    if row["in_step_s"] is None:
        return None
    parts = (
        {"compute": row["compute_s"], "communication": row["communication_s"]}
        if row["compute_s"] is not None
        else {"in_step": row["in_step_s"]}
    )
    if row.get("wait_s") is not None:
        parts["wait"] = row["wait_s"]
    parts["rest"] = row["rest_s"] or 0.0
    return {k: rounded(v) for k, v in parts.items()}


def split_legend(splits: dict[int, Any], compute: float | None, timed: bool = False) -> str:
    """What the bars show, or why there are none (a run whose steps are not timed live)."""
    if any(splits.values()):
        if timed:
            return SPLIT_LEGEND_TIMED
        return SPLIT_LEGEND_PROBED if compute is not None else SPLIT_LEGEND_LIVE
    return f"{SPLIT_TITLE}: {SPLIT_UNTIMED}" if splits else ""
