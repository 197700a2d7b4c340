"""Fast tier: parsing and validation of the %%kdist line (no TensorFlow)."""

import pytest
from IPython.core.error import UsageError

from kdist_magics.spec import ENGINE_STRATEGIES, OPTIONS, RunSpec, parse_line


def test_defaults_and_given():
    spec = parse_line("")
    assert spec == RunSpec()
    assert spec.strategy == "auto" and spec.out == "rank0" and spec.dashboard and spec.telemetry
    assert spec.given == frozenset()


def test_full_horovod_line():
    spec = parse_line(
        "-s horovod -n 3 --timeout 12.5 --push a,b --pull model,history --out all --no-dashboard --checkpoint ckpt"
    )
    assert spec.strategy == "horovod" and spec.np == 3 and spec.timeout == 12.5
    assert spec.push == ("a", "b") and spec.pull == ("model", "history")
    assert spec.out == "all" and spec.dashboard is False and spec.telemetry is True
    assert spec.checkpoint == "ckpt" and spec.strategy in ENGINE_STRATEGIES
    assert {"strategy", "np", "timeout", "push", "pull", "out", "dashboard"} <= spec.given


def test_spec_is_frozen():
    spec = parse_line("-s mirrored --devices 2")
    with pytest.raises(Exception):
        spec.devices = 3  # type: ignore[misc]


def test_configured_defaults_fill_in_but_line_wins():
    spec = parse_line("--np 4", {"strategy": "horovod", "np": 2, "timeout": 30.0})
    assert (spec.strategy, spec.np, spec.timeout) == ("horovod", 4, 30.0)
    assert "timeout" not in spec.given


def test_no_telemetry_implies_no_dashboard():
    spec = parse_line("--no-telemetry")
    assert spec.telemetry is False and spec.dashboard is False


def test_attach_options():
    spec = parse_line("-s horovod --cluster-id abc --profile prof")
    assert spec.attach and spec.cluster_id == "abc" and spec.profile == "prof"


@pytest.mark.parametrize(
    "line, words",
    [
        ("--strategy nope", ["--strategy", "auto", "horovod", "multiworker"]),
        ("-s nope", ["--strategy", "mirrored"]),
        ("--np 0", ["--np", ">= 1"]),
        ("--np -2", ["--np"]),
        ("--np two", ["--np", "int"]),
        ("--devices 0", ["--devices", ">= 1"]),
        ("--timeout 0", ["--timeout", "> 0"]),
        ("--timeout -3", ["--timeout", "> 0"]),
        ("--timeout soon", ["--timeout", "float"]),
        ("--push 1x", ["--push", "1x", "comma-separated"]),
        ("--pull model,class", ["--pull", "class"]),
        ("--pull ,", ["--pull"]),
        ("--out some", ["--out", "rank0", "all", "none"]),
        ("--bogus", ["--bogus", "%%kdist?"]),
        ("stray words", ["stray", "%%kdist?"]),
        ("--np", ["--np", "expected one argument"]),
        ("-s mirrored --np 2", ["--np", "mirrored", "--devices"]),
        ("-s default --pull x", ["--pull", "default"]),
        ("-s tpu --push x", ["--push", "tpu"]),
        ("-s mirrored --cluster-id c", ["--cluster-id", "mirrored"]),
        ("-s mirrored --out all", ["--out", "mirrored"]),
        ("-s horovod --devices 2", ["--devices", "--np"]),
        ("-s tpu --devices 2", ["--devices", "tpu"]),
        ("--pull 'unbalanced", ["cannot read"]),
        ("-s horovod --min-np 0", ["--min-np", "K >= 1"]),
        ("-s horovod --np 2 --min-np 3", ["--min-np 3", "--np 2", "K <= N"]),
        ("-s multiworker --min-np 2", ["--min-np", "horovod", "multiworker"]),
        ("-s mirrored --min-np 2", ["--min-np", "horovod", "mirrored"]),
        ("-s horovod --np 3 --max-np 2", ["--max-np 2", "M >= 3"]),
        ("-s horovod --min-np 3 --max-np 2", ["--max-np 2", "M >= 3"]),
        ("-s multiworker --max-np 4", ["--max-np", "horovod", "multiworker"]),
    ],
)
def test_bad_options_raise_exactly_usage_error(line, words):
    with pytest.raises(UsageError) as info:
        parse_line(line)
    assert type(info.value) is UsageError  # IPython hides the traceback only for this exact type
    message = str(info.value)
    assert 1 <= len(message.strip().splitlines()) <= 3, message
    for word in words:
        assert word in message, (word, message)


def test_every_option_has_help():
    for flags, kwargs in OPTIONS:
        assert kwargs.get("help"), flags


def test_with_strategy_revalidates():
    spec = parse_line("--devices 2")  # fine for auto
    assert spec.with_strategy("mirrored").devices == 2
    with pytest.raises(UsageError):
        spec.with_strategy("horovod")


def test_min_np_makes_an_elastic_horovod_request():
    spec = parse_line("-s horovod --np 4 --min-np 2")
    assert (spec.np, spec.min_np) == (4, 2) and "min_np" in spec.given
    assert parse_line("--np 4").min_np is None
    assert parse_line("-s horovod --np 2 --max-np 4").max_np == 4
    with pytest.raises(UsageError, match="--min-np applies to horovod"):
        parse_line("--np 4 --min-np 2").with_strategy("multiworker")
