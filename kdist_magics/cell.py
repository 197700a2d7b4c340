"""The one path a ``%%kdist`` cell takes once its options are parsed, its strategy chosen and
its record made: the run itself, its record finished whatever happens (:func:`execute`).
:class:`~kdist_magics.magics.KDist` calls it; ``%kdist run`` and ``%kdist scale``'s probe
runs come through here too."""

from __future__ import annotations

from .cluster import namespace
from .errors import CellFailed, KDistError, StrategyUnavailable
from .messages import EXPOSED, NOT_RUN, PHASE_CELL, say, shared_host
from .strategies.base import RunOptions
from .watch.record import RunRecord
from .watch.tf_logs import quiet_info


def say_sharing(magics, strategy) -> None:
    """Once per kernel, before the first cluster kdist starts: which other users here could
    reach what the engines listen on (none where they get a network of their own)."""
    if magics._sharing_said or not getattr(strategy, "exposure", None):
        return
    magics._sharing_said = True
    why = namespace.unavailable() if magics.private_network else None
    if why or not magics.private_network:
        from .cluster.peers import other_users

        uids = other_users()
        if uids:
            say(shared_host(uids, EXPOSED[strategy.exposure], why), warn=True)


def execute(magics, strategy, cell: str, spec, record: RunRecord, probe: tuple[int, float | None] | None = None):
    """Run ``cell`` with ``strategy``; ``record`` ends "done", or as the failure says."""
    from .strategies import RunContext

    ctx = RunContext(shell=magics.shell, spec=spec, record=record, options=RunOptions.of(magics), probe=probe)
    if strategy.in_kernel:
        record.phase(PHASE_CELL)  # engine strategies name their own phases
    elif not spec.attach:
        say_sharing(magics, strategy)
    try:
        with quiet_info(not magics.tf_info_logs, stderr=strategy.in_kernel):  # set-up's too
            value = strategy.run(cell, ctx)
    except CellFailed as exc:
        status = getattr(exc, "status", "failed")  # "timeout", "interrupted": in the kernel
        if strategy.in_kernel:
            state = "stopped" if status == "interrupted" else "failed"
            for rank in record.ranks:
                record.set_rank(rank, state=state, error=str(exc))
        record.finish(status, str(exc))
        raise
    except KeyboardInterrupt:
        record.finish("interrupted", "interrupted")
        raise
    except StrategyUnavailable as exc:  # "The cell did not run.": no dashboard stays
        record.finish(NOT_RUN, str(exc))
        raise
    except KDistError as exc:
        record.finish(getattr(exc, "status", "failed"), str(exc))
        raise
    except BaseException as exc:
        record.finish("failed", f"{type(exc).__name__}: {exc}")
        raise
    record.finish("done")
    return value
