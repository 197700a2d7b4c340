"""psutil 5.9 to 7: the one call the cluster makes whose name changed."""

from __future__ import annotations

from typing import Any


def net_connections(process: Any, kind: str = "inet") -> list:
    """``psutil.Process.net_connections(kind)``; its older name ``connections`` on psutil < 6.0.

    psutil 6.0.0 (June 2024) renamed ``Process.connections`` to ``net_connections``
    (giampaolo/psutil#2201); Colab ships psutil 5.9.5.
    """
    method = getattr(process, "net_connections", None) or process.connections
    return method(kind)
