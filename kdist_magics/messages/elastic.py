"""The words of an elastic Horovod run (``--min-np``, ``--max-np``): ranks lost and joined, the
world's size before and after, for the printed line, ``last_run().summary()`` and the dashboard."""

from __future__ import annotations


def world_resized(before: int, after: int) -> str:
    """An elastic run's size change, as the summary, the dashboard and the progress line say it."""
    return f"world size {before} \u2192 {after}"


def went_on_without(lost: dict[int, str], size: int, before: int) -> str:
    """The line kdist prints when an elastic run re-forms without ranks ``lost`` ({rank: how})."""
    what = "; ".join(f"rank {r} {how}" for r, how in sorted(lost.items()))
    return (
        f"{what}: going on with {size} ranks ({world_resized(before, size)}) from the last "
        f"commit; the next cell starts a full set of engines"
    )


def too_few_left(size: int, min_np: int) -> str:
    return f"only {size} ranks left, fewer than --min-np {min_np}"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)}"


def resized_summary(before: int, after: int, resizes: list[dict]) -> str:
    """What an elastic run's size changes were, for ``last_run().summary()``."""
    gone = sorted(r for e in resizes for r in e["lost"])
    came = sorted(r for e in resizes for r in e.get("added", []))
    what = [f"lost {_ranks(gone)}"] * bool(gone) + [f"{_ranks(came)} joined"] * bool(came)
    return f"{world_resized(before, after)} ({'; '.join(what)})"


def resized_note(before: int, resizes: list[dict]) -> str:
    """The dashboard's line for an elastic run whose size changed."""
    gone = sorted(r for e in resizes for r in e["lost"])
    came = sorted(r for e in resizes for r in e.get("added", []))
    parts = [f"{_ranks(gone)} lost; the others went on from the last commit"] * bool(gone)
    parts += [f"{_ranks(came)} joined at a commit"] * bool(came)
    return f"elastic: {world_resized(before, resizes[-1]['size'])}, " + "; ".join(parts)
