"""``%kdist <command>``: one module per subcommand, each with ``run(magics, rest)``.

:func:`dispatch` reads the first word of the line and hands the rest, quoting kept, to that
module (imported when used). The commands and what they do, in the user's words, are
``messages.LINE_COMMANDS`` (what ``%kdist?`` shows).
"""

from __future__ import annotations

from importlib import import_module

from IPython.core.error import UsageError

from ..messages import LINE_COMMANDS


def dispatch(magics, line: str):
    """Run ``%kdist <command> <rest>`` for the :class:`~kdist_magics.magics.KDist` magics."""
    words = line.split()
    if not words or words[0] not in LINE_COMMANDS:
        raise UsageError(f"%kdist takes one of: {', '.join(LINE_COMMANDS)} (to run a cell distributed, use %%kdist)")
    command, rest = words[0], line.strip()[len(words[0]) :].strip()  # quoting kept (run)
    return import_module(f".{command}", __name__).run(magics, rest)
