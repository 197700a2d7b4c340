"""The documentation: help text for every option and setting, and the site's build.

Fast tier: every ``%%kdist`` option, ``%kdist`` line command and ``%config KDist`` setting has
help text, and that text is what ``%%kdist?`` / ``%kdist?`` show (one source for the magic's
help, its errors and the docs' reference: ``docs/_ext/kdist_tables.py``); every ``%%kdist`` line
the pages and notebooks show parses, and every ``KDist.<name>`` they name exists.

Docs tier (``-m docs``; ``make test`` runs it once, after the notebook tier): ``make docs``'s
Sphinx build with every warning an error and every internal reference checked (``-n``); the
reference pages name every option and setting; every notebook has its tutorial page.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "docs" / "_ext"))  # the docs' extensions: kdist_tables, kdist_sources

DOCS = ROOT / "docs"


def _words(text: str) -> str:
    return " ".join(text.split())


def test_every_cell_option_has_help_text():
    from kdist_magics.spec import OPTIONS
    from kdist_tables import cell_options

    rows = cell_options()
    assert [row["flags"] for row in rows] == [list(flags) for flags, _ in OPTIONS]
    bare = [row["flags"][0] for row in rows if len(row["help"].split()) < 3]
    assert not bare, f"%%kdist options without help text (spec.OPTIONS): {bare}"


def test_cell_help_is_the_options_own_text():
    from kdist_tables import cell_help, cell_options

    shown = _words(cell_help())
    for row in cell_options():
        assert _words(row["help"]) in shown, f"%%kdist? does not show {row['flags'][0]}'s help"
    assert "%%config" not in shown  # argparse's %-escapes are expanded, as the user sees them


def test_every_line_command_has_help_text_and_is_dispatched():
    import importlib

    from kdist_magics.magics import KDist
    from kdist_tables import line_commands, line_help

    commands = line_commands()
    assert set(commands) == {"start", "run", "status", "stop", "restart", "advise", "scale"}
    for name, text in commands.items():
        assert len(text.split()) >= 3, f"%kdist {name} has no help text (messages.LINE_COMMANDS)"
        module = importlib.import_module(f"kdist_magics.commands.{name}")  # one module each
        assert callable(getattr(module, "run", None)), f"%kdist {name} has no handler"
        assert f"  {name}  " in line_help()
    assert KDist.kdist_line.__doc__ == line_help()


def test_a_wrong_line_command_names_the_commands():
    from IPython.core.error import UsageError

    from kdist_magics.magics import KDist

    with pytest.raises(UsageError, match="start, run, status, stop, restart, advise"):
        KDist(shell=None).kdist_line("begin")


def test_every_setting_has_help_text():
    from kdist_magics.magics import KDist
    from kdist_tables import config_settings

    rows = config_settings()
    assert {row["name"] for row in rows} == set(KDist.class_traits(config=True))
    bare = [row["name"] for row in rows if len(row["help"].split()) < 3]
    assert not bare, f"%config KDist settings without help text (magics.KDist traits): {bare}"
    for row in rows:  # the same words %config KDist shows
        trait = KDist.class_traits()[row["name"]]
        assert _words(row["help"]) in _words(KDist.class_get_trait_help(trait))


#: pages the docs build copies in (docs/_ext/kdist_sources.py): their sources are read instead
COPIED = {DOCS / "performance" / "benchmarks.md", DOCS / "contributing" / "architecture.md"}
#: a %%kdist or %kdist start/advise line's options (one space apart, as written in a cell)
KDIST_LINE = re.compile(r"%%?kdist(?: (?:start|advise))?((?: -{1,2}[a-z][\w-]*(?: (?!-)[^\s`#|()]+)?)+)")
PLACEHOLDER = re.compile(r"\b(N|K|M|S|NAME|SECONDS|ID|DIR)\b|\.\.\.|\{")  # N, {STRATEGY}: not literal


def _written_docs() -> list[Path]:
    """Every hand-written page: README.md, docs' Markdown, the sources of the copied pages."""
    pages = [p for p in DOCS.rglob("*.md") if "_build" not in p.parts and p not in COPIED]
    extra = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "ARCHITECTURE.md"]
    return pages + [p for p in extra if p.is_file()]


def _configured(before: str) -> dict:
    """The ``%config KDist.name = value`` settings a page shows before a cell line (a page that
    sets ``KDist.launcher = "slurm"`` then shows cells that take sbatch's options)."""
    import ast

    settings = {}
    for name, value in re.findall(r"^%config KDist\.(\w+) = ([^#\n]+)", before, re.M):
        try:
            settings[name] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            continue  # a value the page leaves to the reader
    return settings


def test_every_kdist_line_in_the_docs_and_notebooks_parses():
    """A page that shows a cell line the magic would refuse has drifted from the code."""
    from IPython.core.error import UsageError

    from kdist_magics.spec import parse_line

    texts = {p.relative_to(ROOT): p.read_text(encoding="utf-8") for p in _written_docs()}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        texts[nb.relative_to(ROOT)] = "\n".join("".join(c["source"]) for c in cells)
    checked = 0
    for path, text in texts.items():
        for match in KDIST_LINE.finditer(text):
            line = match.group(1).strip()
            if PLACEHOLDER.search(line):
                continue
            try:
                parse_line(line, _configured(text[: match.start()]))
            except UsageError as exc:
                pytest.fail(f"{path} shows %%kdist {line}, which the magic refuses: {exc}")
            checked += 1
    assert checked >= 20, checked


def test_every_setting_the_docs_and_messages_name_exists():
    from kdist_magics.magics import KDist

    sources = _written_docs() + sorted((ROOT / "kdist_magics").rglob("*.py"))
    named = {
        name: path.relative_to(ROOT)
        for path in sources
        for name in re.findall(r"\bKDist\.([A-Za-z_]\w*)", path.read_text(encoding="utf-8"))
    }
    unknown = {name: str(path) for name, path in named.items() if not hasattr(KDist, name)}
    assert not unknown, f"KDist settings named but not defined: {unknown}"
    assert len(named) >= 10


def _page_text(path: Path) -> str:
    text = re.sub(r"<script.*?</script>", "", path.read_text(encoding="utf-8"), flags=re.S)
    return _words(html.unescape(re.sub(r"<[^>]+>", " ", text)))


@pytest.fixture(scope="module")
def built_docs(test_output):
    pytest.importorskip("sphinx", reason="the docs extra (Sphinx, myst-nb) is not installed here")
    out = test_output / "docs"
    cmd = [
        sys.executable,
        "-m",
        "sphinx",
        "-b",
        "html",
        "-W",
        "--keep-going",
        "-n",
        "-q",
        "-E",
        "-d",
        str(out / "doctrees"),
        str(DOCS),
        str(out / "html"),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the docs build failed or warned:\n{done.stderr[-6000:]}"
    return out / "html"


@pytest.mark.docs
def test_reference_pages_list_every_option_and_setting(built_docs):
    from kdist_tables import cell_options, config_settings, line_commands

    magics = _page_text(built_docs / "reference" / "magics.html")
    for row in cell_options():
        assert all(flag in magics for flag in row["flags"]), row["flags"]
        assert _words(row["help"]) in magics, f"{row['flags'][0]}'s help is not on the page"
    for name, text in line_commands().items():
        assert f"%kdist {name}" in magics and _words(text) in magics
    config = _page_text(built_docs / "reference" / "config.html")
    for row in config_settings():
        assert f"KDist.{row['name']}" in config and _words(row["help"]) in config, row["name"]
    api = _page_text(built_docs / "reference" / "api.html")
    for name in ("last_run", "RunRecord", "DistributedOptimizer", "BroadcastGlobalVariablesCallback"):
        assert name in api


@pytest.mark.docs
def test_every_notebook_has_a_tutorial_page_that_says_where_its_outputs_come_from(built_docs):
    from kdist_sources import _same_cells, executed_dir

    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        page = _page_text(built_docs / "tutorials" / f"{path.stem}.html")
        title = json.loads(path.read_text())["cells"][0]["source"]
        title = _words("".join(title).splitlines()[0].lstrip("# "))
        assert title.replace("`", "") in page.replace("`", ""), path.name
        ran = executed_dir(ROOT) / path.name
        if ran.is_file() and _same_cells(ran, path):
            assert "outputs below are the ones CI saved" in page, path.name
        else:
            assert "found no executed copy" in page, path.name  # none, or one of older cells


@pytest.mark.docs
def test_readme_links_resolve_to_built_pages(built_docs):
    """README.md links into the site by path (docs/<page>.md): each must be a page that built."""
    readme = (ROOT / "README.md").read_text()
    pages = re.findall(r"\]\(docs/([\w/.-]+)\.md\)", readme)
    assert pages, "README.md links to no docs page"
    missing = [p for p in pages if not (built_docs / f"{p}.html").is_file()]
    assert not missing, f"README.md links to docs pages that did not build: {missing}"


@pytest.mark.docs
def test_the_tutorials_show_their_dashboards_in_a_browser(built_docs):
    """The built tutorial pages, opened from disk in headless Chromium with the network cut,
    show each executed notebook's finished dashboard as its own inline script draws it (the
    SVG summary it replaces hidden), a training cell's loss curves among them; with scripts off,
    the SVG summary shows instead. One screenshot per page is kept beside the build
    (``<test output>/docs/tutorial-NN.png``)."""
    import chromium

    chromium.require()
    from playwright import sync_api
    from kdist_sources import _same_cells, executed_dir

    shown = [
        p.stem
        for p in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
        if (executed_dir(ROOT) / p.name).is_file() and _same_cells(executed_dir(ROOT) / p.name, p)
    ]
    if not shown:
        pytest.skip("no executed notebooks to show: make test runs the notebook tier before the docs")
    seen = {}

    def local(route):  # the page's own files only: a dashboard must draw with nothing fetched
        return route.continue_() if route.request.url.startswith("file:") else route.abort()

    with sync_api.sync_playwright() as pw:
        browser = chromium.launch(pw)
        try:
            context = browser.new_context(offline=True, viewport={"width": 1280, "height": 1400})
            context.route("**/*", local)
            page = context.new_page()
            for name in shown:
                page.goto((built_docs / "tutorials" / f"{name}.html").as_uri())
                views = page.locator(".kdist-offline")
                seen[name] = views.count()
                if not seen[name]:
                    continue
                # every view is drawn by its script, which hides the summary; a cell that trains
                # has its curves (one that only prints, e.g. who is which worker, has none)
                for i in range(seen[name]):
                    view = views.nth(i)
                    drawn = view.locator(".kdist-dashboard")
                    drawn.wait_for(state="visible", timeout=15_000)
                    assert drawn.get_attribute("data-status"), f"{name}: dashboard {i} has no status"
                    assert not view.locator(".kdist-static").is_visible(), f"{name}: {i} drawn twice"
                curves = page.locator(".kdist-offline .kdist-chart-loss:has(polyline.kdist-line)")
                assert curves.count() >= 1, f"{name}: no dashboard on the page has its curves"
                curves.first.scroll_into_view_if_needed()
                box = curves.first.bounding_box()
                assert box and box["height"] > 100, f"{name}: the curves are not drawn ({box})"
                page.screenshot(path=str(built_docs.parent / f"tutorial-{name[:2]}.png"))
            context.close()
            plain = browser.new_context(offline=True, java_script_enabled=False)
            page = plain.new_page()
            first = next(name for name in shown if seen[name])
            page.goto((built_docs / "tutorials" / f"{first}.html").as_uri())
            static = page.locator(".kdist-offline .kdist-static")
            assert static.count() == seen[first] and static.first.is_visible(), first
            assert page.locator(".kdist-offline .kdist-static polyline").count() >= 1, first
            plain.close()
        finally:
            browser.close()
    # every page whose notebook runs a %%kdist cell with its dashboard shows at least one

    def dashboards(name: str) -> bool:
        cells = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"]
        lines = [ln for c in cells if c["cell_type"] == "code" for ln in "".join(c["source"]).splitlines()]
        return any(ln.startswith("%%kdist") and "--no-dashboard" not in ln for ln in lines)

    missing = [name for name in shown if dashboards(name) and not seen[name]]
    assert not missing, f"tutorial pages without their dashboards: {missing} (seen: {seen})"


def test_every_guide_page_is_in_exactly_one_toctree_of_the_guide():
    """A third toctree globbed ``*`` over pages the first two already listed, so the
    guide's sidebar showed most pages twice."""
    import re
    from collections import Counter

    guide = ROOT / "docs" / "guide"
    index = (guide / "index.md").read_text()
    trees = re.findall(r"```\{toctree\}\n(.*?)```", index, re.S)
    listed = Counter(
        line.strip()
        for tree in trees
        for line in tree.splitlines()
        if line.strip() and not line.strip().startswith(":")
    )
    pages = {p.stem for p in guide.glob("*.md")} - {"index"}
    assert "*" not in listed and set(listed) == pages, (sorted(listed), sorted(pages))
    assert all(n == 1 for n in listed.values()), listed


def test_the_choosing_pages_rules_come_from_the_advisor():
    """The page's hand-written rules table said, for a model that does not fit, that
    "every strategy here copies the model", while the advisor picks sharded there. The table is
    generated from RULES: every rule has its line, and the page has no hand-written table."""
    from kdist_magics.choose.advisor import RULES
    from kdist_tables import advisor_rules

    assert all(rule.doc for rule in RULES) and len(advisor_rules()) == len(RULES)
    assert any("sharded" in doc for criterion, doc in advisor_rules() if criterion == "model size")
    page = (DOCS / "guide" / "choosing.md").read_text()
    assert "```{kdist-advisor-rules}" in page and "| criterion | rule" not in page
