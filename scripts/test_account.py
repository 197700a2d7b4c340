"""Print `make test`'s own account: each step's time (set-up and suites, from the steps file that
scripts/test.sh writes), each environment's time per tier, its slowest tests and the clusters it
started (from the account.json files tests/account.py writes).

    python scripts/test_account.py test-output/steps.tsv test-output/account.json test-output/colab/account.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def steps(path: Path) -> list[str]:
    """Rows ``step<TAB>seconds<TAB>exit status`` -> aligned lines."""
    if not path.exists():
        return [f"(no steps recorded in {path})"]
    rows = [(row.split("\t") + ["", ""])[:3] for row in path.read_text().splitlines()]
    width = max([40] + [len(name) for name, _, _ in rows])
    lines = []
    for name, seconds, status in rows:
        mark = "" if status in ("", "0") else f"  (exit {status})"
        lines.append(f"  {name:<{width}} {float(seconds) / 60:6.1f} min{mark}")
    return lines


def environment(path: Path) -> list[str]:
    if not path.exists():
        return [f"  (no account at {path}: that suite did not run)"]
    acc = json.loads(path.read_text())
    lines = [
        f"  pytest wall time {acc['wall_seconds'] / 60:.1f} min; per tier (test time, setup and teardown included):"
    ]
    for tier, row in acc["tiers"].items():
        lines.append(f"    {tier:<10} {row['seconds'] / 60:6.1f} min  {row['tests']:4d} tests")
    c = acc["clusters"]
    lines.append(
        f"  engine clusters started: {c['started']} ({c['owned']} owned by kdist, {c['started'] - c['owned']} attached)"
    )
    for test, count in list(c["by_test"].items())[:8]:
        lines.append(f"    {count:3d}  {test}")
    lines.append("  slowest tests:")
    for row in acc["slowest"][:10]:
        lines.append(
            f"    {row['seconds']:7.1f} s  {row['test']}"
            + ("" if row["outcome"] == "passed" else f"  [{row['outcome']}]")
        )
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = ["", "=" * 30 + " make test: the account " + "=" * 30, "steps:"]
    out += steps(Path(argv[0]))
    for acc in argv[1:]:
        out += ["", f"{acc}:"] + environment(Path(acc))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
