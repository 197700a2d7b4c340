"""Chart axes: tick positions, when a curve wants a log scale, smoothing.

The live dashboard's static module (``static/dashboard.js``) applies the same rules in
JavaScript, and the static SVG (:mod:`kdist_magics.watch.svg`) and ``last_run().plot()`` use these;
``tests/test_dashboard_js.py`` checks that both languages give the same ticks.
"""

from __future__ import annotations

import math
from typing import Iterable

#: a curve spanning more than this ratio (max / min, all values positive) starts on a log axis
LOG_SPAN = 10.0
#: TensorBoard's default smoothing weight
SMOOTHING = 0.6


def _clean(v: float) -> float:
    return float(f"{v:.12g}")  # as JavaScript's +v.toPrecision(12)


def nice_step(span: float, count: int) -> float:
    """1, 2 or 5 times a power of ten, near ``span / count``."""
    raw = span / max(1, count)
    mag = 10.0 ** math.floor(math.log10(raw))
    f = raw / mag
    return (1 if f <= 1 else 2 if f <= 2 else 5 if f <= 5 else 10) * mag


def linear_range(lo: float, hi: float, count: int = 5) -> tuple[float, float, list[float]]:
    """(axis low, axis high, ticks): the data range widened to whole ticks."""
    if not hi > lo:
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step(hi - lo, count)
    a = _clean(math.floor(lo / step + 1e-9) * step)
    b = _clean(math.ceil(hi / step - 1e-9) * step)
    n = round((b - a) / step)
    return a, b, [_clean(a + i * step) for i in range(n + 1)]


def log_range(lo: float, hi: float) -> tuple[float, float, list[float]]:
    """(axis low, axis high, ticks) for positive data: whole decades, with 2 and 5 (or 3)
    between them when the axis spans few decades."""
    a = math.floor(math.log10(lo) + 1e-9)
    b = math.ceil(math.log10(hi) - 1e-9)
    if b <= a:
        b = a + 1
    decades = b - a
    mults = (1, 2, 5) if decades <= 1 else (1, 3) if decades <= 3 else (1,)
    every = max(1, math.ceil(decades / 6))
    ticks = [_clean(m * 10.0**e) for e in range(a, b + 1) if (e - a) % every == 0 for m in mults if e < b or m == 1]
    return _clean(10.0**a), _clean(10.0**b), ticks


def wants_log(values: Iterable[float]) -> bool:
    """True when every value is positive and the largest is more than ``LOG_SPAN`` times the
    smallest: a loss falling from 10 to 0.16 reads as a flat line on a linear axis."""
    vals = [v for v in values if v is not None]
    return bool(vals) and min(vals) > 0 and max(vals) / min(vals) > LOG_SPAN


def smooth(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased at the start."""
    out, last = [], 0.0
    for i, v in enumerate(values, 1):
        last = last * weight + (1 - weight) * v
        out.append(last / (1 - weight**i))
    return out


def tick_label(v: float) -> str:
    """Short tick text: 3 significant digits, exponent form for very small or large values."""
    if v == 0:
        return "0"
    a = abs(v)
    if a < 1e-3 or a >= 1e5:
        m, e = f"{v:.0e}".split("e")
        return f"{m}e{int(e)}"
    x = float(f"{v:.3g}")
    return str(int(x)) if x.is_integer() else repr(x)
