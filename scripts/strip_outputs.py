#!/usr/bin/env python3
"""Strip outputs from notebooks before committing them.

    python scripts/strip_outputs.py                   # every notebooks/*.ipynb
    python scripts/strip_outputs.py path.ipynb ...    # these
    python scripts/strip_outputs.py --check           # exit 1 if any has outputs

Removes outputs, execution counts, widget state and per-cell execution
metadata; keeps sources, cell ids and the kernelspec.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def strip(nb) -> bool:
    """Strip ``nb`` in place; True if anything changed."""
    changed = False
    for cell in nb.cells:
        if cell.cell_type == "code":
            if cell.get("outputs") or cell.get("execution_count") is not None:
                cell.outputs, cell.execution_count = [], None
                changed = True
        for key in ("execution", "collapsed", "scrolled", "ExecuteTime"):
            if key in cell.metadata:
                del cell.metadata[key]
                changed = True
    if "widgets" in nb.metadata:
        del nb.metadata["widgets"]
        changed = True
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if any needs stripping")
    args = parser.parse_args(argv)
    paths = args.paths or sorted((ROOT / "notebooks").glob("*.ipynb"))
    dirty = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        if strip(nb):
            dirty.append(path)
            if not args.check:
                nbformat.write(nb, path)
    verb = "needs stripping" if args.check else "stripped"
    for path in dirty:
        print(f"{verb}: {path}")
    return 1 if (args.check and dirty) else 0


if __name__ == "__main__":
    sys.exit(main())
