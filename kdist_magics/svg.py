"""The loss curves as inline SVG, for the dashboard's static view (saved notebooks, GitHub)."""

from __future__ import annotations

import html as _html

#: one colour per rank, as in static/dashboard.js
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


def svg_curves(series: dict[str, list], title: str = "loss", width: int = 420,
               height: int = 160) -> str:
    """Inline SVG: one polyline per rank."""
    pts = [(x, y) for line in series.values() for x, y in line if x is not None and y is not None]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    pad = 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}">',
             f'<text x="{pad}" y="12" font-size="11">{_html.escape(title)} per rank '
             f'({y0:.4g} .. {y1:.4g})</text>',
             f'<rect x="{pad}" y="16" width="{width - pad - 5}" height="{height - 36}" '
             f'fill="none" stroke="#ccc"/>']
    for i, (rank, line) in enumerate(sorted(series.items(), key=lambda kv: int(kv[0]))):
        coords = " ".join(
            f"{pad + (x - x0) / (x1 - x0) * (width - pad - 5):.1f},"
            f"{16 + (1 - (y - y0) / (y1 - y0)) * (height - 36):.1f}"
            for x, y in line if x is not None and y is not None)
        parts.append(f'<polyline fill="none" stroke="{PALETTE[i % len(PALETTE)]}" '
                     f'stroke-width="1.5" points="{coords}"><title>rank {rank}</title></polyline>')
    parts.append("</svg>")
    return "".join(parts)
