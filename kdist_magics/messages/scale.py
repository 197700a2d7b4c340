"""The words of ``%kdist scale`` (re-exported by :mod:`kdist_magics.messages`)."""

from __future__ import annotations


def scale_cannot_probe(strategy: str) -> str:
    why = {
        "default": "it trains on one device, so there is no N to vary",
        "tpu": "TPUStrategy takes every core of the TPU at once (on JAX, --strategy mirrored probes the TPU's cores)",
        "sharded": "sharded across engine processes (--np) is not probed; probe it on the "
        "kernel's devices (--devices N)",
    }.get(strategy, "it has no ranks to vary")
    return (
        f"%kdist scale probes a cell's training over N = 1, 2, ... ranks: engines (--strategy "
        f"horovod or multiworker) or the kernel's devices (mirrored, sharded); not {strategy}: "
        f"{why}. Nothing ran"
    )


def scale_one_device(strategy: str, devices: int) -> str:
    return (
        f"%kdist scale --strategy {strategy}: {devices} device{'s' if devices != 1 else ''} "
        f"here ({'a mesh with a data axis of 1' if strategy == 'sharded' else 'one replica'}), "
        f"so there is no N above 1 to probe; give --devices 2 or more. Nothing ran"
    )


def scale_fewer_engines(asked: int, have: int, where: str) -> str:
    return (
        f"%kdist scale --np {asked}: {where} has {have} engine{'s' if have != 1 else ''}; "
        f"probing N = 1 to {have}, and larger N are predicted"
    )


def scale_all_engines(have: int, where: str) -> str:
    return (
        f"%kdist scale: {where} has {have} engines; probing N = 1 to {have} over all of them "
        f"(--np N probes fewer), and larger N are predicted"
    )


def scale_too_few_engines(asked: int, have: int, where: str) -> str:
    return (
        f"%kdist scale --np {asked}: {where} has {have} engine{'s' if have != 1 else ''}, "
        f"and the probe needs 2 at least (1 rank and 2 ranks, and the link between them). "
        f"Nothing ran"
    )


def scale_attached_once(backend: str, where: str) -> str:
    framework = {"tensorflow": "TensorFlow's MultiWorkerMirroredStrategy", "jax": "jax.distributed.initialize"}[backend]
    return (
        f"%kdist scale --strategy multiworker on {where}: {framework} sets up its workers "
        f"once per process, and the probe needs them at N = 1, 2, ... in turn, which means "
        f"restarting engines kdist did not start. Probe on kdist's own engines (the same line "
        f"without --cluster-id), or with Keras on PyTorch or --strategy horovod here. Nothing ran"
    )


#: the one line after Stop during %kdist scale outside a run (between runs, or timing the link)
SCALE_INTERRUPTED = "Stop: %kdist scale was cut short; it made no table, and nothing of it still runs"


#: how the table names a link fitted from the kernel's devices, where there are no engines to time
LINK_FITTED = "link fitted from the measured steps (the kernel's devices: no engines to time)"
LINK_NONE = "no communication measured between the kernel's devices"


def scale_trained_nothing(what: str) -> str:
    return (
        f"%kdist scale: the cell {what} (the probe times a few steps of model.fit on each "
        f"rank after 3 warm-up steps: give it a cell that calls fit for at least 6 steps)"
    )


SCALE_NOTHING_TRAINED = (
    "%kdist scale: no %%kdist cell has trained in this kernel yet; run one, "
    "or give the probe a cell of its own: %%kdist scale --strategy "
    "multiworker --np 2"
)


def scale_quoted(strategy: str, batch: int | None, cost: float) -> str:
    said = batch if batch is not None else BATCH_UNKNOWN
    return (
        f"measured by %kdist scale ({strategy}, per-rank batch {said}, {cost:.0f} s; "
        f"kdist_magics.last_scale() has the table):"
    )


#: the probe's batch where fit was given data whose batch kdist cannot read (never guessed)
BATCH_UNKNOWN = (
    "not known (fit was given data whose batch kdist cannot read without "
    "touching it: figures are batches/s, not samples/s)"
)


#: why a run's rows carry no step timing (Keras on JAX): the split's source and the dashboard's note
SPLIT_UNTIMED = (
    "not timed live: Keras on JAX runs batch ends late, on a thread pool; %kdist scale's table has the split"
)
#: the step split's name in the dashboard's static view and before a reason it has none
SPLIT_TITLE = "step split"
#: where the collective cannot be timed where it runs (MultiWorkerMirroredStrategy's collective
#: ops, XLA's, NCCL's, which returns before the transfer ends): said with every split there
NOT_SEPARABLE = "the collective is not separable live here"
#: how the probe's table has its communication column, printed under it
SCALE_COMM_INFERRED = (
    "communication is inferred, not timed: a measured N-rank step less the "
    "1-rank step (the collective, the wait for slower ranks, and on shared "
    "cores their slower compute); the dashboard times it live where kdist "
    "issues the collective (horovod; Keras on PyTorch on the CPU)"
)
#: the split's source once %kdist scale has probed this cell with this strategy
SPLIT_PROBED = f"telemetry and %kdist scale's 1-rank step (communication inferred: {NOT_SEPARABLE})"
#: the split's source where the collective is timed where it runs (kdist's Horovod binding)
SPLIT_TIMED = "telemetry and the all-reduce timed on every rank"
#: ... and before: compute and communication are one figure inside a step
SPLIT_LIVE = f"telemetry ({NOT_SEPARABLE}; run %kdist scale to split compute from communication)"
#: ... and where %kdist scale probed the cell, but not as this run trains it
SPLIT_OTHER_RUN = (
    "telemetry (%kdist scale probed this cell at another --np, batch or Keras "
    "backend: its compute does not describe this run; probe it as it runs now)"
)
#: the dashboard's legend of a rank's step split
SPLIT_LEGEND_PROBED = (
    "each rank's mean step: compute (its 1-rank step, from %kdist scale), "
    "communication (inferred: the step less that, the gradient collective and "
    f"the wait for slower ranks; {NOT_SEPARABLE}), the rest (input, callbacks)"
)
SPLIT_LEGEND_TIMED = (
    "each rank's mean step: compute, communication (the all-reduce, timed on "
    "every rank: the least any rank spent in it), the wait for slower ranks "
    "(the rest of its own), the rest (input, callbacks)"
)
SPLIT_LEGEND_LIVE = (
    "each rank's mean step: inside the step (compute and the gradient collective "
    f"together, {NOT_SEPARABLE}: %kdist scale splits them), the rest (input, "
    "callbacks)"
)


def auto_from_probe(strategy: str, n: int, speedup: float, share: float | None) -> str:
    said = f", {share:.0%} of a step all-reduce" if share is not None else ""
    return f"measured by %kdist scale on this cell: {n} ranks of {strategy} give {speedup:.2f}x over 1{said}"


def auto_not_worth_it(strategy: str, n: int, speedup: float) -> str:
    return (
        f"measured by %kdist scale on this cell: {n} ranks of {strategy} give only "
        f"{speedup:.2f}x over 1, so more ranks will not help this model here (one rank; "
        f"a bigger batch is the cheaper speed-up)"
    )


def contention(n: int, extra: float, link: float, speedup: float) -> str:
    return (
        f"the ranks slow each other down: at {n} ranks a step takes {extra * 1000:.1f} ms "
        f"more than at 1, of which the measured link's all-reduce explains "
        f"{link * 1000:.1f} ms (speed-up {speedup:.2f}x): they share cores, memory bandwidth "
        f"or a device, or one rank is slower; the predicted rows assume ranks on devices of "
        f"their own"
    )


def more_hosts_said(rows, ranks: int, hosts: int) -> str:
    """The table's line on more hosts: its predictions (``rows``: (hosts, row)), or why none."""
    if not rows:
        return (
            f"more hosts: not predicted: the {ranks} ranks probed shared one host, so no link "
            f"between hosts was measured (probe a cluster whose engines span hosts: --cluster-id)"
        )
    per = ranks // hosts or 1
    said = ", ".join(f"{h} hosts ~{r.speedup:.2f}x ({r.samples_per_s:,.0f}/s)" for h, r in rows)
    return (
        f"more hosts, {per} rank{'s' if per > 1 else ''} each, over the link between hosts as "
        f"measured ({hosts} hosts): {said} (predicted)"
    )
