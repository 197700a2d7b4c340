"""Fast tier: the set-up commands the README promises (dry runs; `make test` itself runs the rest)."""

import os
import shutil
import subprocess

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def dry_run(target: str) -> str:
    out = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_lab_sets_up_then_serves_notebooks_on_loopback():
    commands = dry_run("lab")
    assert "scripts/setup.sh" in commands
    assert "jupyter lab --notebook-dir=notebooks" in commands and "--ServerApp.ip=127.0.0.1" in commands
    # as root (containers, CI machines) Jupyter refuses to start without --allow-root
    assert ("--allow-root" in commands) == (os.geteuid() == 0)


def make_test_steps() -> list[str]:
    """`make test` hands its steps to scripts/test.sh: that script's command lines, in order."""
    assert "bash scripts/test.sh" in dry_run("test")
    return [
        ln.strip()
        for ln in (ROOT / "scripts" / "test.sh").read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]


def test_make_test_sets_up_with_the_browser_then_runs_pytest():
    lines = make_test_steps()
    setup = [i for i, ln in enumerate(lines) if "KDIST_REQUIRE_HOROVOD=1 bash scripts/setup.sh --browser" in ln]
    runs = [i for i, ln in enumerate(lines) if ".venv/bin/python -m pytest" in ln]
    assert setup and runs and setup[0] < runs[0], lines
    assert (
        'MAIN="not classic and not docs and not long and not ray and not netns and not tfless and not stacks"' in lines
    )
    # the main suite: P10's timing check alone, then two halves side by side that together run
    # every other test of MAIN once (one marker expression and its negation)
    (p10,) = [i for i, ln in enumerate(lines) if ln.startswith("tests/test_scale_netns.py ${PYTEST_ARGS")]
    half = [i for i, ln in enumerate(lines) if '-m "($MAIN) and ($ENGINES_HALF)"' in ln]
    rest = [i for i, ln in enumerate(lines) if '-m "($MAIN) and not ($ENGINES_HALF)"' in ln]
    assert '-m "$MAIN"' in lines[p10 - 1] and half and rest and p10 < half[0] < rest[0], lines
    for i in half + rest:
        assert "--deselect tests/test_scale_netns.py" in lines[i]
    ends = next(j for j in range(half[0], len(lines)) if lines[j].endswith(") &"))
    assert ends < rest[0] and "KDIST_ACCOUNT=account-engines" in lines[half[0] - 1]
    waited = [i for i, ln in enumerate(lines) if ln.startswith("wait $engines") and "status=1" in ln]
    assert waited and rest[0] < waited[0]
    assert "account-engines.json" in " ".join(lines[-5:]) and "account-p10.json" in " ".join(lines[-5:])
    docs = [i for i, ln in enumerate(lines) if "-m pytest -m docs" in ln]
    assert docs and docs[0] > waited[0]  # the docs show the notebooks the suite just executed


def test_make_test_runs_the_long_tier_beside_the_colab_part():
    """The main suite leaves the docs, the long tier, the tiers holding fixed names (netns,
    Slurm's among them) and the pip dry runs (stacks) out; the docs run before the Colab part,
    the others in two sessions of their own, started in the background before the docs and
    waited for (their exit statuses count) after the Colab part and the Ray tier, which follows
    it. Between them, every test of .venv runs once: "docs", "long and not ray and not netns",
    "ray and not netns" and "netns or stacks" are the rest of the main suite's."""
    lines = make_test_steps()
    long = [i for i, ln in enumerate(lines) if '.venv/bin/python -m pytest -m "long and not ray and not netns"' in ln]
    ray = [i for i, ln in enumerate(lines) if '.venv/bin/python -m pytest -m "ray and not netns"' in ln]
    limit = [i for i, ln in enumerate(lines) if '.venv/bin/python -m pytest -m "netns or stacks"' in ln]
    colab = [i for i, ln in enumerate(lines) if ".venv-colab/bin/python -m pytest" in ln]
    waited = [i for i, ln in enumerate(lines) if ln.startswith(("wait $long", "wait $limit")) and "status=1" in ln]
    assert long and limit and colab and len(waited) == 2, lines
    docs = [i for i, ln in enumerate(lines) if "-m pytest -m docs" in ln]
    assert long[0] < docs[0] < colab[0] < ray[0] < waited[0] and limit[0] < docs[0], lines
    assert "KDIST_ACCOUNT=account-ray" in lines[ray[0] - 1] and "account-ray.json" in " ".join(lines[-5:])
    for i, account in ((long[0], "account-long"), (limit[0], "account-netns")):
        ends = next(j for j in range(i, len(lines)) if lines[j].endswith(") &"))  # in the background
        assert ends < colab[0] and f"KDIST_ACCOUNT={account}" in lines[i - 1]
        assert f"{account}.json" in " ".join(lines[-5:])  # counted in the account


def test_make_test_runs_the_tensorflow_free_part_on_colabs_tpu_pins():
    """.venv-colab-tpu (Colab's TPU runtime: no TensorFlow) is set up beside the main
    suite, after .venv-colab, and after the netns and Slurm tiers, in their session, runs the
    tests marked notf where that set-up succeeded, counted in the account."""
    lines = make_test_steps()
    limit = next(i for i, ln in enumerate(lines) if '.venv/bin/python -m pytest -m "netns or stacks"' in ln)
    ends = next(j for j in range(limit, len(lines)) if lines[j].endswith(") &"))
    colab = [i for i, ln in enumerate(lines) if "scripts/setup.sh --env colab " in ln + " "]
    setup = [i for i, ln in enumerate(lines) if "scripts/setup.sh --env colab-tpu" in ln]
    rest = [i for i, ln in enumerate(lines) if '-m "($MAIN) and not ($ENGINES_HALF)"' in ln]
    runs = [i for i, ln in enumerate(lines) if ".venv-colab-tpu/bin/python -m pytest -m notf" in ln]
    assert colab and setup and rest and runs and colab[0] < setup[0] < rest[0] < limit < runs[0] < ends, lines
    assert any(ln == "if ready colab-tpu; then" for ln in lines[limit : runs[0]])
    assert "colab-tpu/account.json" in " ".join(lines[-5:])


def test_make_test_runs_again_on_colabs_stack():
    lines = make_test_steps()
    colab = [i for i, ln in enumerate(lines) if "scripts/setup.sh --env colab" in ln]
    runs = [i for i, ln in enumerate(lines) if ".venv-colab/bin/python -m pytest" in ln]
    assert colab and runs and colab[0] < runs[0], lines
    assert "COLAB_TESTS" in lines[runs[0]]
    # the classic-Notebook (ipywidgets 7) browser test runs there, and no Horovod test
    assert "or classic" in dry_run("test") and "not horovod" in dry_run("test")
    assert "test-output/colab" in lines[runs[0] - 1] + lines[runs[0]] or "$OUT/colab" in lines[runs[0] - 1]
    # and the account comes last
    assert "scripts/test_account.py" in lines[-5], lines[-5:]  # (its arguments run on lines)


def test_make_test_quick_is_the_fast_tier_plus_one_run_per_strategy():
    commands = dry_run("test-quick")
    # (under `make test`, a nested make also prints "make[1]: Entering directory" lines)
    pytest_line = next(ln for ln in dry_run("test-fast").splitlines() if "-m pytest" in ln)
    fast = pytest_line.split('-m "', 1)[1].split('"')[0]
    assert f'-m "({fast}) or quick"' in commands


def test_ci_calls_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make lab" in readme


def test_every_tier_isolates_ipython_and_jupyter_state_with_one_helper(tmp_path, monkeypatch):
    from kernel_driver import STATE_DIRS, isolated_env

    monkeypatch.setenv("KERAS_BACKEND", "jax")
    env = isolated_env(tmp_path / "a", PYTHONUNBUFFERED="1")
    for var, sub in STATE_DIRS:
        assert env[var] == str(tmp_path / "a" / sub) and (tmp_path / "a" / sub).is_dir()
    assert env["KERAS_BACKEND"] == "jax" and env["PYTHONUNBUFFERED"] == "1"  # a default, kept
    assert "KERAS_BACKEND" not in isolated_env(tmp_path / "b", keras_backend=None)  # notebooks
    monkeypatch.delenv("KERAS_BACKEND")
    assert isolated_env(tmp_path / "c")["KERAS_BACKEND"] == "tensorflow"
    target = {"HOME": "/nowhere"}
    assert isolated_env(tmp_path / "d", env=target) is target and target["IPYTHONDIR"].startswith(str(tmp_path))
    # and this very test process runs isolated (conftest used the same helper)
    assert not os.environ["IPYTHONDIR"].startswith(os.path.expanduser("~/.ipython"))
