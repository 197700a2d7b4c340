"""The dashboard's widget: an ``anywidget.AnyWidget`` whose front end is one small static ES
module and a CSS file in ``kdist_magics/watch/static`` (plain SVG, no CDN, no labextension
build), so it runs wherever anywidget runs: JupyterLab 4, Notebook 7, VS Code, Colab.
:class:`~.dashboard.Dashboard` fills its traits."""

from __future__ import annotations

import anywidget
import traitlets

from .offline import STATIC


class DashboardWidget(anywidget.AnyWidget):
    """Front end: ``static/dashboard.js`` renders ``state`` and ``curves``."""

    _esm = STATIC / "dashboard.js"
    _css = STATIC / "dashboard.css"
    #: run status, progress and one entry per rank
    state = traitlets.Dict().tag(sync=True)
    #: JSON text of {"series": {name: {rank: [[step, value], ...]}}, "names": [...]}: one
    #: string, because ipywidgets walks nested lists element by element looking for buffers
    curves_json = traitlets.Unicode("{}").tag(sync=True)
