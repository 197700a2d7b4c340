"""The stated model behind ``%kdist scale``'s predictions, and the verdicts drawn from figures.

A data-parallel step on N ranks, each with the same per-rank batch ``b``:

    step(N) = compute + rest + allreduce(N)
    allreduce(N) = 2 (N - 1) / N * G / B  +  2 (N - 1) * a      (a ring all-reduce; 0 at N = 1)

``compute`` and ``rest`` (input, callbacks) are a rank's seconds per step as measured by the
probe, ``G`` the gradient bytes (the model's trainable variables), ``B`` the link's bus
bandwidth and ``a`` its latency per ring step, both measured by an all-reduce of ``G`` bytes
between the engines (:mod:`.link`). Then samples/s(N) = N b / step(N), speed-up = samples/s(N)
/ samples/s(1), efficiency = speed-up / N, communication share = allreduce(N) / step(N).

The assumptions, printed beside the figures (:data:`ASSUMPTIONS`): communication does not
overlap compute (frameworks overlap some, so a predicted step is an upper bound); each rank's
compute stays as measured at the largest N probed (on a CPU host, ranks share its cores); more
ranks talk over a link like the one measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import messages

#: printed beside every prediction
ASSUMPTIONS = (
    "ring all-reduce of the gradient bytes at the measured bus bandwidth and latency",
    "communication does not overlap compute (a predicted step is an upper bound)",
    "each rank's compute and input time stay as measured at the largest N probed",
    "the same per-rank batch at every N; more ranks talk over a link like the one measured "
    "(across hosts, the link between them: a ring's slowest hop)",
)

#: a step that is at least this much communication is communication-bound (the threshold an
#: Ascend profiler's advice uses for its wait ratio)
COMM_BOUND = 0.2
#: strategies whose cells give the global batch (the probe keeps the per-rank batch)
GLOBAL_BATCH = ("multiworker", "mirrored", "sharded")
#: a speed-up below this many times is "more ranks will not help"
WORTH_IT = 1.1
#: an N-rank step longer than the 1-rank one by more than this many times what the link's
#: all-reduce explains (and CONTENTION_S more) is the ranks slowing each other, not the link
CONTENTION = 3.0
CONTENTION_S = 0.002


@dataclass(frozen=True)
class Link:
    """The engines' link as measured: bus bandwidth (bytes/s) and latency per ring step (s)."""

    bandwidth: float
    latency: float
    ranks: int
    hosts: int = 1
    #: fitted from the probe's steps (the kernel's devices), not timed between engines
    fitted: bool = False
    #: what timed it (:data:`kdist_magics.scale.link.HOROVOD` or ``RING``); "" when not timed
    via: str = ""

    def allreduce(self, nbytes: float, n: int) -> float:
        """Seconds for a ring all-reduce of ``nbytes`` over ``n`` ranks."""
        if n <= 1:
            return 0.0
        return 2 * (n - 1) / n * nbytes / self.bandwidth + 2 * (n - 1) * self.latency


def link_from(times_big: float, nbytes: int, times_small: float, n: int, hosts: int = 1) -> Link:
    """A :class:`Link` from the seconds of an all-reduce of ``nbytes`` and of a tiny one
    (its latency) over ``n`` ranks."""
    # On a loaded host the tiny all-reduce can take as long as the big one (a scheduler's
    # delay, not the link): the latency then cannot be told apart from the bytes' time, so it is
    # held to half the big one's, and the bandwidth is at most twice bytes / the whole time,
    # never bytes / nothing (CI read 4e15 B/s once when it was not held).
    steps = 2 * (n - 1)
    times_big = max(times_big, 1e-9)
    latency = min(times_small, times_big / 2) / steps
    moving = times_big - steps * latency
    return Link(bandwidth=steps / n * nbytes / moving, latency=latency, ranks=n, hosts=hosts)


def link_fitted(communication: dict[int, float], nbytes: float, n: int) -> Link:
    """The link that explains the communication measured at each N > 1 (the kernel's devices,
    where no engines can time an all-reduce): ``comm(N) = 2 (N - 1) / N * G / B + 2 (N - 1) * a``
    fitted by least squares with ``1/B`` and ``a`` at least 0 (one N: ``a`` = 0). No
    communication at all is an infinite bandwidth (the predictions add none)."""
    points = [(2 * (k - 1) / k * nbytes, 2 * (k - 1), max(c, 0.0)) for k, c in communication.items() if k > 1]

    def one(i):  # least squares with only the byte term (i = 0) or only the latency term (i = 1)
        den = sum(p[i] ** 2 for p in points)
        return sum(p[i] * p[2] for p in points) / den if den else 0.0

    inv_b, a = one(0), 0.0
    if len({p[1] for p in points}) > 1:  # two N or more: both terms
        sxx = sum(p[0] ** 2 for p in points)
        syy = sum(p[1] ** 2 for p in points)
        sxy = sum(p[0] * p[1] for p in points)
        sxc = sum(p[0] * p[2] for p in points)
        syc = sum(p[1] * p[2] for p in points)
        det = sxx * syy - sxy**2
        if det > 0:
            inv_b, a = (syy * sxc - sxy * syc) / det, (sxx * syc - sxy * sxc) / det
            if a < 0:
                inv_b, a = one(0), 0.0
            elif inv_b < 0:
                inv_b, a = 0.0, one(1)
    bandwidth = 1 / inv_b if inv_b > 0 else float("inf")
    return Link(bandwidth=bandwidth, latency=a, ranks=n, hosts=1, fitted=True)


@dataclass(frozen=True)
class Row:
    """One N of the table: measured by the probe, or predicted by the model."""

    n: int
    samples_per_s: float
    step_s: float
    compute_s: float | None
    communication_s: float | None
    rest_s: float | None
    speedup: float = 1.0
    efficiency: float = 1.0
    measured: bool = True

    @property
    def communication_share(self) -> float | None:
        if self.communication_s is None or not self.step_s:
            return None
        return self.communication_s / self.step_s


def predict(
    n: int, compute: float, rest: float, batch: int, grad_bytes: float, link: Link, base_samples_per_s: float
) -> Row:
    """The model's row for ``n`` ranks (see the module doc)."""
    comm = link.allreduce(grad_bytes, n)
    step = compute + rest + comm
    sps = n * batch / step
    return Row(
        n=n,
        samples_per_s=sps,
        step_s=step,
        compute_s=compute,
        communication_s=comm,
        rest_s=rest,
        speedup=sps / base_samples_per_s,
        efficiency=sps / base_samples_per_s / n,
        measured=False,
    )


def more_hosts(
    link: Link, ranks: int, compute: float, rest: float, batch: int, grad_bytes: float, base_samples_per_s: float
) -> list[tuple[int, Row]]:
    """Rows for 2 and 4 times the hosts the probe's ``ranks`` spanned, as many ranks on each,
    where ``link`` was measured between hosts (else none). A ring across hosts runs at its
    slowest hop, the link between hosts (a link within a host is faster), so N ranks over H
    hosts all-reduce as N ranks over the measured link."""
    if link.hosts <= 1 or link.fitted:
        return []
    per_host = max(ranks // link.hosts, 1)
    return [
        (h, predict(h * per_host, compute, rest, batch, grad_bytes, link, base_samples_per_s))
        for h in (link.hosts * 2, link.hosts * 4)
    ]


def with_speedup(row: Row, base_samples_per_s: float) -> Row:
    from dataclasses import replace

    speedup = row.samples_per_s / base_samples_per_s
    return replace(row, speedup=speedup, efficiency=speedup / row.n)


def advice(rows: list[Row], batch: int | None, grad_bytes: float, link: Link, horovod: bool) -> list[str]:
    """What the figures say, each suggestion with the figure behind it (``%kdist advise`` and
    ``--strategy auto`` quote these). ``batch`` None: not known (the rows count batches)."""
    if not rows:
        return []
    known = batch is not None
    batch = batch or 1
    measured = [r for r in rows if r.measured]
    top = max(measured, key=lambda r: r.n)
    base = next((r for r in rows if r.n == 1), None)
    out = []
    share = top.communication_share
    link_s = link.allreduce(grad_bytes, top.n)
    contention = (
        share is not None
        and share >= COMM_BOUND
        and top.communication_s is not None
        and top.communication_s > CONTENTION * link_s + CONTENTION_S
    )
    if contention:
        out.append(messages.contention(top.n, top.communication_s, link_s, top.speedup))
    elif share is not None and top.n > 1:
        kind = "communication-bound" if share >= COMM_BOUND else "compute-bound"
        out.append(
            f"{kind}: {share:.0%} of a step is all-reduce at {top.n} ranks "
            f"(speed-up {top.speedup:.2f}x, efficiency {top.efficiency:.0%})"
        )
    if top.n > 1 and max(r.speedup for r in rows) < WORTH_IT:
        out.append(
            f"more ranks will not help this model here ({top.n} ranks give "
            f"{top.speedup:.2f}x): use 1 and a bigger batch"
        )
        return out
    more = [r for r in rows if not r.measured and r.n > top.n]
    if more:
        r = more[0]
        out.append(f"{r.n} ranks would give ~{r.speedup:.1f}x (predicted)")
    if share is not None and share >= COMM_BOUND and top.compute_s and base and not contention:
        bigger = predict(
            top.n, top.compute_s * 2, top.rest_s or 0.0, batch * 2, grad_bytes, link, base.samples_per_s
        )  # the step's compute grows with the batch
        twice = f"a per-rank batch of {batch * 2}" if known else "twice the per-rank batch"
        at = f"at batch {batch}" if known else "at today's batch"
        out.append(
            f"{twice} would give ~{bigger.speedup:.1f}x at {top.n} ranks over 1 rank "
            f"{at} (predicted: the step's compute grows with the batch, its all-reduce "
            f"does not)"
        )
        if horovod:
            half = predict(top.n, top.compute_s, top.rest_s or 0.0, batch, grad_bytes / 2, link, base.samples_per_s)
            out.append(
                f"fp16 gradient compression (hvd.DistributedOptimizer(..., "
                f"compression=hvd.Compression.fp16)) would give ~{half.speedup:.1f}x at "
                f"{top.n} ranks (predicted: half the bytes)"
            )
    return out
