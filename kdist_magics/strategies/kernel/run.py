"""Running a cell in the notebook's own namespace, as a plain cell would run."""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any, ContextManager

from ...errors import CellFailed, CellInterrupted
from ..base import RunContext
from .limits import checkpoint_each_epoch, time_limit, timed_out
from .stop import stop_reaches_fit


def run_cell_here(
    cell: str, ctx: RunContext, scope: ContextManager | None = None, bind: dict[str, Any] | None = None
) -> Any:
    """Run ``cell`` in the user's namespace inside ``scope``.

    The cell goes through ``shell.run_cell``, so output, progress bars, the
    value of a last expression and tracebacks look exactly as in a plain cell.
    Names in ``bind`` (``strategy``) are set in the namespace first and stay
    there afterwards. When the cell raises, its traceback has been shown and
    :class:`CellFailed` marks the ``%%kdist`` cell as failed too. ``--timeout`` and
    ``--checkpoint`` work here as on engines (:mod:`.limits`).
    """
    shell = ctx.shell
    if bind:
        shell.user_ns.update(bind)
    here = {"host": socket.gethostname(), "pid": os.getpid()}  # every replica is this process
    for rank, state in list(ctx.record.ranks.items()):
        if state.pid is None:
            ctx.record.set_rank(rank, **here)
    with contextlib.ExitStack() as stack:
        if scope is not None:
            stack.enter_context(scope)
        if ctx.spec.telemetry:
            from ...watch.sampling import sampling
            from ...watch.telemetry import attached

            stop_after, batch_scale = ctx.probe or (None, None)  # %kdist scale's runs
            stack.enter_context(attached(ctx.record.add, rank=0, stop_after=stop_after, batch_scale=batch_scale))
            # replicas share this process: one sampler shows it (and each GPU it uses)
            stack.enter_context(sampling(ctx.record.add, rank=0, nice=ctx.options.helper_nice))
        stack.enter_context(checkpoint_each_epoch(ctx.spec.checkpoint))
        limit = stack.enter_context(time_limit(ctx.spec.timeout))
        stack.enter_context(stop_reaches_fit())  # a Stop that was swallowed is raised again
        result = shell.run_cell(cell, store_history=False, silent=False)
    error = result.error_before_exec or result.error_in_exec
    timeout = timed_out(error, limit)
    if timeout is not None:
        raise timeout from error
    if isinstance(error, KeyboardInterrupt):  # Stop: shown as a plain cell's; status interrupted
        raise CellInterrupted(error) from error
    if error is not None:
        raise CellFailed(error) from error
    return result.result
