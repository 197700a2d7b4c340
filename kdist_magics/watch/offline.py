"""A finished run's dashboard as one self-contained piece of HTML.

When a run ends, its widget is closed and its output becomes this view, so a saved notebook, an
HTML export (``jupyter nbconvert --to html``, executed or not), GitHub and nbviewer all show the
same picture with nothing loaded from the web:

- where the page runs scripts (JupyterLab, Notebook 7 and 6, VS Code, Colab, an exported HTML
  file), the live widget's own front end (``static/dashboard.js``, inlined with its CSS) draws
  the final state: log and smoothing toggles, the hover read-out, badges, the step split;
- where it does not (GitHub, a notebook reopened untrusted), :func:`~.svg.static_summary`'s
  plain SVG and table stay, which the script hides once it has drawn.
"""

from __future__ import annotations

import functools
import json
import math
import re
import uuid
from pathlib import Path
from typing import Any

from .svg import static_summary

#: the widget's front end (the same folder :class:`.widget.DashboardWidget` loads)
STATIC = Path(__file__).parent / "static"

#: the widget's module, run by a classic inline script: ``model`` is the final state, read-only
_RUNNER = """(function () {
  var id = "$ID", tries = 0;
  function start() {
    var box = document.getElementById(id);
    if (!box) { if (tries++ < 100) setTimeout(start, 50); return; }
    if (box.dataset.drawn) return;
    box.dataset.drawn = "1";
    var data = JSON.parse(box.querySelector("script.kdist-data").textContent);
    var curves = JSON.stringify(data.curves);
    var model = { get: function (k) { return k === "state" ? data.state : curves; },
                  on: function () {}, off: function () {} };
$MODULE
    render({ model: model, el: box.querySelector(".kdist-drawn") });
    box.querySelector(".kdist-static").style.display = "none";
  }
  start();
})();"""


@functools.lru_cache(maxsize=1)
def _module() -> str:
    """static/dashboard.js without its ``export`` words (a classic script cannot export)."""
    js = (STATIC / "dashboard.js").read_text()
    js = re.sub(r"^export default .*$", "", js, flags=re.M)
    js = re.sub(r"^export (?=function|const|let|class)", "", js, flags=re.M)
    if "</script" in js.lower():  # it would end the inline script early
        raise ValueError("static/dashboard.js holds '</script'")
    return js


@functools.lru_cache(maxsize=1)
def _css() -> str:
    return (STATIC / "dashboard.css").read_text()


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (``JSON.parse`` takes neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json(value: Any) -> str:
    """JSON that cannot end the ``<script>`` it sits in (``<``, ``>`` and ``&`` escaped)."""
    text = json.dumps(_finite(value), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def finished_view(state: dict[str, Any], curves: dict[str, Any]) -> str:
    """The finished run's output: the drawn view where scripts run, the static summary where not."""
    box = f"kdist-offline-{uuid.uuid4().hex}"  # unique across kernels a notebook has had
    return "\n".join(
        [
            f'<div class="kdist-offline" id="{box}">',
            f"<style>{_css()}</style>",
            f'<script type="application/json" class="kdist-data">{_json({"state": state, "curves": curves})}</script>',
            '<div class="kdist-drawn"></div>',
            static_summary(state, curves),
            f"<script>{_RUNNER.replace('$ID', box).replace('$MODULE', _module())}</script>",
            "</div>",
        ]
    )
