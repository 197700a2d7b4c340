"""The headless Chromium every browser test drives (Debian's ``chromium``, which
``scripts/setup.sh --browser`` installs; ``KDIST_CHROMIUM`` names another), and how it is started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("KDIST_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require() -> None:
    """Skip, saying how to get it, where this machine has no Chromium or no Playwright."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: run scripts/setup.sh --browser (make test does)")
    pytest.importorskip("playwright.sync_api", reason="Playwright is in the test extra")


def launch(pw):
    """Chromium, headless, through a started ``sync_playwright()``."""
    return pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
