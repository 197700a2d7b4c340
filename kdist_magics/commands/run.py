"""``%kdist run [kdist options] script.py [script args]``: an existing script on every rank as
``__main__`` (:mod:`..strategies.multiworker.run_script`), through the one execute path."""

from __future__ import annotations


def run(magics, rest: str):
    from ..strategies.multiworker.run_script import script_cell

    found = script_cell(rest, parse=magics.parse, user_ns=magics.shell.user_ns)
    if found is not None:
        return magics.kdist(*found)
