"""Open the built docs in headless Chromium and keep screenshots next to the build.

    python scripts/docs_screenshot.py [PAGE ...]     (after make docs)

PAGE is a path under docs/_build/html (default: the quickstart tutorial and the reference's
options page). Each page is opened from the file system with every network request refused,
so a page that needs the network shows it; the screenshots go to docs/_build/screenshots/.
Prints, per page, its title, how many dashboard views (the static SVG of a run) it shows and
which requests it tried to make outside the build. Exit status 1 when a page has none of its
own content or asked for anything outside. Uses Debian's chromium ($KDIST_CHROMIUM overrides)
through playwright, as the browser tests do.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "docs" / "_build" / "html"
SHOTS = ROOT / "docs" / "_build" / "screenshots"
CHROMIUM = os.environ.get("KDIST_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGES = ["tutorials/01-quickstart.html", "reference/magics.html"]


def shoot(page, rel: str) -> bool:
    outside: list[str] = []
    page.route(
        "**/*",
        lambda route: (
            route.continue_()
            if route.request.url.startswith("file://")
            else (outside.append(route.request.url), route.abort())
        ),
    )
    page.goto((HTML / rel).as_uri(), wait_until="load")
    main = page.locator("main, article").first
    text = main.inner_text() if main.count() else ""
    dashboards = page.locator(".cell_output svg").count()
    name = rel.replace("/", "-").replace(".html", ".png")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name), full_page=True)
    print(
        f"{rel}: title {page.title()!r}, {len(text)} characters, {dashboards} dashboard "
        f"view(s), requests outside the build: {outside or 'none'} -> {SHOTS / name}"
    )
    return bool(text.strip()) and not outside


def main(pages: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    missing = [p for p in pages if not (HTML / p).is_file()]
    if missing:
        print(f"not built: {missing} (run make docs first)", file=sys.stderr)
        return 1
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            ok = [shoot(browser.new_page(viewport={"width": 1280, "height": 900}), p) for p in pages]
        finally:
            browser.close()
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or PAGES))
