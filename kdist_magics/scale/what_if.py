"""``kdist_magics.last_scale().what_if()``: the probe's model as a control, for teaching. Drag
N, the link's bandwidth and latency, and the per-rank batch: the predicted speed-up and the plot
move (:func:`rows`, the same model as the table, :mod:`.model`).

A rank's compute per step is the probe's 1-rank step, grown in proportion to the batch (the
step's compute grows with the batch, its all-reduce does not); its input time stays as
measured. The speed-up is over 1 rank at the same batch.
"""

from __future__ import annotations

from .figure import svg
from .model import Link, Row, predict

MiB = 2**20
#: the N the control offers (powers of two) and the batch factors (of the probed batch)
NS = tuple(2**k for k in range(1, 11))
FACTORS = (0.25, 0.5, 1, 2, 4, 8, 16, 32)


def rows(table, n: int, bandwidth: float, latency: float, factor: float = 1.0) -> list[Row]:
    """Predicted rows at 1, 2, 4, ... N ranks on a link of ``bandwidth`` bytes/s and ``latency``
    seconds per ring step, at ``factor`` times the probed per-rank batch."""
    one = next(r for r in table.rows if r.n == 1 and r.measured)
    batch = (table.batch or 1) * factor
    compute = (one.compute_s or one.step_s) * factor
    rest = one.rest_s or 0.0
    link = Link(bandwidth=bandwidth, latency=latency, ranks=n, hosts=table.link.hosts)
    base = batch / (compute + rest)
    first = Row(
        n=1,
        samples_per_s=base,
        step_s=compute + rest,
        compute_s=compute,
        communication_s=0.0,
        rest_s=rest,
        measured=False,
    )
    out, k = [first], 2
    while k <= n:
        out.append(predict(k, compute, rest, batch, table.grad_bytes, link, base))
        k *= 2
    if out[-1].n != n:
        out.append(predict(n, compute, rest, batch, table.grad_bytes, link, base))
    return out


def verdict(table, row: Row, factor: float) -> str:
    """One line under the plot: the prediction at the N asked."""
    share = row.communication_share or 0.0
    batch = (
        f"per-rank batch {round(table.batch * factor)}"
        if table.batch is not None
        else f"{factor:g} x today's per-rank batch"
    )
    return (
        f"predicted: {row.n} ranks give {row.speedup:.1f}x over 1 rank (efficiency "
        f"{row.efficiency:.0%}; {share:.0%} of a step is all-reduce) at {batch}"
    )


def control(table):
    """The ipywidgets control (sliders and the plot); a saved notebook keeps its last drawing."""
    import ipywidgets as w

    link = table.link
    bandwidth = link.bandwidth if link.bandwidth != float("inf") else 1e12
    n = w.SelectionSlider(options=NS, value=min((k for k in NS if k >= 4), default=4), description="ranks N")
    bw = w.FloatLogSlider(
        value=min(max(bandwidth / MiB, 1.0), 1e6),
        base=10,
        min=0,
        max=6,
        step=0.05,
        description="MiB/s",
        readout_format=",.0f",
    )
    lat = w.FloatLogSlider(
        value=min(max(link.latency * 1e6, 1.0), 1e5),
        base=10,
        min=0,
        max=5,
        step=0.05,
        description="latency us",
        readout_format=",.0f",
    )
    factor = w.SelectionSlider(options=FACTORS, value=1, description="batch x")
    out = w.HTML()

    def draw(_=None) -> None:
        predicted = rows(table, n.value, bw.value * MiB, lat.value * 1e-6, factor.value)
        out.value = svg(predicted) + f"<p>{verdict(table, predicted[-1], factor.value)}</p>"

    for slider in (n, bw, lat, factor):
        slider.observe(draw, names="value")
    draw()
    intro = w.HTML(f"<small>{INTRO}</small>")
    return _with_static_view(w.VBox)([intro, w.HBox([w.VBox([n, factor]), w.VBox([bw, lat])]), out])


#: above the sliders
INTRO = (
    "what if: the probe's compute per step and gradient bytes, on another link, at another "
    "N or batch (the speed-up is over 1 rank at that batch)"
)


def _with_static_view(box):
    """``box`` whose output also carries its drawing as HTML: a saved notebook, an HTML export
    or the docs (no widget JavaScript there) show the plot as last drawn, with a line saying the
    sliders need a running kernel."""

    class WhatIf(box):
        def _repr_mimebundle_(self, **kwargs):
            own = getattr(super(), "_repr_mimebundle_", None)  # ipywidgets 8 (7 displays itself)
            bundle = (own(**kwargs) if own else None) or {}
            bundle["text/html"] = (
                f"<div class='kdist-what-if'><small>{INTRO}; its sliders move "
                f"in a running notebook</small>{self.children[-1].value}</div>"
            )
            return bundle

    return WhatIf
