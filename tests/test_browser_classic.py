"""Browser tier on Colab's front-end generation: the classic Notebook 6.5 with ipywidgets 7
(anywidget's nbextension), in headless Chromium. The live dashboard renders in the cell's
output, its curves gain points while training runs, and it ends "done".

Runs in the Colab-pinned environment (``make test``'s second run, marker ``classic``), where
``notebook`` is 6.5.7 and ``ipywidgets`` 7.7.1. Screenshots go to
``test-output/colab/dashboard-classic*.png``.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

import chromium
from test_browser import TRAIN, _notebook, assert_phases_and_devices, assert_readable_curves, check_curves, served

pytestmark = [pytest.mark.classic, pytest.mark.slow]


def _classic_notebook_or_skip():
    chromium.require()
    notebook = pytest.importorskip("notebook", reason="the classic Notebook is Colab's front end")
    ipywidgets = pytest.importorskip("ipywidgets")
    if not notebook.__version__.startswith("6.") or not ipywidgets.__version__.startswith("7."):
        pytest.skip(
            f"this test is for Notebook 6 with ipywidgets 7 (Colab's); here Notebook "
            f"{notebook.__version__}, ipywidgets {ipywidgets.__version__}"
        )


@pytest.fixture(scope="module")
def classic():
    _classic_notebook_or_skip()

    def command(port, token, home, root):
        return [
            sys.executable,
            "-m",
            "notebook",
            "--no-browser",
            "--NotebookApp.ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            f"--NotebookApp.token={token}",
            f"--NotebookApp.notebook_dir={root}",
        ]

    # the classic server asks to confirm a first ^C: a second one ends it
    with served("Notebook", command) as server:
        yield server


@pytest.fixture(scope="module")
def classic_run(classic, test_output):
    """One mirrored training run in the classic Notebook; what the page showed, step by step."""
    import nbformat
    from nbformat.sign import NotebookNotary

    name = "dash-classic.ipynb"
    nb = nbformat.reads(json.dumps(_notebook("%%kdist --strategy mirrored --devices 2\n" + TRAIN)), as_version=4)
    # signed, as a notebook its author saved is: an unsigned one becomes trusted at its first
    # autosave and the classic Notebook then re-renders its outputs
    NotebookNotary(data_dir=classic["data_dir"]).sign(nb)
    nbformat.write(nb, classic["root"] / name)
    page = classic["browser"].new_page(viewport={"width": 1300, "height": 1100})
    seen: dict = {"console": [], "first": None, "grown": None, "done": False, "final": None}
    page.on("console", lambda m: seen["console"].append(f"{m.type}: {m.text}"))
    try:
        page.goto(f"{classic['base']}/notebooks/{name}?token={classic['token']}", timeout=120_000)
        page.wait_for_function(
            "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel"
            " && Jupyter.notebook.kernel.is_connected()",
            timeout=180_000,
        )
        # widgetsnbextension restores the kernel's existing widgets once the page has connected
        # (with ipywidgets 7.7.1 by its fallback, one comm at a time) and clears what it
        # restores into: a widget made by a cell run before that finished vanished when the
        # cell ended (jupyter-widgets/ipywidgets#3770; seen here with a plain Label as well).
        # A person opens the notebook and then runs it; so does this test.
        deadline = time.time() + 60
        while (
            not any("fetching individual model state" in c or "update_states" in c for c in seen["console"])
            and time.time() < deadline
        ):
            time.sleep(0.25)
        time.sleep(3)
        page.evaluate("() => Jupyter.notebook.execute_cells([0, 1])")  # load_ext, training
        dash = page.locator(".kdist-dashboard").first
        dash.wait_for(timeout=300_000)
        seen["ranks"] = dash.locator(".kdist-rank").count()
        deadline = time.time() + 400
        while time.time() < deadline:  # the final update re-renders the view: poll, never hold one element
            if page.locator(".kdist-dashboard[data-status='done']").count():
                seen["done"] = True
                break
            if page.locator(".kdist-dashboard[data-status='failed']").count():
                break
            n = max(
                (
                    int(v or 0)
                    for v in page.locator(".kdist-dashboard").evaluate_all(
                        "els => els.map(e => e.getAttribute('data-points'))"
                    )
                ),
                default=0,
            )
            if n > 0 and seen["first"] is None:
                seen["first"] = n
                page.screenshot(path=str(test_output / "dashboard-classic-running.png"))
            elif seen["first"] is not None and n > seen["first"] and seen["grown"] is None:
                seen["grown"] = n
                page.screenshot(path=str(test_output / "dashboard-classic-grown.png"))
            time.sleep(0.2)
        page.wait_for_function("() => Jupyter.notebook.get_cell(1).input_prompt_number === 2", timeout=300_000)
        time.sleep(2)
        seen["final"] = page.locator(".kdist-dashboard").count()
        seen["final_status"] = page.locator(".kdist-dashboard[data-status='done']").count()
        try:  # the curves in use, on ipywidgets 7's front end
            seen["curves"] = check_curves(page, page.locator(".kdist-dashboard").first)
        except Exception as exc:
            seen["curves"] = exc
        try:
            assert_phases_and_devices(page.locator(".kdist-dashboard").first, ranks=2)
            seen["phases_and_devices"] = None
        except AssertionError as exc:
            seen["phases_and_devices"] = exc
        seen["outputs"] = page.evaluate(
            "() => Jupyter.notebook.get_cell(1).output_area.outputs.map("
            "o => [o.output_type, Object.keys(o.data || {})])"
        )
        page.evaluate("() => Jupyter.notebook.execute_cells([2])")  # %kdist stop
        page.wait_for_function("() => Jupyter.notebook.get_cell(2).input_prompt_number === 3", timeout=120_000)
        time.sleep(2)
        seen["after_next_cell"] = page.locator(".kdist-dashboard[data-status='done']").count()
        page.screenshot(path=str(test_output / "dashboard-classic.png"))
        yield seen
    finally:
        try:
            page.screenshot(path=str(test_output / "dashboard-classic-last.png"), full_page=True)
        except Exception:
            pass
        page.close()


@pytest.mark.timeout(900)
def test_live_dashboard_renders_and_grows_in_classic_notebook(classic_run):
    """ipywidgets 7 + anywidget 0.9.21 render kdist's ES module; updates stream while training."""
    seen = classic_run
    assert seen["first"] is not None, f"no curve points while running; console: {seen['console'][-10:]}"
    assert seen["grown"] is not None and seen["grown"] > seen["first"], "the curves did not grow"
    assert seen["ranks"] == 2  # mirrored over 2 logical CPU devices
    # once the run ended, the cell's one output is the finished view: no widget left in it
    assert seen["outputs"] == [["display_data", ["text/plain", "text/html"]]]


@pytest.mark.timeout(900)
def test_classic_notebook_ends_with_the_done_view(classic_run):
    assert classic_run["done"], "the dashboard never showed 'done' while the page watched"
    assert classic_run["final"] == 1 and classic_run["final_status"] == 1
    assert classic_run["after_next_cell"] == 1  # still there once %kdist stop has run


@pytest.mark.timeout(900)
def test_classic_notebook_curves_have_ticks_log_smoothing_hover_and_validation(classic_run):
    seen = classic_run["curves"]
    assert isinstance(seen, dict), f"using the chart failed: {seen!r}"
    assert_readable_curves(seen, ranks=1, epochs=5)
    assert classic_run["phases_and_devices"] is None, classic_run["phases_and_devices"]
