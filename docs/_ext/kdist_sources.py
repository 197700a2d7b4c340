"""Pages the docs build copies in from the repository before Sphinx reads anything.

* the tutorials: ``notebooks/NN-*.ipynb`` as CI executed them (``test-output/notebooks/``, or
  ``$KDIST_TEST_OUTPUT/notebooks/``, where ``make test`` saves the executed copies) when the
  executed copy has the committed cells, else the committed copy without outputs; each page says which it shows. Nothing is executed here.
* ``benchmarks/README.md`` and ``ARCHITECTURE.md`` as pages, their relative links pointed at the
  repository (they are written to be read on GitHub); a short page where a file is absent.

The copies are build inputs, not sources: ``.gitignore`` lists them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

REPO_URL = "https://github.com/kdist-magics/kdist_magics"
_LINK = re.compile(r"(!?\[[^\]]*\]\()(?!https?:|mailto:|#)([^)\s]+)\)")


def executed_dir(root: Path) -> Path:
    """Where the notebook tier saved its executed copies (the same rule as tests/conftest.py)."""
    return Path(os.environ.get("KDIST_TEST_OUTPUT", root / "test-output")) / "notebooks"


def _note(executed: bool, name: str) -> dict:
    if executed:
        text = (
            f":::{{note}}\nThe outputs below are the ones CI saved when it executed "
            f"`notebooks/{name}` (`make test`'s notebook tier, `test-output/notebooks/`); "
            f"the docs build shows them and runs nothing. Each dashboard is its finished view, "
            f"drawn by its own inline script (a plain summary where scripts are off).\n:::"
        )
    else:
        text = (
            f":::{{note}}\nThis build found no executed copy of `notebooks/{name}` "
            f"(`make test` saves them under `test-output/notebooks/`) of its current cells, so the notebook is "
            f"shown as committed, without outputs. The docs build never runs notebooks.\n:::"
        )
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def copy_tutorials(root: Path, dest: Path) -> dict[str, bool]:
    """Copy every numbered notebook into ``dest``; returns {name: executed copy used}."""
    dest.mkdir(parents=True, exist_ok=True)
    used = {}
    for path in sorted((root / "notebooks").glob("[0-9]*.ipynb")):
        ran = executed_dir(root) / path.name
        source = ran if ran.is_file() and _same_cells(ran, path) else path
        nb = json.loads(source.read_text(encoding="utf-8"))
        nb["cells"].insert(1, _note(source is ran, path.name))
        if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) >= (4, 5):
            for i, cell in enumerate(nb["cells"]):
                cell.setdefault("id", f"kdist-cell-{i}")  # nbformat 4.5 wants every cell to have one
        nb.get("metadata", {}).pop("widgets", None)  # no widget state: the finished view shows
        _write(dest / path.name, json.dumps(nb, indent=1))
        used[path.name] = source is ran
    for old in dest.glob("*.ipynb"):
        if old.name not in used:
            old.unlink()  # a notebook renamed or removed since the last build
    return used


def _same_cells(executed: Path, committed: Path) -> bool:
    """Whether an executed copy ran the committed cells (one saved before the notebook was
    edited shows outputs of code the page no longer has: the committed copy is shown then)."""

    def sources(path: Path) -> list[str]:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells]

    try:
        return sources(executed) == sources(committed)
    except (ValueError, KeyError):
        return False


def _write(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it (an unchanged page is not read again)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def repo_links(text: str, relative_to: str, page_dir: str = "") -> str:
    """Rewrite the Markdown links of a file in ``relative_to`` (a folder of the repository, ""
    for the root) for a docs page in ``docs/<page_dir>``: a target inside ``docs/`` becomes a
    link relative to the page (so Sphinx checks it), any other one a link to the repository on
    GitHub."""

    def swap(match):
        target = os.path.normpath(os.path.join(relative_to, match.group(2)))
        if target.startswith("docs/"):
            return f"{match.group(1)}{os.path.relpath(target, os.path.join('docs', page_dir))})"
        return f"{match.group(1)}{REPO_URL}/blob/main/{target})"

    return _LINK.sub(swap, text)


def copy_markdown(root: Path, source: str, dest: Path, title: str, absent: str) -> bool:
    """Copy ``root/source`` to ``dest`` with its links pointed at the repository, or write a
    page titled ``title`` saying ``absent``. Returns whether the file was there."""
    src = root / source
    if src.is_file():
        page_dir = os.path.relpath(dest.parent, root / "docs")
        text = repo_links(src.read_text(encoding="utf-8"), os.path.dirname(source), page_dir)
        if not text.lstrip().startswith("# "):
            text = f"# {title}\n\n{text}"
    else:
        text = f"# {title}\n\n{absent}\n"
    _write(dest, text)
    return src.is_file()


def generate(root: Path, docs: Path) -> None:
    """Every copied page, before Sphinx reads the sources."""
    copy_tutorials(root, docs / "tutorials")
    copy_markdown(
        root,
        "benchmarks/README.md",
        docs / "performance" / "benchmarks.md",
        "Benchmarks in full",
        "This checkout has no `benchmarks/README.md`.",
    )
    copy_markdown(
        root,
        "ARCHITECTURE.md",
        docs / "contributing" / "architecture.md",
        "Architecture",
        "This checkout has no `ARCHITECTURE.md` yet; the layout "
        "and the flow of a run are on the {doc}`contributing page <index>`.",
    )


__all__ = ["generate", "copy_tutorials", "copy_markdown", "repo_links", "executed_dir"]
