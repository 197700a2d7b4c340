"""Browser tier on Colab's front-end generation: the classic Notebook 6.5 with ipywidgets 7
(anywidget's nbextension), in headless Chromium. The live dashboard renders in the cell's
output, its curves gain points while training runs, and it ends "done".

Runs in the Colab-pinned environment (``make test``'s second run, marker ``classic``), where
``notebook`` is 6.5.7 and ``ipywidgets`` 7.7.1. Screenshots go to
``test-output/colab/dashboard-classic*.png``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from test_browser import CHROMIUM, CHROMIUM_ARGS, TRAIN, _free_port, _get, _notebook, _points

pytestmark = [pytest.mark.classic, pytest.mark.slow]


def _classic_notebook_or_skip():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: run scripts/setup.sh --browser (make test does)")
    pytest.importorskip("playwright.sync_api", reason="playwright is a test tool of both environments")
    notebook = pytest.importorskip("notebook", reason="the classic Notebook is Colab's front end")
    ipywidgets = pytest.importorskip("ipywidgets")
    if not notebook.__version__.startswith("6.") or not ipywidgets.__version__.startswith("7."):
        pytest.skip(f"this test is for Notebook 6 with ipywidgets 7 (Colab's); here Notebook "
                    f"{notebook.__version__}, ipywidgets {ipywidgets.__version__}")


@pytest.fixture(scope="module")
def classic():
    _classic_notebook_or_skip()
    from kernel_driver import isolated_env

    home = Path(tempfile.mkdtemp(prefix="kdist-classic-"))
    env = isolated_env(home, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow", PYTHONUNBUFFERED="1")
    root = home / "notebooks"
    root.mkdir()
    port, token = _free_port(), secrets.token_hex(16)
    log = open(home / "notebook.log", "wb")
    cmd = [sys.executable, "-m", "notebook", "--no-browser", "--NotebookApp.ip=127.0.0.1",
           f"--port={port}", "--port-retries=0", f"--NotebookApp.token={token}",
           f"--NotebookApp.notebook_dir={root}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                _get(f"{base}/api/status?token={token}")
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    log.flush()
                    raise RuntimeError("Notebook did not start:\n"
                                       + (home / "notebook.log").read_text(errors="replace")[-3000:])
                time.sleep(0.5)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                yield {"base": base, "token": token, "root": root, "browser": browser}
            finally:
                browser.close()
    finally:
        if proc.poll() is None:  # our server (and its kernels), by its PID
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)  # the classic server asks to confirm a first ^C
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.timeout(900)
def test_live_dashboard_in_classic_notebook(classic, test_output):
    name = "dash-classic.ipynb"
    (classic["root"] / name).write_text(json.dumps(_notebook("%%kdist --strategy mirrored --devices 2\n" + TRAIN)))
    page = classic["browser"].new_page(viewport={"width": 1300, "height": 1100})
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    try:
        page.goto(f"{classic['base']}/notebooks/{name}?token={classic['token']}", timeout=120_000)
        page.wait_for_function("() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel"
                               " && Jupyter.notebook.kernel.is_connected()", timeout=180_000)
        page.evaluate("() => Jupyter.notebook.execute_all_cells()")
        dash = page.locator(".kdist-dashboard").first
        dash.wait_for(timeout=300_000)
        deadline, first, status = time.time() + 400, None, None
        while time.time() < deadline:
            status, n = dash.get_attribute("data-status"), _points(dash)
            if status != "running":
                break
            if n > 0 and first is None:
                first = n
                page.screenshot(path=str(test_output / "dashboard-classic-running.png"))
            if first is not None and n > first:
                break
            time.sleep(0.3)
        assert first is not None, f"no curve points while running (status {status!r}); console: {console[-10:]}"
        assert _points(dash) > first, "the curves did not grow while training ran"
        page.wait_for_selector(".kdist-dashboard[data-status='done']", timeout=400_000)
        dash = page.locator(".kdist-dashboard").first
        assert dash.locator(".kdist-status").inner_text().strip() == "done"
        assert dash.locator(".kdist-rank").count() == 2
        assert dash.locator(".kdist-chart-loss polyline").count() == 1
        assert dash.locator(".kdist-progress .kdist-bar-text").inner_text().startswith("epoch 5/5")
        dash.screenshot(path=str(test_output / "dashboard-classic.png"))
    finally:
        try:
            page.screenshot(path=str(test_output / "dashboard-classic-last.png"), full_page=True)
        except Exception:
            pass
        page.close()
