"""The loss curves as inline SVG, for the dashboard's static view (saved notebooks, GitHub).

Same axes as the live widget (:mod:`kdist_magics.axes`): value ticks, a log axis when the
curve spans more than a decade, validation values as hollow points per epoch.
"""

from __future__ import annotations

import html as _html
import math

from .axes import linear_range, log_range, tick_label, wants_log

#: one colour per rank, as in static/dashboard.js
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


def _points(series: dict | None) -> dict[str, list[tuple[float, float]]]:
    return {str(rank): [(p[0], p[1]) for p in line if p[0] is not None and p[1] is not None]
            for rank, line in (series or {}).items()}


def svg_curves(series: dict[str, list], title: str = "loss", width: int = 420,
               height: int = 170, val: dict[str, list] | None = None) -> str:
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
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
             f'<text x="{left}" y="12" font-size="11">{_html.escape(title)} per rank ({scale})'
             f'</text>',
             f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#ccc"/>']
    for v in yticks:
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" '
                     f'stroke="#eee"/><text x="{left - 4}" y="{Y(v) + 3:.1f}" font-size="10" '
                     f'text-anchor="end" fill="#666">{tick_label(v)}</text>')
    for v in linear_range(x0, x1, 4)[2]:
        if x0 - 1e-9 <= v <= x1 + 1e-9:
            parts.append(f'<text x="{X(v):.1f}" y="{top + h + 13}" font-size="10" '
                         f'text-anchor="middle" fill="#666">{tick_label(v)}</text>')
    parts.append(f'<text x="{left + w}" y="{height - 1}" font-size="10" text-anchor="end" '
                 f'fill="#666">step</text>')
    for rank, line in sorted(lines.items(), key=lambda kv: int(kv[0])):
        colour = PALETTE[int(rank) % len(PALETTE)]
        coords = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in line)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'points="{coords}"><title>rank {rank}</title></polyline>')
    for rank, line in sorted(vals.items(), key=lambda kv: int(kv[0])):
        colour = PALETTE[int(rank) % len(PALETTE)]
        parts.extend(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3" fill="#fff" '
                     f'stroke="{colour}" stroke-width="1.5"><title>rank {rank} validation '
                     f'{y:.4g}</title></circle>' for x, y in line)
    parts.append("</svg>")
    return "".join(parts)
