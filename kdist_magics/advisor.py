"""Choosing a strategy (``--strategy auto``, ``%kdist advise``).

Interim rule until the advisor lands: run in the kernel with TF's default strategy.
"""

from __future__ import annotations

from typing import Any


def choose(user_ns: dict[str, Any], spec) -> tuple[str, str]:
    return "default", "the advisor is not built yet, so auto runs the cell with the default strategy"


def advise(user_ns: dict[str, Any], spec):
    print("kdist advise: the advisor is not built yet; --strategy auto uses 'default' meanwhile")
