"""Results back from the ranks after the cell: ``--pull`` and the cell's last value.

Both come from rank 0. A strategy with ``collective_values`` (JAX: saving a model whose
variables span the processes is a collective) runs the same call on every rank, dropping the
others' results, since rank 0 alone would wait for them for ever. The waits watch the engines
and the controller (:mod:`.waiting`): a death while the values come back is named, and the
cell is said to have run.
"""

from __future__ import annotations

from typing import Any

from ...errors import KDistError
from . import waiting

DURING = "after the cell, while its values came back"


def from_rank0(run, by_rank: dict, fn, *args) -> Any:
    """``fn(*args)`` on ``run``'s rank 0 (on every rank where its strategy has
    ``collective_values``), its result."""
    cluster = run.cluster
    if not run.strategy.collective_values:  # only rank 0 matters (another's death: the next cell)
        lead = {by_rank[0].engine_id: 0}
        with waiting.named_deaths(run, lead, DURING, ran=True):
            ar = cluster.client[by_rank[0].engine_id].apply_async(fn, *args)
        return waiting.gather(run, [ar], lead, None, DURING, ran=True)[0]
    ranks = {e.engine_id: rank for rank, e in by_rank.items()}
    with waiting.named_deaths(run, ranks, DURING, ran=True):
        ars = {rank: cluster.client[e.engine_id].apply_async(fn, *args) for rank, e in by_rank.items()}
    try:
        return waiting.gather(run, [ars[0]], ranks, None, DURING, ran=True)[0]
    finally:  # the others' part of the collective; none worth waiting for once one died
        for ar in ars.values():
            ar.wait(timeout=60 if run.restart is None else 0)


def pull(run, by_rank: dict, result_content) -> Any:
    """Bind ``run``'s ``--pull`` names in the notebook; the cell's value (rank 0's), or None."""
    from ipyparallel.error import RemoteError

    from ...rank import values

    ctx = run.ctx
    if ctx.spec.pull:
        try:
            packed = from_rank0(run, by_rank, values.fetch, list(ctx.spec.pull))
        except RemoteError as exc:
            raise KDistError(f"--pull: {exc.evalue.strip(chr(34)).strip(chr(39))}") from None
        for name, item in packed.items():  # a Keras model may start TensorFlow: quietly, by
            ctx.shell.user_ns[name] = values.unpack(item)  # watch/tf_logs.py's import hook
    if result_content is None:
        return None
    try:
        return values.unpack(from_rank0(run, by_rank, values.last_value, result_content.get("execution_count")))
    except KDistError:  # rank 0 or the controller ended: say so, not a stale rendering
        raise
    except Exception:
        # not picklable: show rank 0's rendering of it instead
        from IPython.display import publish_display_data

        publish_display_data(result_content.get("data", {}), result_content.get("metadata") or {})
        return None
