"""Fast tier: the Horovod builder's decisions (cache key, reuse, missing tools, the patch file).

The build itself (fetch the sdist, patch, compile with Gloo) runs in every `make test` set-up:
scripts/setup.sh calls `python -m kdist_magics.strategies.horovod.build`, and the Horovod tiers use it.
"""

from __future__ import annotations

import re
import stat

import pytest

from kdist_magics.strategies.horovod import build as hb


@pytest.fixture
def fake_python(tmp_path):
    """An 'interpreter' that answers the builder's version probe as Python 3.13 with TF 2.21.0."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\necho 2.21.0 cp313\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_patch_says_why_for_every_hunk():
    text = hb.PATCH.read_text()
    hunks = re.findall(r"^@@ -\d+,\d+ \+\d+,\d+ @@(.*)$", text, re.M)
    assert hunks and all(len(why.strip()) > 20 for why in hunks), hunks
    assert "xla_mpi_ops.cc" in text and "-list(APPEND TF_SOURCES" in text


def test_cache_is_keyed_by_tensorflow_python_and_patch(tmp_path):
    a = hb.cache_dir("2.21.0", "cp313", root=tmp_path)
    assert a.parent == tmp_path / "horovod" and a.name.startswith(f"{hb.VERSION}-tf2.21.0-cp313-")
    assert hb.cache_dir("2.20.0", "cp313", root=tmp_path) != a
    assert hb.cache_dir("2.21.0", "cp312", root=tmp_path) != a


def test_check_says_build_then_reuse(tmp_path, monkeypatch, fake_python):
    monkeypatch.setenv("KDIST_CACHE", str(tmp_path))
    assert hb.ensure(fake_python, check=True).startswith(f"would build Horovod {hb.VERSION} against TF 2.21.0")
    folder = hb.cache_dir("2.21.0", "cp313")
    folder.mkdir(parents=True)
    wheel = folder / f"horovod-{hb.VERSION}-cp313-cp313-linux_x86_64.whl"
    wheel.write_bytes(b"")
    (folder / f"horovod-{hb.VERSION}-cp313-cp313-linux_x86_64.whl.part").write_bytes(b"")
    assert hb.ensure(fake_python, check=True) == f"would install {wheel}"


def test_missing_tools_are_named_before_anything_is_fetched(tmp_path, monkeypatch, fake_python):
    monkeypatch.setattr(hb.shutil, "which", lambda tool: None if tool == "cmake" else "/usr/bin/" + tool)
    fetched = []
    monkeypatch.setattr(hb, "pip", lambda *a, **k: fetched.append(a))
    with pytest.raises(hb.BuildError, match="needs cmake"):
        hb.build(fake_python, tmp_path)
    assert fetched == []


def test_no_tensorflow_is_one_clear_line(tmp_path, capsys):
    no_tf = tmp_path / "python"
    no_tf.write_text("#!/bin/sh\nexit 1\n")
    no_tf.chmod(0o755)
    assert hb.main(["--python", str(no_tf), "--check"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "kdist horovod: cannot build Horovod: TensorFlow is not importable here; "
        "install it first (pip install 'kdist_magics[tensorflow-cpu]')"
    ]


def test_without_horovod_the_strategy_says_how_in_one_line(monkeypatch):
    import sys

    from kdist_magics.errors import StrategyUnavailable
    from kdist_magics.strategies import create

    monkeypatch.setitem(sys.modules, "horovod.runner.http.http_server", None)  # import fails
    with pytest.raises(StrategyUnavailable) as info:
        create("horovod")
    message = str(info.value)
    assert "\n" not in message and "python -m kdist_magics.strategies.horovod.build" in message
    assert "every other strategy works without it" in message


def test_auto_never_picks_horovod_when_it_is_not_importable():
    from kdist_magics.choose.advisor import decide, facts_for
    from kdist_magics.hardware import Hardware
    from kdist_magics.spec import parse_line

    hw = Hardware.from_dict({"cpu_cores": 64, "hosts": 2, "engines": 8, "horovod": False})
    advice = decide(facts_for(hw, parse_line("--np 8"), {}, backend="tensorflow"))
    assert advice.strategy == "multiworker"
