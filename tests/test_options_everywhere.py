"""Every ``%%kdist`` option means the same in every strategy: each option x strategy pair is
honoured (declared in kdist_magics.strategies.capabilities, with the test file that proves it) or
refused before anything runs (a UsageError naming the option and the strategy); never
accepted and ignored. Options and strategies come from spec.py's own tables, so a new one
is covered here without editing this file. Fast tier: parsing only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from kdist_magics.strategies import capabilities
from kdist_magics.spec import KINDS, OPTIONS, RAY_OPTIONS, SLURM_OPTIONS, parse_line

TESTS = Path(__file__).resolve().parent


def _dest(flags, kwargs) -> str:
    return kwargs.get("dest") or flags[0].lstrip("-").replace("-", "_")


def _sample(flags, kwargs) -> str:
    """The option with a valid value that is not its default (sbatch's and Ray's options with
    the launcher they belong to)."""
    flag = flags[0]
    if _dest(flags, kwargs) in SLURM_OPTIONS:
        return f"--launcher slurm {flag} x"
    if _dest(flags, kwargs) in RAY_OPTIONS:
        return f"--launcher ray {flag} {'pack' if flag == '--placement' else 'x'}"
    if kwargs.get("action") == "store_true":
        return flag
    if kwargs.get("choices"):
        return f"{flag} {[c for c in kwargs['choices'] if c != 'rank0'][-1]}"
    if kwargs.get("type") in (int, float):
        return f"{flag} 2"
    if kwargs.get("metavar") == "D,M":  # --mesh
        return f"{flag} 1,2"
    return f"{flag} x"


PAIRS = [
    pytest.param(flags, kwargs, name, id=f"{_dest(flags, kwargs)}-{name}")
    for flags, kwargs in OPTIONS
    if flags[0] != "--strategy"
    for name in KINDS
]


def test_the_table_names_only_real_options_and_strategies():
    dests = {_dest(f, k) for f, k in OPTIONS} - {"strategy"}
    assert set(capabilities.HONOURED) == dests, "every option has a row, and only options do"
    for option, where in capabilities.HONOURED.items():
        assert set(where) <= set(KINDS), f"{option}: unknown strategies {set(where) - set(KINDS)}"


@pytest.mark.parametrize(("flags", "kwargs", "strategy"), PAIRS)
def test_each_option_is_honoured_or_refused(flags, kwargs, strategy):
    option, line = _dest(flags, kwargs), f"--strategy {strategy} {_sample(flags, kwargs)}"
    try:
        parse_line(line)
    except UsageError as err:
        assert not capabilities.honours(strategy, option), (
            f"{line!r} is refused, but capabilities declares {option} honoured under {strategy}: {err}"
        )
        assert flags[0] in str(err) and strategy in str(err), (
            f"the refusal of {line!r} must name {flags[0]} and {strategy}: {err}"
        )
        return
    assert capabilities.honours(strategy, option), (
        f"{line!r} is accepted, but kdist_magics.strategies.capabilities does not declare it honoured "
        f"(accepted and ignored?): declare it with its test, or refuse it in spec.validate"
    )


def _test_functions(path: Path) -> set[str]:
    return {
        n.name
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    }


@pytest.mark.parametrize("option", sorted(capabilities.HONOURED))
def test_each_declared_capability_names_a_test_that_exists(option):
    for strategy, proof in capabilities.HONOURED[option].items():
        filename, _, function = proof.partition("::")
        path = TESTS / filename
        assert path.is_file(), f"{option} under {strategy}: {filename} does not exist"
        assert function in _test_functions(path), f"{option} under {strategy}: {filename} has no test {function}"
