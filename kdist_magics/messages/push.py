"""kdist's words for ``--push`` (strategies/engines/push.py). Imported through
:mod:`kdist_magics.messages`."""

from __future__ import annotations

#: what became of one pushed value, as the run's record and the dashboard say it
SHARED = "shared"  # one copy per host in shared memory, mapped by every engine there
SENT = "sent"  # a copy to each engine (small values; no room in /dev/shm; one engine on a host)
UNCHANGED = "unchanged, not sent"  # every engine holds it as the notebook does


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**28 else f"{nbytes / 2**20:,.0f} MiB"


def push_too_big(need: int, free: int, host: str | None = None, copies: int = 1) -> str:
    """A push whose copies on one host would not fit its free memory (``host`` None: this one)."""
    where = "this host" if host is None else f"host {host}"
    how = "one shared copy" if copies == 1 else f"{copies} copies (one per engine there)"
    return (
        f"--push: the values' arrays need {_gib(need)} on {where} ({how}), more than the "
        f"{_gib(free)} it has free; push less (or each rank reads its own files: see the "
        f"guide's data page). Nothing was sent"
    )


def push_no_shm_room(need: int, free: int) -> str:
    return (
        f"--push: /dev/shm has {free / 2**20:,.0f} MiB free, its arrays need "
        f"{need / 2**20:,.0f} MiB: each engine gets its own copy (a container's /dev/shm is "
        f"often 64 MiB: docker run --shm-size=8g makes room)"
    )


def push_report(outcomes: dict[str, str]) -> str:
    """``--push: x shared, y unchanged, not sent``: what became of each value, in push order."""
    return "--push: " + "; ".join(f"{name} {what}" for name, what in outcomes.items())
