"""`pip install kdist_magics` into Colab's and Kaggle's stacks changes none of their packages.

For each stack a fresh venv on that stack's Python gets the packages kdist depends on at the
stack's own versions (envs/*.txt as pip constraints); then `pip install --dry-run --report` of
this checkout must plan to install kdist_magics and at most packages the stack does not have:
no upgrade, no downgrade. (The full Colab environment, TensorFlow and JAX included, is
`make test`'s second environment, built by `scripts/setup.sh --env colab` under the same pins.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = [pytest.mark.stacks, pytest.mark.slow, pytest.mark.timeout(900)]

#: what kdist's core requires, by the names the stacks install them under
CORE = [
    "ipython",
    "ipykernel",
    "traitlets",
    "ipyparallel",
    "ipywidgets",
    "anywidget",
    "psutil",
    "numpy",
    "notebook",
    "jupyter_server",
]
STACKS = {"colab": ("3.13", ROOT / "envs" / "colab-2026-08.txt"), "kaggle": ("3.12", ROOT / "envs" / "kaggle-2026.txt")}


def find_python(version: str) -> str | None:
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for c in candidates:
        if c and subprocess.run([c, "-c", "import venv"], capture_output=True).returncode == 0:
            return c
    return None


def pip(venv: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", *args], capture_output=True, text=True, timeout=800
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def install_stack(venv: Path, pins: Path) -> None:
    """The stack's packages into ``venv`` at its pinned versions: by way of uv when set-up put
    it beside this interpreter (the same versions, from its cache, in seconds), else pip. The
    plan that is judged is pip's either way."""
    uv = Path(sys.executable).with_name("uv")
    if not uv.exists():
        pip(venv, "install", "-q", "-c", str(pins), *CORE)
        return
    configured = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.constraint"], capture_output=True, text=True
    ).stdout.strip()
    extra = ["-c", configured] if configured and Path(configured).is_file() else []
    out = subprocess.run(
        [str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-c", str(pins), *extra, *CORE],
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_installing_kdist_changes_nothing_the_stack_has(stack, tmp_path):
    version, pins = STACKS[stack]
    python = find_python(version)
    if python is None:
        pytest.skip(f"{stack}'s stack runs Python {version}, which is not on this machine")
    venv = tmp_path / stack
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    install_stack(venv, pins)
    before = {
        p["name"].lower().replace("_", "-"): p["version"]
        for p in json.loads(pip(venv, "list", "--format", "json").stdout)
    }
    report = tmp_path / "report.json"
    pip(venv, "install", "-q", "--dry-run", "--report", str(report), str(ROOT))
    planned = {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert "kdist-magics" in planned
    changed = {name: (before[name], v) for name, v in planned.items() if name in before}
    assert not changed, f"installing kdist into {stack}'s stack would change {changed}"
    # and the stack really is the pinned one (the test would prove nothing on other versions)
    for line in pins.read_text().splitlines():
        name, _, want = line.partition("==")
        key = name.strip().lower().replace("_", "-")
        if want and key in before and key in {c.replace("_", "-") for c in CORE}:
            assert before[key] == want.strip(), (key, before[key], want)
