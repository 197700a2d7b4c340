"""The reference pages' tables, read from the definitions the magics themselves use.

``%%kdist?`` shows the parser built from :data:`kdist_magics.spec.OPTIONS`, ``%kdist?`` the
table :data:`kdist_magics.messages.LINE_COMMANDS`, ``%config KDist`` the traits' help. The
documentation's reference pages (``docs/reference/``) and the test that every option and
setting has help text (``tests/test_docs.py``) read them through these functions, so the words
cannot drift apart. Importing this module imports no framework (nor Sphinx).
"""

from __future__ import annotations

import argparse
from typing import Any


def cell_options() -> list[dict[str, Any]]:
    """Every ``%%kdist`` option as argparse shows it: ``flags`` (long first), ``metavar``,
    ``choices``, ``help`` (with ``%%`` expanded, exactly the text of ``%%kdist?``)."""
    from kdist_magics.spec import _kdist

    parser = _kdist.parser
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        rows.append(
            {
                "flags": list(action.option_strings),
                "metavar": action.metavar,
                "choices": list(action.choices) if action.choices else None,
                "help": formatter._expand_help(action) if action.help else "",
            }
        )
    return rows


def cell_help() -> str:
    """What ``%%kdist?`` shows: the magic's docstring, which IPython builds from the parser."""
    from kdist_magics.magics import KDist

    return KDist.kdist.__doc__ or ""


def line_commands() -> dict[str, str]:
    """The ``%kdist`` line commands and what each does."""
    from kdist_magics.messages import LINE_COMMANDS

    return dict(LINE_COMMANDS)


def line_help() -> str:
    """What ``%kdist?`` shows."""
    from kdist_magics.magics import KDist

    return KDist.kdist_line.__doc__ or ""


def config_settings() -> list[dict[str, Any]]:
    """Every ``%config KDist.<name>`` setting, by name: ``name``, ``type`` (the trait's class),
    ``default`` (repr), ``choices`` (enums) and ``help`` (what ``%config KDist`` shows)."""
    from kdist_magics.magics import KDist

    rows = []
    for name, trait in sorted(KDist.class_traits(config=True).items()):
        values = getattr(trait, "values", None)
        rows.append(
            {
                "name": name,
                "type": type(trait).__name__,
                "default": repr(trait.default_value),
                "choices": list(values) if values else None,
                "help": trait.help or "",
            }
        )
    return rows


def advisor_rules() -> list[tuple[str, str]]:
    """``--strategy auto``'s rules in the order it reads them: (criterion, the rule in one line)."""
    from kdist_magics.choose.advisor import RULES

    return [(rule.criterion, rule.doc) for rule in RULES]
