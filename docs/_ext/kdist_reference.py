"""Sphinx directives that write the reference from the code (``kdist_tables.py``).

``{kdist-cell-options}``  every ``%%kdist`` option, as a cross-referenceable ``{option}``
``{kdist-cell-help}``     the text ``%%kdist?`` shows, verbatim
``{kdist-line-commands}`` the ``%kdist`` line commands and the text ``%kdist?`` shows
``{kdist-config}``        every ``%config KDist.*`` setting, as a ``{confval}``
``{kdist-advisor-rules}`` ``--strategy auto``'s rules, in order (``choose.advisor.RULES``)

The directives write MyST and let the page's parser read it, so the pages look like hand-written
ones, but every word comes from the definitions the magics use.
"""

from __future__ import annotations

import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

_SPECIAL = re.compile(r"([\\`*_\[\]<>|{}$~#])")


def escape(text: str) -> str:
    """Plain text as MyST that reads back as the same text."""
    return _SPECIAL.sub(r"\\\1", " ".join(text.split()))


def _literal(text: str) -> str:
    return f"``{text}``" if "`" in text else f"`{text}`"


class _Generated(SphinxDirective):
    has_content = False

    def lines(self) -> list[str]:
        raise NotImplementedError

    def run(self):
        box = nodes.container()
        self.state.nested_parse(StringList(self.lines(), source="kdist_tables"), self.content_offset, box)
        return box.children


def _option_lines(row: dict) -> list[str]:
    flags = ", ".join(f"{flag} {row['metavar']}" if row["metavar"] else flag for flag in row["flags"])
    lines = [f"```{{option}} {flags}", escape(row["help"])]
    if row["choices"]:
        lines += ["", "Accepts: " + ", ".join(_literal(c) for c in row["choices"]) + "."]
    return lines + ["```", ""]


class CellOptions(_Generated):
    def lines(self):
        from kdist_tables import cell_options

        out = ["```{program} %%kdist", "```", ""]
        for row in cell_options():
            out += _option_lines(row)
        return out


class CellHelp(SphinxDirective):
    def run(self):
        from kdist_tables import cell_help

        return [nodes.literal_block(text=cell_help().strip("\n"), language="text")]


class LineCommands(_Generated):
    def lines(self):
        from kdist_tables import line_commands, line_help

        out = ["| command | what it does |", "| --- | --- |"]
        out += [f"| `%kdist {name}` | {escape(text)} |" for name, text in line_commands().items()]
        return out + ["", "`%kdist?` shows:", "", "```text", *line_help().strip("\n").splitlines(), "```"]


class Config(_Generated):
    def lines(self):
        from kdist_tables import config_settings

        out = []
        for row in config_settings():
            out += [
                f"```{{confval}} KDist.{row['name']}",
                f":type: {row['type']}",
                f":default: {_literal(row['default'])}",
                "",
                escape(row["help"]),
            ]
            if row["choices"]:
                out += ["", "Accepts: " + ", ".join(_literal(c) for c in row["choices"]) + " (any case)."]
            out += ["```", ""]
        return out


class AdvisorRules(_Generated):
    def lines(self):
        from kdist_tables import advisor_rules

        out = ["| criterion | rule, in the order auto reads them |", "| --- | --- |"]
        return out + [f"| {criterion} | {doc.replace('|', '/')} |" for criterion, doc in advisor_rules()]


def setup(app):
    app.add_directive("kdist-cell-options", CellOptions)
    app.add_directive("kdist-cell-help", CellHelp)
    app.add_directive("kdist-line-commands", LineCommands)
    app.add_directive("kdist-config", Config)
    app.add_directive("kdist-advisor-rules", AdvisorRules)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
