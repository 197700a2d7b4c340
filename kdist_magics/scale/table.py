"""``kdist_magics.last_scale()``: the probe's table (one row per N, measured or predicted), the
link it measured, the assumptions and the advice, as text, HTML, a DataFrame and a plot."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field

from ..messages import BATCH_UNKNOWN, LINK_FITTED, LINK_NONE, SCALE_COMM_INFERRED, more_hosts_said
from .figure import svg
from .model import ASSUMPTIONS, GLOBAL_BATCH, Link, Row

COLUMNS = (
    "N",
    "samples/s",
    "speed-up",
    "efficiency",
    "step ms",
    "compute ms",
    "communication ms",
    "rest ms",
    "comm share",
    "",
)
#: the throughput column where the batch is not known: batches (steps of every rank) per second
BATCHES_COLUMN = "batches/s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


@dataclass
class ScaleTable:
    strategy: str
    rows: list[Row]
    link: Link
    grad_bytes: int
    batch: int | None  # per rank (per replica); None: not known, the rows count batches
    advice: list[str] = field(default_factory=list)
    #: measured N -> the step the 1-rank figures and the link predicted for it (P10's error)
    predicted_from_one: dict[int, float] = field(default_factory=dict)
    cost_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    cell: str = ""  # the cell probed (a run of the same cell splits with this probe's compute)
    model_axis: int = 1  # sharded: the model axis M each probed data replica kept
    backend: str = ""  # Keras' backend the probe ran on
    #: (hosts, row) predicted for more hosts, where the link was measured between hosts
    hosts_rows: list[tuple[int, Row]] = field(default_factory=list)

    @property
    def columns(self) -> tuple[str, ...]:
        return COLUMNS if self.batch is not None else (COLUMNS[0], BATCHES_COLUMN, *COLUMNS[2:])

    def fit_batch(self, n: int) -> int | None:
        """The ``batch_size`` a cell's ``fit`` gives at ``n`` ranks, as probed (the global batch
        for strategies whose cells give it)."""
        if self.batch is None:
            return None
        return self.batch * n if self.strategy in GLOBAL_BATCH else self.batch

    def describes(self, strategy: str, cell: str | None, n: int, backend: str) -> bool:
        """Whether the probe's compute describes a run: the same cell and strategy, on the same
        backend, at an N it measured (its per-rank batch is checked against the run's own rows,
        :meth:`kdist_magics.watch.record.RunRecord.probed_compute`)."""
        return (
            strategy == self.strategy
            and cell == self.cell
            and backend == self.backend
            and any(r.n == n and r.measured for r in self.rows)
        )

    def lend(self, record) -> None:
        """Give a run this probe's compute to split its steps with (:meth:`describes` first)."""
        record.probe_compute_s = self.compute_s
        record.probe_batch = self.fit_batch(record.size)

    @property
    def compute_s(self) -> float | None:
        """A rank's compute per step alone: the 1-rank step."""
        return next((r.compute_s for r in self.rows if r.n == 1 and r.measured), None)

    def cells(self, row: Row) -> list[str]:
        share = row.communication_share
        return [
            str(row.n),
            f"{row.samples_per_s:,.0f}",
            f"{row.speedup:.2f}x",
            f"{row.efficiency:.0%}",
            _ms(row.step_s),
            _ms(row.compute_s),
            _ms(row.communication_s),
            _ms(row.rest_s),
            "-" if share is None else f"{share:.0%}",
            "measured" if row.measured else "predicted",
        ]

    def more_hosts(self) -> list[tuple[int, Row]]:
        """(hosts, predicted row) for 2 and 4 times the hosts probed, as many ranks on each; none
        where the probe's ranks shared one host (no link between hosts was measured)."""
        return list(self.hosts_rows)

    def hosts_line(self) -> str | None:
        """The table's line on more hosts (None for the kernel's devices: no hosts at all)."""
        if self.link.fitted:
            return None
        return more_hosts_said(self.hosts_rows, self.link.ranks, self.link.hosts)

    def head(self) -> str:
        link = self.link
        if link.fitted and link.bandwidth == float("inf") and not link.latency:
            said = LINK_NONE
        else:
            via = f" ({link.via})" if link.via else ""
            said = (
                f"{LINK_FITTED + ': ' if link.fitted else f'link{via} '}"
                f"{link.bandwidth / 2**20:,.0f} MiB/s bus bandwidth, {link.latency * 1e6:,.0f} us "
                f"per ring step ({link.ranks} {'devices' if link.fitted else 'ranks'}"
                f"{f', {link.hosts} hosts' if link.hosts > 1 else ''})"
            )
        batch = self.batch if self.batch is not None else BATCH_UNKNOWN
        return (
            f"kdist scale: {self.strategy}, per-{'replica' if link.fitted else 'rank'} batch "
            f"{batch}, gradients {self.grad_bytes / 2**20:.2f} MiB; {said}; probe took "
            f"{self.cost_s:.0f} s"
        )

    def __repr__(self) -> str:
        table = [list(self.columns)] + [self.cells(r) for r in self.rows]
        widths = [max(len(line[i]) for line in table) for i in range(len(self.columns))]
        text = [self.head()]
        text += ["  " + "  ".join(c.rjust(w) for c, w in zip(line, widths)).rstrip() for line in table]
        text += [
            f"  checked: {n} ranks predicted {_ms(p)} ms a step from 1 rank, measured {_ms(self.step_of(n))} ms"
            for n, p in sorted(self.predicted_from_one.items())
        ]
        text += [f"  {line}" for line in [self.hosts_line()] if line]
        text += ["  " + SCALE_COMM_INFERRED]
        text += ["  assumes: " + "; ".join(ASSUMPTIONS)]
        text += [f"  note: {n}" for n in self.notes]
        text += [f"  advice: {a}" for a in self.advice]
        return "\n".join(text)

    def _repr_html_(self) -> str:
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in self.cells(r)) + "</tr>" for r in self.rows
        )
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        hosts = [line for line in [self.hosts_line()] if line]
        extra = "".join(f"<li>{html.escape(a)}</li>" for a in hosts + self.advice + self.notes)
        return (
            f"<div class='kdist-scale'><p>{html.escape(self.head())}</p>{svg(self.rows)}"
            f"<table><tr>{head}</tr>"
            f"{rows}</table><p><small>{html.escape(SCALE_COMM_INFERRED)}</small></p><p><small>assumes: {html.escape('; '.join(ASSUMPTIONS))}</small></p>"
            f"<ul>{extra}</ul></div>"
        )

    def step_of(self, n: int) -> float | None:
        return next((r.step_s for r in self.rows if r.n == n and r.measured), None)

    def prediction_errors(self) -> dict[int, float]:
        """|predicted - measured| / measured of each measured N > 1, predicted from 1 rank."""
        return {
            n: abs(p - self.step_of(n)) / self.step_of(n) for n, p in self.predicted_from_one.items() if self.step_of(n)
        }

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame([{**asdict(r), "communication_share": r.communication_share} for r in self.rows])

    def what_if(self):
        """A control for teaching: drag N, the link's bandwidth and latency and the per-rank
        batch, and the predicted speed-up and plot move (:mod:`.what_if`; needs ipywidgets)."""
        from .what_if import control

        return control(self)

    def plot(self, ax=None):
        """Speed-up against N, measured (filled) and predicted (hollow), beside the ideal."""
        import matplotlib.pyplot as plt

        ax = ax or plt.subplots(figsize=(5, 3.5))[1]
        ns = [r.n for r in self.rows]
        ax.plot(ns, ns, ":", color="grey", label="ideal (N x)")
        for measured, style in ((True, "o-"), (False, "o--")):
            pts = [(r.n, r.speedup) for r in self.rows if r.measured is measured]
            if pts:
                ax.plot(
                    *zip(*pts), style, mfc=None if measured else "none", label="measured" if measured else "predicted"
                )
        ax.set_xlabel("ranks (N)")
        ax.set_ylabel("speed-up over 1 rank")
        ax.set_title(f"kdist scale: {self.strategy}")
        ax.legend()
        return ax
