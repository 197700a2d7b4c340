#!/usr/bin/env python3
"""``make demo``: run the quickstart notebook headless and say how it went.

Executes ``notebooks/01-quickstart.ipynb`` with nbclient (the venv's python3
kernel), copied alone into ``demo-output/work/``, writes the executed notebook
to ``demo-output/01-quickstart.ipynb`` and prints its path and a one-line
summary of the run (the strategy, how long, the last loss, test accuracy).

    python scripts/demo.py [NOTEBOOK] [--timeout SECONDS]

``KDIST_DEMO_OUTPUT`` puts the output somewhere else than ``demo-output/``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("KDIST_DEMO_OUTPUT", ROOT / "demo-output"))


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append(out["text"])
        elif "data" in out and "text/plain" in out["data"]:
            parts.append(out["data"]["text/plain"])
    return "".join(parts)


def summarise(nb) -> str:
    """A one-line summary from the executed notebook's outputs."""
    text = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    run = re.search(r"^(\w+): (done|failed|interrupted|timeout) in ([\d.]+ s)[^\n]*", text, re.M)
    acc = re.search(r"test accuracy: ([\d.]+ ?%)", text)
    chose = re.search(r"--strategy auto chose (\w+)", text)
    bits = []
    if run:
        bits.append(run.group(0).strip())
    if chose and (not run or chose.group(1) != run.group(1)):
        bits.append(f"auto chose {chose.group(1)}")
    if acc:
        bits.append(f"test accuracy {acc.group(1)}")
    return "; ".join(bits) or "ran without a run summary in its output"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Run a kdist notebook headless.")
    parser.add_argument("notebook", nargs="?", default=str(ROOT / "notebooks" / "01-quickstart.ipynb"))
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    args = parser.parse_args(argv)

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    source = Path(args.notebook).resolve()
    OUT.mkdir(exist_ok=True)
    work = OUT / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    shutil.copy2(source, work / source.name)  # alone: its data comes from the package
    # kernel state stays out of the user's ~/.ipython and ~/.jupyter
    env = dict(os.environ)
    for var, sub in (("IPYTHONDIR", "ipython"), ("JUPYTER_RUNTIME_DIR", "runtime")):
        (OUT / ".state" / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(OUT / ".state" / sub)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"

    nb = nbformat.read(work / source.name, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=args.timeout,
        startup_timeout=120,
        resources={"metadata": {"path": str(work)}},
    )
    target = OUT / source.name
    print(
        f"kdist demo: running {source.relative_to(ROOT) if source.is_relative_to(ROOT) else source} "
        f"headless (about a minute)...",
        flush=True,
    )
    start = time.time()
    failure = None
    try:
        client.execute(env=env)
    except (CellExecutionError, CellTimeoutError) as exc:
        failure = exc
    finally:
        nbformat.write(nb, target)
    took = time.time() - start
    shown = target.relative_to(Path.cwd()) if target.is_relative_to(Path.cwd()) else target
    print(f"kdist demo: executed notebook: {shown}")
    if failure is not None:
        first = re.sub(r"\x1b\[[0-9;]*m", "", str(failure)).strip().splitlines()
        print(f"kdist demo: FAILED after {took:.0f} s: {first[-1] if first else failure}", file=sys.stderr)
        return 1
    print(f"kdist demo: ok in {took:.0f} s: {summarise(nb)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
