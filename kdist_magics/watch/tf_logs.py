"""TensorFlow's Python INFO lines, quiet inside kdist cells unless asked for.

A ``MirroredStrategy`` fit logs dozens of INFO lines through the ``tensorflow`` logger
("Reduce to /job:localhost/... then broadcast to (...)", "Collective all_reduce tensors: ...")
in an interactive session (TF then sets its logger to INFO with a stdout handler, at its
first log call). They tell a user nothing, so for a kdist cell's duration a filter on that
logger drops records below WARNING; ``%config KDist.tf_info_logs = True`` keeps them.
Warnings and errors always show. A filter, not a level: TF sets the level itself when it
first logs, which may be inside the cell; it never touches filters. TensorFlow need not
be imported: the filter goes on the logger by name, which TF's own logger then is.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

LOGGER = "tensorflow"


def _warnings_and_above(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


@contextlib.contextmanager
def quiet_info(quiet: bool = True) -> Iterator[None]:
    """Within the block, the ``tensorflow`` logger passes WARNING and above only (when ``quiet``)."""
    if not quiet:
        yield
        return
    logger = logging.getLogger(LOGGER)
    logger.addFilter(_warnings_and_above)
    try:
        yield
    finally:
        logger.removeFilter(_warnings_and_above)
