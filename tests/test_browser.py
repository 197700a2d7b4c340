"""Browser tier: a real JupyterLab 4 in headless Chromium runs %%kdist training cells and the
live dashboard appears, gains curve points while training runs, and ends "done" (default,
mirrored, horovod); a failing cell ends "failed" with its error; Notebook 7 shows it too.

One JupyterLab server (loopback, random token, isolated Jupyter/IPython dirs, temp notebook
dir) and one browser for the module; one notebook (and kernel) per strategy. Screenshots go
to ``test-output/dashboard-<strategy>.png``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

import chromium
from kdist_magics.cluster.network import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]


# A run long enough (~10-20 s on 2 shared cores) to watch the curves grow.
TRAIN = """\
import numpy as np, keras, time
x = np.random.default_rng(0).normal(size=(1024, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
class Pace(keras.callbacks.Callback):  # keeps the run long enough to watch on any machine
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.04)
history = model.fit(x, y, epochs=5, batch_size=32, verbose=0, callbacks=[Pace()],
                    validation_split=0.25)
"""

CELLS = {
    "default": "%%kdist --strategy default\n" + TRAIN,
    "mirrored": "%%kdist --strategy mirrored --devices 2\n" + TRAIN,
    # synchronised Horovod training on each rank's own data; rank 1 spends 60 ms more outside
    # each step: the straggler the dashboard must mark (rank 0 waits for it in the allreduce)
    "horovod": "%%kdist --strategy horovod --np 2\n"
    + TRAIN.replace("time.sleep(0.04)", "time.sleep(0.04 + 0.06 * hvd.rank())")
    .replace("default_rng(0)", "default_rng(hvd.rank())")
    .replace("optimizer=keras.optimizers.SGD(0.01)", "optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))")
    .replace("callbacks=[Pace()]", "callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Pace()]"),
}
RANKS = {"default": 1, "mirrored": 2, "horovod": 2}


def _missing(name: str) -> str | None:
    from kdist_magics.strategies import REGISTRY

    if name not in REGISTRY:
        return f"--strategy {name} is not in strategies.REGISTRY yet"
    return None


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _notebook(source: str) -> dict:
    def cell(src):
        return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}

    return {
        "cells": [cell("%load_ext kdist_magics"), cell(source), cell("%kdist stop")],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@contextlib.contextmanager
def served(name: str, command):
    """A Jupyter server (loopback, random token, isolated Jupyter/IPython dirs, temp notebook
    dir) and headless Chromium, for one test module. ``command(port, token, home, root)`` is
    the server's argv; SIGTERM ends it (by its PID), else a kill of its group."""
    from kernel_driver import isolated_env

    home = Path(tempfile.mkdtemp(prefix=f"kdist-{name}-"))
    env = isolated_env(home, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow", PYTHONUNBUFFERED="1")
    root = home / "notebooks"
    root.mkdir()
    port, token = free_port("127.0.0.1"), secrets.token_hex(16)
    log = open(home / "server.log", "wb")
    cmd = command(port, token, home, root)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI often run as root
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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
                    raise RuntimeError(
                        f"{name} did not start:\n" + (home / "server.log").read_text(errors="replace")[-3000:]
                    )
                time.sleep(0.5)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = chromium.launch(pw)
            try:
                yield {
                    "base": base,
                    "token": token,
                    "root": root,
                    "browser": browser,
                    "log": home / "server.log",
                    "data_dir": env["JUPYTER_DATA_DIR"],
                }
            finally:
                browser.close()
    finally:
        if proc.poll() is None:  # stop our server (and the kernels it started) by its PID
            # SIGTERM: jupyter_server and Notebook 6 both shut down at once (a SIGINT only asks
            # "Shutdown this ... server (y/[n])?" and, with no answer, goes on: the wait below
            # ran out, 30 s a module, in every run)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def lab():
    chromium.require()
    pytest.importorskip("jupyterlab", reason="jupyterlab is in the test extra")

    def command(port, token, home, root):
        return [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            f"--LabApp.workspaces_dir={home / 'workspaces'}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.news_url=None",
            "--LabApp.extension_manager=readonly",
        ]

    with served("JupyterLab", command) as server:
        yield server


def _shutdown_kernels(lab) -> None:
    req = urllib.request.Request(f"{lab['base']}/api/kernels?token={lab['token']}")
    for k in json.loads(_get(req.full_url)):
        urllib.request.urlopen(
            urllib.request.Request(f"{lab['base']}/api/kernels/{k['id']}?token={lab['token']}", method="DELETE"),
            timeout=30,
        )


def _points(dash) -> int:
    return int(dash.get_attribute("data-points") or 0)


def _open_and_run(lab, name: str, source: str):
    """Write a notebook (load_ext, ``source``, %kdist stop), open it in Lab, run its cells."""
    (lab["root"] / name).write_text(json.dumps(_notebook(source)))
    page = lab["browser"].new_page(viewport={"width": 1300, "height": 1100})
    page.console = []
    page.on("console", lambda m: page.console.append(f"{m.type}: {m.text}"))
    # ?reset: a fresh workspace, so only this notebook is open
    page.goto(f"{lab['base']}/lab/tree/{name}?reset&token={lab['token']}", timeout=120_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    # wait until the kernel is idle, then run the three cells (Shift+Enter each)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=180_000)
    _run_all_cells(page)
    return page


def check_curves(page, dash) -> dict:
    """Use the loss chart as a person would (the run has ended, so nothing redraws under the
    pointer): read its ticks, flip the log axis and smoothing, hover. Returns what was seen."""
    box = dash.locator(".kdist-chart-loss")
    svg = box.locator("svg.kdist-chart")
    seen = {
        "yticks": box.locator(".kdist-ytick").all_inner_texts(),
        "xticks": box.locator(".kdist-xtick").all_inner_texts(),
        "lines": box.locator("polyline.kdist-line").count(),
        "val_points": box.locator("circle.kdist-val").count(),
        "scale": svg.get_attribute("data-scale"),
    }
    box.locator(".kdist-log").click()  # the label toggles its checkbox
    seen["scale_after_click"] = box.locator("svg.kdist-chart").get_attribute("data-scale")
    box.locator(".kdist-log").click()
    seen["scale_after_second_click"] = box.locator("svg.kdist-chart").get_attribute("data-scale")
    box.locator(".kdist-smooth").click()
    seen["raw_when_smoothed"] = box.locator("polyline.kdist-raw").count()
    seen["smoothed"] = box.locator("polyline.kdist-smoothed").count()
    box.locator(".kdist-smooth").click()
    seen["raw_after"] = box.locator("polyline.kdist-raw").count()
    r = box.locator("svg.kdist-chart").bounding_box()
    page.mouse.move(r["x"] + r["width"] * 0.6, r["y"] + r["height"] * 0.45)
    tip = box.locator(".kdist-tip")
    tip.wait_for(state="visible", timeout=5000)
    seen["tip"] = tip.inner_text()
    seen["guide"] = box.locator("line.kdist-guide").count()
    page.mouse.move(r["x"] + r["width"] * 0.5, r["y"] + r["height"] + 300)  # away
    seen["tip_after_leave"] = tip.is_visible()
    return seen


def assert_readable_curves(seen: dict, ranks: int, epochs: int, validation: bool = True) -> None:
    assert len(seen["yticks"]) >= 3 and len(seen["xticks"]) >= 2, seen
    assert seen["scale"] in ("log", "linear")
    flipped = {"log": "linear", "linear": "log"}[seen["scale"]]
    assert seen["scale_after_click"] == flipped and seen["scale_after_second_click"] == seen["scale"]
    assert seen["raw_when_smoothed"] == seen["smoothed"] == seen["lines"] == ranks
    assert seen["raw_after"] == 0
    assert re.match(r"step \d+ · epoch [1-9]\d*", seen["tip"]), seen["tip"]
    assert all(f"rank {r}: " in seen["tip"] for r in range(ranks)), seen["tip"]
    assert seen["guide"] == 1 and not seen["tip_after_leave"]
    if validation:  # val_loss: one hollow point per epoch and rank
        assert seen["val_points"] == epochs * ranks, seen


def assert_phases_and_devices(dash, ranks: int) -> None:
    """An in-kernel run's phases, in order, and the device line of a machine without GPUs."""
    phases = dash.locator(".kdist-phases").inner_text()
    where = [phases.find(name) for name in ("running the cell", "training")]
    assert -1 not in where and where == sorted(where), phases
    if not Path("/proc/driver/nvidia/gpus").exists():
        notes = dash.locator(".kdist-rank .kdist-note").all_inner_texts()
        assert notes == ["accelerator: CPU only"] * ranks, notes


#: a cell's input prompt once it is queued or has run: "[*]:" or "[1]:"
_STARTED = "() => [...document.querySelectorAll('.jp-InputPrompt')].some(e => /\\[(\\*|\\d+)\\]/.test(e.textContent))"


def _run_all_cells(page, tries: int = 3) -> None:
    """Run > Run All Cells from the menu bar (JupyterLab 4 and Notebook 7 share it): unlike
    Shift+Enter keystrokes, it does not depend on which cell has the focus. Until a cell's
    prompt shows it queued or ran: a click that landed before the front end was ready (seen
    once in Notebook 7: every prompt still "[ ]" 400 s later) is repeated, never one that took."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).first.click()
        try:
            page.wait_for_function(_STARTED, timeout=30_000)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise
            print(f"Run All Cells: no cell queued 30 s after click {attempt + 1}; clicking again")
            page.keyboard.press("Escape")  # close the menu, should it still be open


@pytest.mark.timeout(900)
@pytest.mark.parametrize("strategy", ["default", "mirrored", "horovod"])
def test_live_dashboard_in_jupyterlab(lab, strategy, test_output):
    missing = _missing(strategy)
    if missing:
        pytest.skip(missing)
    page = _open_and_run(lab, f"dash-{strategy}.ipynb", CELLS[strategy])
    console = page.console
    try:
        dash = page.locator(".kdist-dashboard").first
        dash.wait_for(
            timeout=int(os.environ.get("KDIST_BROWSER_WAIT_S", "300")) * 1000
        )  # the widget rendered in the cell's output
        # while training runs, the curves gain points (the kernel's main thread is busy
        # for in-kernel strategies: updates come from the dashboard's background thread)
        deadline = time.time() + 400
        first = None
        bar_texts = []  # what the progress line said while the run went on
        while time.time() < deadline:
            status = dash.get_attribute("data-status")
            n = _points(dash)
            try:
                bar_texts.append(dash.locator(".kdist-progress .kdist-bar-text").inner_text(timeout=2000))
            except Exception:
                pass
            if status != "running":
                break
            if n > 0 and first is None:
                first = n
                page.screenshot(path=str(test_output / f"dashboard-{strategy}-running.png"))
            if first is not None and n > first:
                break
            time.sleep(0.3)
        assert first is not None, f"no curve points while running (status {status!r}); console: {console[-10:]}"
        second = _points(dash)
        assert second > first, f"curves did not grow while running: {first} -> {second}"
        assert dash.get_attribute("data-status") == "running"
        running_lines = dash.locator(".kdist-chart-loss polyline").count()

        # ... and it ends in the done state
        page.wait_for_selector(".kdist-dashboard[data-status='done']", timeout=400_000)
        dash = page.locator(".kdist-dashboard").first
        assert _points(dash) >= second
        assert dash.locator(".kdist-status").inner_text().strip() == "done"
        assert dash.locator(".kdist-banner").count() == 0
        ranks = dash.locator(".kdist-rank")
        assert ranks.count() == RANKS[strategy]
        assert dash.locator(".kdist-rank .kdist-badge.kdist-done").count() == RANKS[strategy]
        lines = dash.locator(".kdist-chart-loss polyline").count()
        # one curve per rank (replicas of an in-kernel strategy report as one process)
        expected_lines = RANKS[strategy] if strategy == "horovod" else 1
        assert lines == expected_lines and running_lines >= 1
        assert dash.locator(".kdist-progress .kdist-bar-text").inner_text().startswith("epoch 5/5")
        assert dash.locator(".kdist-cpu").count() == RANKS[strategy]
        # the phases, on screen and in order: first engines starting (this kernel's first
        # horovod cell) with their count, then set-up, the cell, training, finishing
        phases = dash.locator(".kdist-phases").inner_text()
        expected = (
            ["starting 2 engines", "setting up Horovod", "running the cell", "training", "finishing"]
            if strategy == "horovod"
            else ["running the cell", "training"]
        )
        where = [phases.find(name) for name in expected]
        assert -1 not in where and where == sorted(where), phases
        if strategy == "horovod":
            assert any(t.startswith("starting 2 engines (") and "registered)" in t for t in bar_texts), bar_texts[:20]
        # a machine without GPU or TPU says so, not an NVML error
        if not Path("/proc/driver/nvidia/gpus").exists():
            notes = dash.locator(".kdist-rank .kdist-note").all_inner_texts()
            assert notes == ["accelerator: CPU only"] * RANKS[strategy], notes
        # stragglers: horovod's rank 1 lags (see CELLS), the others are one process
        slow = [
            dash.locator(f".kdist-rank[data-rank='{r}'] .kdist-badge.kdist-straggler").count()
            for r in range(RANKS[strategy])
        ]
        notes = dash.locator(".kdist-straggler-note").all_inner_texts()
        if strategy == "horovod":
            assert slow == [0, 1] and len(notes) == 1 and "rank 1: steps" in notes[0], (slow, notes)
            own = dash.locator(".kdist-own-step").all_inner_texts()  # rank 0 waits for rank 1
            assert len(own) == 2 and "waits" in own[0] and "waits" not in own[1], own
        else:
            assert sum(slow) == 0 and notes == []
        # each step's split, one stacked bar per process that times its steps (in-kernel
        # replicas are one process): inside the step and the rest, until a probe splits it;
        # Horovod's all-reduce is timed on every rank: compute, communication, the wait for
        # slower ranks (rank 0 waits for rank 1) and the rest
        split = dash.locator(".kdist-split .kdist-bar-text").all_inner_texts()
        legend = dash.locator(".kdist-split-legend").inner_text()
        if strategy == "horovod":
            assert len(split) == 2, split
            assert all(
                t.startswith("compute ")
                and " · communication " in t
                and " · wait for slower ranks " in t
                and " · rest " in t
                for t in split
            ), split
            assert dash.locator(".kdist-split .kdist-split-seg").count() == 4 * len(split)
            assert dash.locator(".kdist-split-wait").count() == 2
            assert "the all-reduce, timed on every rank" in legend, legend
        else:
            assert len(split) == 1, split
            assert all(t.startswith("in step ") and " · rest " in t for t in split), split
            assert dash.locator(".kdist-split .kdist-split-seg").count() == 2 * len(split)
            assert "inside the step" in legend, legend
        dash.screenshot(path=str(test_output / f"dashboard-{strategy}.png"))
        seen = check_curves(page, dash)
        assert_readable_curves(seen, ranks=1 if strategy != "horovod" else 2, epochs=5)
        page.screenshot(path=str(test_output / f"dashboard-{strategy}-page.png"), full_page=True)
        # the last cell (%kdist stop) ran: the kernel is free again
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-InputArea-prompt')].some(e => e.textContent.includes('[3]'))",
            timeout=120_000,
        )
    finally:
        try:  # what the page looked like at the end, pass or fail
            page.screenshot(path=str(test_output / f"dashboard-{strategy}-last.png"), full_page=True)
        except Exception:
            pass
        page.close()
        _shutdown_kernels(lab)


FAILING = TRAIN.replace(
    "history = model.fit(",
    "class Boom(keras.callbacks.Callback):\n"
    "    def on_epoch_end(self, epoch, logs=None):\n"
    "        if epoch == 1:\n"
    "            raise ValueError('bad batch in epoch 2')\n"
    "history = model.fit(",
).replace("callbacks=[Pace()]", "callbacks=[Pace(), Boom()]")


@pytest.mark.timeout(600)
def test_failed_run_shows_the_failed_state(lab, test_output):
    page = _open_and_run(lab, "dash-failed.ipynb", "%%kdist --strategy default\n" + FAILING)
    try:
        page.wait_for_selector(".kdist-dashboard[data-status='failed']", timeout=400_000)
        dash = page.locator(".kdist-dashboard").first
        banner = dash.locator(".kdist-banner.kdist-failed")
        assert banner.count() == 1
        assert "ValueError: bad batch in epoch 2" in banner.inner_text()
        assert dash.locator(".kdist-rank .kdist-badge.kdist-failed").count() == 1
        assert _points(dash) > 0  # the curves up to the failure stay
        dash.screenshot(path=str(test_output / "dashboard-failed.png"))
        # the traceback under the cell is the user's: their raise, no frame of kdist's
        shown = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
        assert "bad batch in epoch 2" in shown and "raise ValueError" in shown, shown[-3000:]
        assert "kdist_magics" not in shown, shown[-3000:]
    finally:
        try:
            page.screenshot(path=str(test_output / "dashboard-failed-last.png"), full_page=True)
        except Exception:
            pass
        page.close()
        _shutdown_kernels(lab)


SHORT = TRAIN.replace("epochs=5", "epochs=2")


@pytest.mark.timeout(600)
def test_dashboard_in_notebook7(lab, test_output):
    """The same widget in Notebook 7's single-document front end (same server)."""
    pytest.importorskip("notebook", reason="Notebook 7 is installed with the lab extra")
    name = "dash-nb7.ipynb"
    (lab["root"] / name).write_text(json.dumps(_notebook("%%kdist --strategy default\n" + SHORT)))
    page = lab["browser"].new_page(viewport={"width": 1300, "height": 1100})
    try:
        page.goto(f"{lab['base']}/notebooks/{name}?token={lab['token']}", timeout=120_000)
        page.wait_for_selector(".jp-Notebook .jp-Cell .jp-InputArea-editor", timeout=120_000)
        # Notebook 7 shows the kernel state as the title of its kernel status icon
        page.wait_for_function(
            "() => [...document.querySelectorAll('[title]')].some(e => /Kernel (is )?Idle/i.test(e.title)"
            " || /idle/i.test(e.getAttribute('data-status') || ''))",
            timeout=180_000,
        )
        _run_all_cells(page)
        page.wait_for_selector(".kdist-dashboard[data-status='done']", timeout=400_000)
        dash = page.locator(".kdist-dashboard").first
        assert _points(dash) > 0 and dash.locator(".kdist-chart-loss polyline").count() == 1
        assert dash.locator(".kdist-progress .kdist-bar-text").inner_text().startswith("epoch 2/2")
        dash.screenshot(path=str(test_output / "dashboard-notebook7.png"))
        assert_readable_curves(check_curves(page, dash), ranks=1, epochs=2)
        assert_phases_and_devices(dash, ranks=1)
    finally:
        try:
            page.screenshot(path=str(test_output / "dashboard-notebook7-last.png"), full_page=True)
        except Exception:
            pass
        page.close()
        _shutdown_kernels(lab)
