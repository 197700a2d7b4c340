"""Exceptions kdist raises at the user, each rendered the way IPython renders a local error."""

from __future__ import annotations


class KDistError(Exception):
    """Base class of kdist's own errors: a short message, no kdist traceback."""

    def _render_traceback_(self):
        # IPython calls this instead of formatting our frames: the user sees what
        # went wrong in their terms, not the magic's internals.
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class StrategyUnavailable(KDistError):
    """The chosen strategy cannot run here (no TPU, Horovod missing, ...)."""


class CellFailed(KDistError):
    """The cell's own code raised; its traceback has already been shown.

    ``original`` is the user's exception (also ``__cause__``). Rendering this
    error adds nothing, so the notebook shows the user's traceback once and the
    cell is still marked as failed.
    """

    def __init__(self, original: BaseException):
        super().__init__(f"{type(original).__name__}: {original}")
        self.original = original

    def _render_traceback_(self):
        return []
