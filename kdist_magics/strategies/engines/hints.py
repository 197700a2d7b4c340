"""What a rank's error means where the cause is in the notebook, said under it in one line.

A ``NameError`` on the ranks for a name the notebook has (and the run did not ``--push``) is
the engines not seeing the notebook's variables.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

_NAME_ERROR = re.compile(r"name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")


def missing_push(failures: Mapping[int, Any], user_ns: Mapping[str, Any], pushed) -> str | None:
    """The line naming ``--push NAME`` when every failing rank's error is a NameError for a
    name the notebook holds and the run did not push; None otherwise."""
    from ...messages import push_missing

    names = set()
    for err in failures.values():
        if getattr(err, "ename", type(err).__name__) != "NameError":
            return None
        found = _NAME_ERROR.search(str(getattr(err, "evalue", err)))
        if found is None:
            return None
        names.add(found.group(1))
    if len(names) != 1:
        return None
    name = names.pop()
    if name not in user_ns or name in (pushed or ()) or name.startswith("_"):
        return None
    return push_missing(name)
