"""``%kdist stop``: stop everything kdist started in this kernel."""

from __future__ import annotations

from ..messages import say


def run(magics, rest: str) -> None:
    magics.close()
    say("stopped everything kdist started")
