"""``%kdist scale``: the training of a cell, probed at N = 1, 2, 4, ... ranks, the link measured,
larger N predicted (:mod:`.model`).

Each N is a run of the cell through the magics' one execute path, with no dashboard and no
output, whose every ``fit`` stops after :data:`STEPS` steps on every rank
(:mod:`kdist_magics.watch.step_probe`), with the same per-rank batch at every N (a strategy whose
cells give the global batch, multiworker, has its ``batch_size`` scaled). Per N: a rank's
seconds in a step, between steps (the rest) and per step (the period), medians over the ranks.
The split: *compute* is the 1-rank step (no collective), *communication* the N-rank step
less that (the gradient collective and the wait for the other ranks; on a host whose cores
the ranks share, their slower compute counts here too), the *rest* as measured.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from .. import messages
from ..errors import StrategyUnavailable
from ..spec import KINDS
from ..strategies.frameworks import backends
from ..watch.record import RunRecord
from . import link as linkmod
from .model import GLOBAL_BATCH, WORTH_IT, Row, advice, more_hosts, predict, with_speedup
from .table import ScaleTable

#: steps each rank runs per N (the first few, compilation, are left out of the figures)
STEPS = 20
#: strategies probed on the kernel's own devices: N = 1, 2, ... of them, in this process
IN_KERNEL = ("mirrored", "sharded")


def ranks_to_probe(top: int) -> list[int]:
    """1, 2, 4, ... below ``top``, and ``top``."""
    ns, n = [], 1
    while n < top:
        ns.append(n)
        n *= 2
    return ns + [top]


def scale(magics, spec, cell: str) -> ScaleTable:
    """``%kdist scale`` / ``%%kdist scale``: probe, keep the table as ``last_scale()``, and let
    the last run of the same cell split its steps with the probe's compute. Stop anywhere in it
    is one line (a run's own Stop keeps its words)."""
    from ..errors import Interrupted

    if spec.strategy == "auto":
        spec, _ = magics.choose(spec)
    try:
        table = probe(magics, spec, cell)
    except Interrupted:
        raise
    except KeyboardInterrupt:  # between runs: a cluster restarting, the figures, the link
        raise Interrupted(messages.SCALE_INTERRUPTED) from None
    magics.last_scale = table
    table.cell = cell
    last = magics.last_record
    if (
        last is not None
        and magics.last_trained
        and table.describes(last.strategy, magics.last_trained[1], last.size, backends.keras_backend())
    ):
        table.lend(last)  # last_run().split() splits its steps now
    return table


def probe(magics, spec, cell: str, steps: int = STEPS) -> ScaleTable:
    """Run the probe (see the module doc); the table, also ``kdist_magics.last_scale()``."""
    in_kernel = spec.strategy in IN_KERNEL and not spec.np
    if KINDS.get(spec.strategy) != "engines" and not in_kernel:
        raise StrategyUnavailable(messages.scale_cannot_probe(spec.strategy))
    if in_kernel:
        return _probe_devices(magics, spec, cell, steps)
    started = time.monotonic()
    top = _engines_to_probe(spec, spec.np or magics.np or 2)
    strategy = magics.strategy_object(spec.strategy)
    figures, record = {}, None
    for n in ranks_to_probe(top):
        scale = n / top if spec.strategy in GLOBAL_BATCH else None
        run_spec = replace(spec, np=n, dashboard=False, telemetry=True, out="none", tensorboard=None, checkpoint=None)
        record = RunRecord(spec.strategy, size=n, spec=run_spec, reason="kdist scale")
        magics.execute(strategy, cell, run_spec, record, probe=(steps, scale))
        figures[n] = _figures(record, n, spec.strategy)
    hosts = len({s.host for s in record.ranks.values() if s.host}) or 1
    grad = figures[top]["grad_bytes"]
    timed = [m for m in record.metrics if m.get("kind") == "probe" and m.get("link")]
    link = linkmod.from_ranks(list({m["rank"]: m for m in timed}.values()), top, hosts) or linkmod.measure(
        strategy.cluster, magics.worker_network, grad, hosts=hosts
    )
    return _table(spec.strategy, figures, link, grad, top, time.monotonic() - started)


def _engines_to_probe(spec, asked: int) -> int:
    """``asked``, or as many engines as an attached cluster (``--cluster-id``/``--profile``)
    has where that is fewer, or more and ``--np`` was not given (probed over them all); either
    said in one line. Fewer than 2 is one line and nothing runs."""
    if not spec.attach:
        return asked  # kdist starts as many as asked
    where = f"cluster {spec.cluster_id}" if spec.cluster_id else f"the cluster of profile {spec.profile}"
    if spec.strategy == "multiworker":
        if (backend := backends.keras_backend()) in ("tensorflow", "jax"):  # set up once per process
            raise StrategyUnavailable(messages.scale_attached_once(backend, where))
    have = _attached_engines(spec, asked)
    if have is not None and have > asked and "np" not in spec.given:
        messages.say(messages.scale_all_engines(have, where))
        return have  # what is there
    if have is None or have >= asked:
        return asked  # (not reachable: the run says why, as any run would)
    if have < 2:
        raise StrategyUnavailable(messages.scale_too_few_engines(asked, have, where))
    messages.say(messages.scale_fewer_engines(asked, have, where))
    return have


#: seconds an attached cluster is given to register the engines asked for before they are counted
ATTACHED_WAIT = 10


def _attached_engines(spec, asked: int) -> int | None:
    try:
        import ipyparallel as ipp

        kwargs = {k: v for k, v in (("cluster_id", spec.cluster_id), ("profile", spec.profile)) if v}
        client = ipp.Client(**kwargs)
        try:
            deadline = time.monotonic() + ATTACHED_WAIT  # engines may still be registering
            while len(client.ids) < asked and time.monotonic() < deadline:
                time.sleep(0.2)
            return len(client.ids)
        finally:
            client.close()
    except Exception:
        return None


def _probe_devices(magics, spec, cell: str, steps: int) -> ScaleTable:
    """mirrored and sharded: N = 1, 2, ... of the kernel's devices (sharded: of its data axis,
    the model axis kept), the largest first (TensorFlow and JAX fix their devices when they
    start: the first run makes them all), each run's output held back unless it fails; the link
    fitted from the steps (:func:`~.model.link_fitted`)."""
    from IPython.utils.capture import capture_output

    from .model import link_fitted

    started = time.monotonic()
    strategy = magics.strategy_object(spec.strategy)
    mesh = spec.mesh if spec.strategy == "sharded" else None
    if (mesh[0] if mesh else spec.devices or 2) < 2:
        raise StrategyUnavailable(messages.scale_one_device(spec.strategy, spec.devices or 1))

    def run(n: int | None, model_axis: int, scale: float) -> RunRecord:
        if n is None:  # the largest: the line's own devices and mesh (all of them where not given)
            run_spec = spec
        else:
            run_spec = replace(
                spec, devices=n * model_axis, mesh=(n, model_axis) if spec.strategy == "sharded" else None
            )
        run_spec = replace(run_spec, dashboard=False, telemetry=True, tensorboard=None, checkpoint=None)
        record = RunRecord(spec.strategy, size=strategy.size(run_spec), spec=run_spec, reason="kdist scale")
        with capture_output() as held:
            try:
                magics.execute(strategy, cell, run_spec, record, probe=(steps, scale))
            except BaseException:
                held.show()  # the failing run's own output and traceback, once
                raise
        return record

    record = run(None, 1, 1.0)
    used = sum(1 for state in record.ranks.values() if state.device)  # a replica per device
    top, model_axis = record.mesh if record.mesh else (used, 1)
    if top < 2:
        raise StrategyUnavailable(messages.scale_one_device(spec.strategy, top * model_axis))
    figures = {top: _figures(record, top, spec.strategy)}
    for n in ranks_to_probe(top)[:-1]:
        figures[n] = _figures(run(n, model_axis, n / top), n, spec.strategy)
    figures = dict(sorted(figures.items()))
    grad = figures[top]["grad_bytes"]
    comm = {n: f["step"] - figures[1]["step"] for n, f in figures.items() if n > 1}
    link = link_fitted(comm, grad, top)
    table = _table(spec.strategy, figures, link, grad, top, time.monotonic() - started)
    table.model_axis = model_axis
    table.predicted_from_one = {}  # the link was fitted to these very steps: no check
    return table


def _figures(record: RunRecord, n: int, strategy: str) -> dict:
    rows = [m for m in record.metrics if m.get("kind") == "probe"]
    usable = [r for r in rows if r.get("step_s") is not None and r.get("period_s")]
    if not usable:
        raise StrategyUnavailable(
            messages.scale_trained_nothing(
                "trained nothing" if not rows else f"trained {max(r['steps'] for r in rows)} steps"
            )
        )
    batch = usable[0]["batch_size"]  # None: fit was given data whose batch is not known
    per_rank = batch // n if batch and strategy in GLOBAL_BATCH else batch
    return {
        "step": statistics.median(r["step_s"] for r in usable),
        "period": statistics.median(r["period_s"] for r in usable),
        "rest": statistics.median(r["rest_s"] for r in usable),
        "batch": per_rank,
        "grad_bytes": usable[0].get("grad_bytes") or 0,
    }


def _table(strategy: str, figures: dict, link, grad: int, top: int, cost: float) -> ScaleTable:
    """The table from each N's figures. Where the batch is not known (``fit`` given a dataset
    whose batch kdist cannot read), the rows count batches, not samples (said, never guessed)."""
    one = figures[1]
    batch = one["batch"] or 1  # unknown: a batch counts as one
    compute1 = one["step"]
    base = batch / one["period"]
    rows = []
    for n, f in sorted(figures.items()):
        comm = max(f["step"] - compute1, 0.0) if n > 1 else 0.0
        rows.append(
            with_speedup(
                Row(
                    n=n,
                    samples_per_s=n * batch / f["period"],
                    step_s=f["period"],
                    compute_s=compute1,
                    communication_s=comm,
                    rest_s=f["rest"],
                ),
                base,
            )
        )
    last = figures[top]
    compute_top = max(last["step"] - link.allreduce(grad, top), 0.0) if top > 1 else compute1
    for n in (top * 2, top * 4):
        rows.append(predict(n, compute_top, last["rest"], batch, grad, link, base))
    hosts_rows = more_hosts(link, top, compute_top, last["rest"], batch, grad, base)
    from_one = {n: predict(n, compute1, one["rest"], batch, grad, link, base).step_s for n in figures if n > 1}
    table = ScaleTable(
        strategy,
        rows,
        link,
        grad,
        one["batch"],
        predicted_from_one=from_one,
        cost_s=cost,
        backend=backends.keras_backend(),
        hosts_rows=hosts_rows,
    )
    table.advice = advice(rows, one["batch"], grad, link, horovod=strategy == "horovod")
    return table


def choose_measured(table: ScaleTable, spec):
    """``--strategy auto`` on a cell ``%kdist scale`` probed: (spec, why) from the measured
    rows, or None (the rules decide) where no N > 1 was measured. The probed strategy at its
    best measured N where that pays (``--np`` kept where it was given); else one device:
    ``default`` in the kernel where the line allows it, or one rank of the probed strategy
    where the cell needs engines (a Horovod cell, ``--push``, ``--np`` and the like)."""
    from IPython.core.error import UsageError

    measured = [r for r in table.rows if r.measured and r.n > 1]
    if not measured:
        return None
    best = max(measured, key=lambda r: r.speedup)

    def at(n: int):  # the probed strategy at n ranks, where the line left their number open
        if not table.link.fitted:
            return spec if "np" in spec.given else replace(spec, np=n)
        if {"devices", "mesh"} & spec.given:
            return spec
        m = table.model_axis
        return replace(spec, devices=n * m, mesh=(n, m) if table.strategy == "sharded" else None)

    if best.speedup >= WORTH_IT:
        why = messages.auto_from_probe(table.strategy, best.n, best.speedup, best.communication_share)
        return at(best.n).with_strategy(table.strategy), why
    why = messages.auto_not_worth_it(table.strategy, best.n, best.speedup)
    one_device = table.strategy == "horovod" or table.model_axis > 1  # (a model split over M)
    tries = [] if one_device else [lambda: spec.with_strategy("default")]
    tries.append(lambda: at(1).with_strategy(table.strategy))
    for attempt in tries:
        try:
            return attempt(), why
        except UsageError:  # an option the first choice does not take
            continue
    return None


def quote(table: ScaleTable) -> None:
    """``%kdist advise`` after a probe: the measured figures and what they say, before the rules."""
    messages.say(messages.scale_quoted(table.strategy, table.batch, table.cost_s))
    for line in table.advice:
        messages.say("  " + line)
