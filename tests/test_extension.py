"""Fast tier: loading, configuration and the line magic (no TensorFlow)."""

import subprocess
import sys

import pytest
from IPython.core.error import UsageError

import kdist_magics
from kdist_magics.errors import StrategyUnavailable
from kdist_magics.strategies import create


def test_load_ext_imports_no_heavy_module():
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'kdist_magics')\n"
        "assert 'kdist' in ip.magics_manager.magics['cell']\n"
        "assert 'kdist' in ip.magics_manager.magics['line']\n"
        "import sys\n"
        "heavy = [m for m in ('tensorflow', 'keras', 'horovod', 'jax', 'ipyparallel') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "clean" in out.stdout


def test_config_sets_defaults(ip):
    ip.run_line_magic("config", "KDist.np = 4")
    ip.run_line_magic("config", "KDist.strategy = 'horovod'")
    ext = kdist_magics._extension
    assert ext.np == 4 and ext.strategy == "horovod"
    spec = ext.parse("--timeout 5")
    assert (spec.strategy, spec.np, spec.timeout) == ("horovod", 4, 5.0)


def test_bad_config_value_is_refused(ip):
    from traitlets import TraitError

    with pytest.raises(TraitError):
        kdist_magics._extension.strategy = "warp-drive"


def test_help_lists_every_option(ip):
    doc = ip.find_cell_magic("kdist").__doc__
    for option in (
        "--strategy",
        "--np",
        "--devices",
        "--timeout",
        "--push",
        "--pull",
        "--out",
        "--no-dashboard",
        "--cluster-id",
        "--profile",
        "--checkpoint",
    ):
        assert option in doc, option


def test_bad_cell_option_is_usage_error_and_runs_nothing(ip):
    ip.user_ns["touched"] = False
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("kdist", "--np 0", "touched = True")
    assert type(info.value) is UsageError
    assert ip.user_ns["touched"] is False
    assert kdist_magics.last_run() is None or kdist_magics.last_run().spec.np != 0


@pytest.mark.parametrize("line", ["", "launch", "sttaus"])
def test_line_magic_rejects_unknown_commands(ip, line):
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("kdist", line)
    assert "status" in str(info.value) and "advise" in str(info.value)


def test_status_before_any_run(ip, capsys):
    ip.run_line_magic("kdist", "status")
    out = capsys.readouterr().out
    assert "kdist status" in out and "last run" in out


def test_unbuilt_strategy_says_so():
    with pytest.raises(StrategyUnavailable) as info:
        create("warp")
    assert "not available" in str(info.value)


def test_unload_then_load_again(shell):
    shell.run_line_magic("unload_ext", "kdist_magics")
    assert kdist_magics._extension is None
    shell.run_line_magic("load_ext", "kdist_magics")
    assert kdist_magics._extension is not None


def test_a_changed_keras_backend_gets_new_engines_in_one_line(ip, monkeypatch, capsys):
    """After a multiworker cell on one backend, a cell after
    ``os.environ['KERAS_BACKEND'] = 'torch'`` reused the warm engines (still TensorFlow), and a
    restart preloaded TensorFlow under torch (SIGABRT). The kept strategy is made for one
    backend: another backend stops its engines, in one line, and makes the strategy anew."""
    import kdist_magics.strategies as strategies_pkg
    from kdist_magics.strategies.frameworks import backends

    made = []

    class Made:
        def __init__(self, backend):
            self.backend, self.stopped = backend, False

        def teardown(self):
            self.stopped = True

    backend = {"now": "tensorflow"}
    monkeypatch.setattr(backends, "keras_backend", lambda env=None: backend["now"])
    monkeypatch.setattr(strategies_pkg, "create", lambda name: made.append(Made(backend["now"])) or made[-1])
    ext = kdist_magics._extension
    ext._strategies.pop("multiworker", None)
    first = ext.strategy_object("multiworker")
    assert ext.strategy_object("multiworker") is first and not first.stopped  # the same backend
    backend["now"] = "torch"
    second = ext.strategy_object("multiworker")
    assert second is not first and first.stopped and second.backend == "torch"
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "Keras' backend is now torch (it was tensorflow" in out
    ext._strategies.pop("multiworker", None)
