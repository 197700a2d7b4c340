"""kdist's own lines: news on stdout, warnings on stderr (Jupyter shows stderr in red); the
words for lost telemetry in one place."""

from __future__ import annotations

import re
from pathlib import Path

import kdist_magics
from kdist_magics.messages import lost_batches, say


def test_say_puts_news_on_stdout_and_warnings_on_stderr(capsys):
    say("starting 2 engines on this machine (loopback only)...")
    say("\ninterrupted; stopping every rank...")
    say("the run stopped mid-way", warn=True)
    out = capsys.readouterr()
    assert out.out == (
        "kdist: starting 2 engines on this machine (loopback only)...\n\nkdist: interrupted; stopping every rank...\n"
    )
    assert out.err == "kdist: the run stopped mid-way\n"


def test_lost_batches_words():
    assert lost_batches(1).startswith("1 telemetry batch lost in transit")
    assert lost_batches(3).startswith("3 telemetry batches lost in transit")


def test_no_module_prints_its_own_kdist_lines():
    """Every ``kdist:`` line goes through say(): no print or stream write of one elsewhere."""
    package = Path(kdist_magics.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if path.parent.name == "messages":  # the words themselves
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""(print|\.write)\(\s*f?["'](\\n)?kdist: """, line):
                offenders.append(f"{path.relative_to(package)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
