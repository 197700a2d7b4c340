"""``%kdist restart``: stop everything, as ``stop`` does; the next cell starts new engines."""

from __future__ import annotations

from ..messages import say


def run(magics, rest: str) -> None:
    names = list(magics._strategies)
    magics.close()
    say(f"restarted ({', '.join(names) or 'nothing was running'}); engines start again with the next cell")
