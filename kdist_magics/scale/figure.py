"""``%kdist scale``'s plot, drawn as inline SVG (no plotting library; a saved notebook, an HTML
export, GitHub and nbviewer show it as the kernel drew it): speed-up and efficiency against N,
on a log2 axis of N, measured rows as filled points, predicted rows as hollow points on a
dashed line, and the ideal (N x, 100 %) as a grey dotted line."""

from __future__ import annotations

import html
import math

from .model import Row

#: measured and predicted points, as the table's own words say them
MEASURED, PREDICTED, IDEAL = "#1565c0", "#ef6c00", "#9e9e9e"


def _panel(rows: list[Row], value, ideal, label: str, fmt, width: int, height: int) -> str:
    ns = sorted({r.n for r in rows})
    top_n = max(ns[-1], 2)
    ys = [value(r) for r in rows] + [ideal(n) for n in ns]
    y1 = max(max(ys) * 1.1, 1e-9)
    left, top, right, bottom = 46, 20, 10, 30
    w, h = width - left - right, height - top - bottom

    def x(n: float) -> float:
        return left + w * math.log2(n) / math.log2(top_n)

    def y(v: float) -> float:
        return top + h * (1 - v / y1)

    out = [
        f'<text x="{left}" y="13" font-size="11">{html.escape(label)}</text>',
        f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#bbb"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#bbb"/>',
    ]
    for n in ns:
        out.append(f'<text x="{x(n):.1f}" y="{top + h + 13}" font-size="10" text-anchor="middle">{n}</text>')
    for frac in (0.0, 0.5, 1.0):
        v = y1 / 1.1 * frac
        out.append(
            f'<text x="{left - 4}" y="{y(v) + 3:.1f}" font-size="10" text-anchor="end">{html.escape(fmt(v))}</text>'
        )
    out.append(f'<text x="{left + w / 2:.1f}" y="{height - 3}" font-size="10" text-anchor="middle">ranks (N)</text>')
    ideal_pts = " ".join(f"{x(n):.1f},{y(ideal(n)):.1f}" for n in ns)
    out.append(
        f'<polyline points="{ideal_pts}" fill="none" stroke="{IDEAL}" '
        f'stroke-dasharray="2,3"><title>ideal</title></polyline>'
    )
    measured = [r for r in rows if r.measured]
    predicted = sorted([r for r in rows if not r.measured] + measured[-1:], key=lambda r: r.n)
    for group, colour, dash in ((measured, MEASURED, ""), (predicted, PREDICTED, ' stroke-dasharray="5,3"')):
        pts = " ".join(f"{x(r.n):.1f},{y(value(r)):.1f}" for r in group)
        if len(group) > 1:
            out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}"{dash}/>')
    for r in rows:
        colour = MEASURED if r.measured else PREDICTED
        fill = colour if r.measured else "white"
        said = f"N = {r.n}: {fmt(value(r))} ({'measured' if r.measured else 'predicted'})"
        out.append(
            f'<circle cx="{x(r.n):.1f}" cy="{y(value(r)):.1f}" r="3.5" fill="{fill}" '
            f'stroke="{colour}"><title>{html.escape(said)}</title></circle>'
        )
    return (
        f'<svg class="kdist-scale-plot" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{html.escape(label)}">' + "".join(out) + "</svg>"
    )


def svg(rows: list[Row], width: int = 300, height: int = 190) -> str:
    """Two panels side by side: speed-up over 1 rank, and efficiency, against N; a legend."""
    if not rows:
        return ""
    speedup = _panel(rows, lambda r: r.speedup, float, "speed-up over 1 rank", lambda v: f"{v:.1f}x", width, height)
    efficiency = _panel(
        rows, lambda r: r.efficiency, lambda n: 1.0, "efficiency (speed-up / N)", lambda v: f"{v:.0%}", width, height
    )
    legend = (
        f'<span style="color:{MEASURED}">&#9679; measured</span> &nbsp; '
        f'<span style="color:{PREDICTED}">&#9675; predicted</span> &nbsp; '
        f'<span style="color:{IDEAL}">&middot;&middot;&middot; ideal</span>'
    )
    return f'<div class="kdist-scale-figure">{speedup}{efficiency}<div><small>{legend}</small></div></div>'
