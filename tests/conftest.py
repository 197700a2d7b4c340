"""Shared fixtures. Importing this isolates IPython and Jupyter state in temp folders
(before anything reads them), so tests never touch the developer's profiles."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_driver import isolated_env  # noqa: E402

_HOME = Path(tempfile.mkdtemp(prefix="kdist-tests-"))
isolated_env(_HOME, env=os.environ)  # this process: before anything reads these variables

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = Path(os.environ.get("KDIST_TEST_OUTPUT", ROOT / "test-output"))


@pytest.fixture(scope="session")
def test_output() -> Path:
    """Folder for artefacts a person may want to look at (screenshots, executed notebooks)."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return OUTPUT


@pytest.fixture(scope="session")
def shell():
    """One IPython shell for the session with kdist loaded.

    ``shell.run_cell_magic`` re-raises what the magic raises, so tests see the
    exact exception type (UsageError, CellFailed, ...).
    """
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kdist_magics")
    yield ip
    ip.run_line_magic("unload_ext", "kdist_magics")


@pytest.fixture
def ip(shell):
    """The session shell with a clean user namespace and default configuration."""
    import kdist_magics

    ext = kdist_magics._extension
    saved = {name: getattr(ext, name) for name in ext.trait_names() if ext.trait_metadata(name, "config")}
    keep = dict(shell.user_ns)
    from traitlets.config import Config

    section = Config(__import__("copy").deepcopy(dict(shell.config.get("KDist", {}))))
    yield shell
    for name, value in saved.items():
        setattr(ext, name, value)
    # %config also writes into the shell's config, which a reloaded extension would read
    shell.config["KDist"] = section
    shell.user_ns.clear()
    shell.user_ns.update(keep)


def run_cell(ip, source: str):
    """Run ``source`` as a notebook cell would and re-raise its error, if any."""
    result = ip.run_cell(source, store_history=False)
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        raise error
    return result.result


def python_without(*modules: str) -> str:
    """Snippet that fails if any of ``modules`` got imported."""
    return f"import sys; bad=[m for m in {modules!r} if m in sys.modules]; assert not bad, bad"


PY = sys.executable


FRESH_SHELL_PRELUDE = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
import kdist_magics
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "kdist_magics")
out = {}
def attempt(line, cell):
    try:
        return ip.run_cell_magic("kdist", line, cell), None
    except Exception as exc:
        return None, exc
"""


def run_in_fresh_shell(body: str, env: dict, unset: tuple[str, ...] = ()) -> dict:
    """Run ``body`` after :data:`FRESH_SHELL_PRELUDE` in a new Python (for frameworks that fix
    their devices at start-up); the body fills ``out``, which comes back as a dict (plus
    ``_stdout`` and ``_stderr``)."""
    import json
    import subprocess
    import textwrap

    code = FRESH_SHELL_PRELUDE + textwrap.dedent(body) + "\nprint('RESULT ' + json.dumps(out))\n"
    full_env = {k: v for k, v in os.environ.items() if k not in unset}
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=400, env=full_env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    result["_stdout"] = proc.stdout
    result["_stderr"] = proc.stderr
    return result
