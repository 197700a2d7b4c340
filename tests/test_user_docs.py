"""What a new user looks for exists and agrees with the code: the licence pyproject names, the
FAQ's four symptoms, platforms and clean-up, and one table with a row per strategy. Fast tier."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from kdist_magics.spec import KINDS

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide"


def test_license_is_the_one_pyproject_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = (ROOT / "LICENSE").read_text()
    assert project["license"] == "BSD-3-Clause" and text.startswith("BSD 3-Clause License")
    assert "kdist_magics developers" in text and project["authors"][0]["name"] == "kdist_magics developers"


def test_faq_answers_what_newcomers_ask():
    faq = (GUIDE / "faq.md").read_text()
    for heading in (
        "The dashboard does not show",
        "Horovod is missing",
        "Why is my laptop not faster?",
        "DevicesFixed",
        "Supported platforms",
        "Uninstall and clean up",
    ):
        assert f"## {heading}" in faq, heading
    for what in (
        "python -m kdist_magics.strategies.horovod.build",
        "~/.cache/kdist_magics",
        "/tmp/kdist-*",
        "macOS",
        "Linux",
    ):
        assert what in faq, what


def test_strategies_compared_has_a_row_per_strategy_and_the_four_columns():
    page = (GUIDE / "strategies-compared.md").read_text()
    header = next(ln for ln in page.splitlines() if ln.startswith("| strategy"))
    for column in ("who splits the data", "`batch_size`", "initial weights", "`--push` / `--pull`"):
        assert column in header, column
    rows = [ln for ln in page.splitlines() if ln.startswith("| `")]
    named = {re.match(r"\| `(\w+)`", ln).group(1) for ln in rows}
    assert named == set(KINDS), f"rows for {sorted(named)}, strategies are {sorted(KINDS)}"
    for row in rows:
        assert row.count(" | ") == 5, f"a row with a missing cell: {row}"


def test_getting_started_names_the_tour_as_it_is():
    """ "01 (quickstart) to NN": NN is the last notebook in notebooks/ (it said 08 when there
    were ten)."""
    page = (ROOT / "docs" / "getting-started.md").read_text()
    said = re.search(r"01 \(quickstart\) to (\d\d)", page)
    last = max(p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
    assert said and said.group(1) == last, (said and said.group(0), last)
