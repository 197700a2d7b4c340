"""The dashboard's static view (saved notebooks, GitHub, nbviewer): an HTML summary
(:func:`static_summary`) with the loss curves as inline SVG (:func:`svg_curves`).

Same axes as the live widget (:mod:`kdist_magics.watch.axes`): value ticks, a log axis when the
curve spans more than a decade, validation values as hollow points per epoch.
"""

from __future__ import annotations

import html as _html
import math
from typing import Callable

from ..messages import SPLIT_TITLE
from .axes import linear_range, log_range, tick_label, wants_log

#: one colour per rank, as in static/dashboard.js
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _points(series: dict | None) -> dict[str, list[tuple[float, float]]]:
    return {
        str(rank): [(p[0], p[1]) for p in line if p[0] is not None and p[1] is not None]
        for rank, line in (series or {}).items()
    }


def _marks(lines: dict, vals: dict, X: Callable[[float], float], Y: Callable[[float], float]) -> list[str]:
    """Each rank's polyline, and its validation points as hollow circles, in its colour."""
    parts = []
    for rank, line in sorted(lines.items(), key=lambda kv: int(kv[0])):
        colour = PALETTE[int(rank) % len(PALETTE)]
        coords = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in line)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
            f'points="{coords}"><title>rank {rank}</title></polyline>'
        )
    for rank, line in sorted(vals.items(), key=lambda kv: int(kv[0])):
        colour = PALETTE[int(rank) % len(PALETTE)]
        parts.extend(
            f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3" fill="#fff" '
            f'stroke="{colour}" stroke-width="1.5"><title>rank {rank} validation '
            f"{y:.4g}</title></circle>"
            for x, y in line
        )
    return parts


def svg_curves(
    series: dict[str, list],
    title: str = "loss",
    width: int = 420,
    height: int = 170,
    val: dict[str, list] | None = None,
) -> str:
    """Inline SVG: one polyline per rank, ``val`` (validation per epoch) as hollow points."""
    lines, vals = _points(series), _points(val)
    pts = [p for line in [*lines.values(), *vals.values()] for p in line]
    if not pts:
        return ""
    ys = [p[1] for p in pts]
    log = wants_log(ys)
    y0, y1, yticks = log_range(min(ys), max(ys)) if log else linear_range(min(ys), max(ys))
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    x1 = x1 if x1 > x0 else x0 + 1
    f = math.log10 if log else float
    left, top, right, bottom = 44, 18, 6, 22
    w, h = width - left - right, height - top - bottom

    def X(x):
        return left + (x - x0) / (x1 - x0) * w

    def Y(y):
        return top + (1 - (f(y) - f(y0)) / (f(y1) - f(y0))) * h

    scale = "log scale" if log else "linear"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
        f'<text x="{left}" y="12" font-size="11">{_html.escape(title)} per rank ({scale})</text>',
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#ccc"/>',
    ]
    for v in yticks:
        parts.append(
            f'<line x1="{left}" x2="{left + w}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" '
            f'stroke="#eee"/><text x="{left - 4}" y="{Y(v) + 3:.1f}" font-size="10" '
            f'text-anchor="end" fill="#666">{tick_label(v)}</text>'
        )
    for v in linear_range(x0, x1, 4)[2]:
        if x0 - 1e-9 <= v <= x1 + 1e-9:
            parts.append(
                f'<text x="{X(v):.1f}" y="{top + h + 13}" font-size="10" '
                f'text-anchor="middle" fill="#666">{tick_label(v)}</text>'
            )
    parts.append(f'<text x="{left + w}" y="{height - 1}" font-size="10" text-anchor="end" fill="#666">step</text>')
    parts.extend(_marks(lines, vals, X, Y))
    parts.append("</svg>")
    return "".join(parts)


#: the step split's colours and names, as in static/dashboard.css and dashboard.js
SPLIT_PARTS = (
    ("compute", "compute", "#42a5f5"),
    ("communication", "communication", "#ef5350"),
    ("wait", "wait for slower ranks", "#ffb74d"),
    ("in_step", "in step", "#7e57c2"),
    ("rest", "rest", "#bdbdbd"),
)


def _ms(v: float) -> str:
    return f"{v * 1000:.0f} ms" if v >= 0.01 else f"{v * 1000:.2g} ms"


def svg_split(split: dict | None, longest: float, width: int = 120, height: int = 9) -> str:
    """A rank's step split as one stacked bar (inline SVG, scaled to the longest rank's step)
    and its figures in words; "" where the rank's steps were not timed."""
    if not split or longest <= 0:
        return ""
    rects, words, x = [], [], 0.0
    for key, name, colour in SPLIT_PARTS:
        v = split.get(key)
        if v is None:
            continue
        w = min(1.0, v / longest) * width
        rects.append(
            f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{height}" fill="{colour}">'
            f"<title>{name} {_ms(v)}</title></rect>"
        )
        words.append(f"{name} {_ms(v)}")
        x += w
    return (
        f'<svg width="{width}" height="{height}" style="vertical-align:middle">'
        + "".join(rects)
        + f'</svg> <span style="color:#666">{" &middot; ".join(words)}</span>'
    )


def _size(nbytes) -> str:
    return "–" if nbytes is None else f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def devices(rank: dict) -> str:
    """A rank's accelerators as the live view's bars say them, in words: each GPU's use and
    memory, each TPU chip's duty cycle and high-bandwidth memory (and where TPU figures came
    from); empty for a rank with neither."""
    parts = []
    for g in rank.get("gpus") or []:
        use = "–" if g.get("util_percent") is None else f"{g['util_percent']:.0f}%"
        parts.append(
            f"GPU{g.get('index', 0)} {use}, {_size(g.get('mem_used_bytes'))} / {_size(g.get('mem_total_bytes'))}"
        )
    tpus = rank.get("tpus") or []
    for t in tpus:
        duty = t.get("duty_cycle_percent")
        total = f" / {_size(t['mem_total_bytes'])}" if t.get("mem_total_bytes") else ""
        parts.append(
            f"TPU{t.get('index', 0)}"
            + (f" {duty:.0f}% duty cycle" if duty is not None else "")
            + f", HBM {_size(t.get('mem_used_bytes'))}{total}"
        )
    if tpus and tpus[0].get("source"):
        parts.append(f"(TPU figures: {tpus[0]['source']})")
    return "; ".join(parts)


def static_summary(state: dict, curves: dict) -> str:
    """The dashboard's static view: a self-contained HTML summary of a snapshot (state and
    curves as the widget gets them), with an inline SVG of the loss curves."""
    esc = _html.escape
    status = state["status"]
    colour = {"done": "#2e7d32", "failed": "#c62828", "running": "#1565c0"}.get(status, "#ef6c00")
    lines = [
        '<div class="kdist-static" style="font-family:sans-serif;font-size:13px">',
        f"<b>kdist {esc(state['strategy'])}</b>"
        + (f", mesh {esc(state['mesh'])}" if state.get("mesh") else "")
        + " &middot; "
        f'<span style="color:{colour};font-weight:bold">{esc(status)}</span> &middot; '
        f"{state['size']} rank(s) &middot; {state['elapsed']:.1f} s",
    ]
    if state["error"]:
        lines.append(f'<div style="color:#c62828">{esc(state["error"])}</div>')
    if state["lost_batches"]:
        lines.append(f'<div style="color:#666">{esc(state["lost_note"])}</div>')
    if state["phases"]:
        lines.append(
            '<div style="color:#666">'
            + esc(" \u00b7 ".join(f"{name} {seconds:.1f} s" for name, seconds in state["phases"]))
            + "</div>"
        )
    if state["resize_note"]:
        lines.append(f'<div style="color:#6d4c41">{esc(state["resize_note"])}</div>')
    if state.get("layout_note"):
        lines.append(f'<div style="color:#666">{esc(state["layout_note"])}</div>')
    for note in state["stragglers"]:
        lines.append(f'<div style="color:#ef6c00">{esc(note)}</div>')
    if state.get("idle_note"):
        lines.append(f'<div style="color:#666">{esc(state["idle_note"])}</div>')
    name = "loss" if "loss" in curves["series"] else (curves["names"][0] if curves["names"] else None)
    if name:
        lines.append(svg_curves(curves["series"][name], title=name, val=curves["series"].get(f"val_{name}")))
        lines.append(f'<div style="color:#666;font-size:11px">{esc(state.get("curves_note", ""))}</div>')
    longest = max((sum(v or 0 for v in r["split"].values()) for r in state["ranks"] if r.get("split")), default=0.0)
    accelerators = any(devices(r) for r in state["ranks"])
    rows = "".join(
        f"<tr><td>{r['rank']}</td><td>{esc(str(r['state']))}</td>"
        f"<td>{esc(' · '.join(str(w) for w in (r.get('host'), r.get('node')) if w))}</td><td>{r.get('pid') or ''}</td>"
        f"<td>{'' if r.get('loss') is None else r['loss']}</td>"
        + (f"<td>{esc(devices(r))}</td>" if accelerators else "")
        + (f"<td>{svg_split(r.get('split'), longest)}</td>" if longest else "")
        + "</tr>"
        for r in state["ranks"]
    )
    lines.append(
        "<table><tr><th>rank</th><th>state</th><th>host</th><th>pid</th>"
        "<th>last loss</th>"
        + ("<th>accelerators</th>" if accelerators else "")
        + (f"<th>{SPLIT_TITLE}</th>" if longest else "")
        + f"</tr>{rows}</table>"
    )
    if state.get("split_legend"):
        lines.append(f'<div style="color:#666;font-size:11px">{esc(state["split_legend"])}</div>')
    lines.append("</div>")
    return "\n".join(lines)
