"""``last_run().plot()``: the dashboard's curves with matplotlib, after the run.

The same picture as the live widget: a line per rank from the step rows, validation values as
hollow points per epoch, a log value axis when the curve spans more than a decade
(:func:`kdist_magics.watch.axes.wants_log`), optional smoothing (TensorBoard's).
"""

from __future__ import annotations

from typing import Any

from .axes import smooth as _smooth
from .axes import wants_log
from .svg import PALETTE


def lines(metrics: list[dict[str, Any]], name: str) -> dict[int, list[tuple[float, float]]]:
    """{rank: [(step, value), ...]} of ``name`` (epoch rows for ``val_*``, step rows otherwise)."""
    kind = "epoch" if name.startswith("val_") else "step"
    out: dict[int, list[tuple[float, float]]] = {}
    for row in metrics:
        v, x = row.get(name), row.get("step")
        if row.get("kind", "step") == kind and isinstance(v, (int, float)) and isinstance(x, (int, float)):
            out.setdefault(int(row.get("rank", 0) or 0), []).append((x, v))
    return {r: sorted(pts) for r, pts in sorted(out.items())}


def plot(record, metric: str = "loss", ax=None, log: bool | None = None, smooth: bool = False):
    """Draw ``metric`` per rank (and ``val_<metric>`` per epoch) on ``ax`` (a new figure when
    None); returns the axes."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "last_run().plot() draws with matplotlib: pip install matplotlib "
            "(the live dashboard and last_run().to_pandas() need nothing more)"
        ) from None
    with record._lock:
        metrics = list(record.metrics)
    train = lines(metrics, metric)
    val = lines(metrics, f"val_{metric}") if not metric.startswith("val_") else {}
    if not train and not val:
        names = sorted(
            {k for row in metrics for k, v in row.items() if isinstance(v, (int, float))}
            - {"rank", "epoch", "step", "batch", "fit", "time"}
        )
        raise ValueError(f"no {metric!r} in this run's metrics; there are: {', '.join(names) or 'none'}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.6))
    for rank, pts in train.items():
        colour = PALETTE[rank % len(PALETTE)]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if smooth and len(ys) > 2:
            ax.plot(xs, ys, color=colour, alpha=0.25, linewidth=1)
            ys = _smooth(ys)
        ax.plot(xs, ys, color=colour, linewidth=1.6, label=f"rank {rank}")
    for rank, pts in val.items():
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            "o",
            mfc="white",
            mec=PALETTE[rank % len(PALETTE)],
            label=f"rank {rank} val_{metric}",
        )
    values = [v for pts in [*train.values(), *val.values()] for _, v in pts]
    if (wants_log(values) if log is None else log) and min(values) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} per rank \u00b7 {record.strategy}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return ax
