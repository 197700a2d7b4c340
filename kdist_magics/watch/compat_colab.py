"""Colab: its front end shows third-party widgets (the dashboard) only once asked to."""

from __future__ import annotations


def colab_widgets_enabled() -> bool:
    """On Colab, turn on its custom widget manager (third-party widgets such as anywidget
    show only with it), once per kernel; True when this call turned it on.

    Colab's front end renders only its built-in widgets unless
    ``google.colab.output.enable_custom_widget_manager()`` was called (Colab's
    "Third-party Jupyter widgets" notes); nothing happens outside Colab. The "once" is
    remembered on Colab's own module, not in kdist.
    """
    import sys

    colab = sys.modules.get("google.colab")
    if colab is None or getattr(colab, "_kdist_widgets_on", False):
        return False
    colab._kdist_widgets_on = True
    try:
        colab.output.enable_custom_widget_manager()
    except Exception:
        return False
    return True
