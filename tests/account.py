"""The suite's own account of where its time went: a pytest plugin (loaded by conftest).

At the end of a session it writes ``<test output>/account.json`` (``$KDIST_ACCOUNT.json`` where
that is set): seconds per tier (a test's tier is its most specific marker, in :data:`TIERS` order), per module, the slowest tests, and
how many engine clusters were started and by which test. ``scripts/test_account.py`` prints
the account of every environment ``make test`` ran (``.venv``, ``.venv-colab``) side by side.

Clusters are counted by kdist itself: where ``KDIST_CLUSTER_LOG`` names a file, every cluster
kdist starts (owned, or attached to somebody else's) appends one line to it, from whichever
process started it (the test process, a kernel the test drives, a notebook's kernel), with the
test that was running when that process was started (``PYTEST_CURRENT_TEST``).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

#: a test's tier: the first of these markers it carries; "fast" when it carries none
TIERS = ("browser", "classic", "notebook", "slurm", "netns", "stacks", "docs", "ray", "long", "engines", "kernel")
SLOWEST = 15


def tier_of(item) -> str:
    names = {m.name for m in item.iter_markers()}
    return next((t for t in TIERS if t in names), "fast")


class Account:
    def __init__(self, output: Path, name: str = "account"):
        self.output = output.resolve()  # kernels run the notebooks in other folders
        self.name = name  # two sessions sharing one output folder (the suite, then the docs)
        self.log = self.output / f"{name}-clusters.log"
        self.tests: dict[str, dict] = {}
        self.started = time.monotonic()

    # -- pytest hooks ---------------------------------------------------------------------
    def pytest_sessionstart(self, session):
        self.output.mkdir(parents=True, exist_ok=True)
        self.log.write_text("")
        os.environ["KDIST_CLUSTER_LOG"] = str(self.log)  # kernels and engines inherit it

    def pytest_runtest_logreport(self, report):
        row = self.tests.setdefault(report.nodeid, {"seconds": 0.0, "outcome": "passed"})
        row["seconds"] += report.duration
        if report.failed:
            row["outcome"] = "failed"
        elif report.skipped and row["outcome"] == "passed":
            row["outcome"] = "skipped"

    def pytest_collection_modifyitems(self, items):
        self.tiers = {item.nodeid: tier_of(item) for item in items}

    def pytest_sessionfinish(self, session, exitstatus):
        summary = self.summary()
        (self.output / f"{self.name}.json").write_text(json.dumps(summary, indent=1))

    # -- the account ----------------------------------------------------------------------
    def clusters(self) -> list[dict]:
        rows = []
        for line in self.log.read_text().splitlines() if self.log.exists() else ():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return rows

    def summary(self) -> dict:
        tiers: dict[str, dict] = defaultdict(lambda: {"seconds": 0.0, "tests": 0})
        modules: dict[str, float] = defaultdict(float)
        for nodeid, row in self.tests.items():
            tier = tiers[getattr(self, "tiers", {}).get(nodeid, "fast")]
            tier["seconds"] += row["seconds"]
            tier["tests"] += 1
            modules[nodeid.split("::")[0]] += row["seconds"]
        slowest = sorted(self.tests.items(), key=lambda kv: -kv[1]["seconds"])[:SLOWEST]
        clusters = self.clusters()
        by_test: dict[str, int] = defaultdict(int)
        for c in clusters:
            by_test[c.get("test") or "(outside a test)"] += 1
        return {
            "wall_seconds": round(time.monotonic() - self.started, 1),
            "tiers": {
                k: {"seconds": round(v["seconds"], 1), "tests": v["tests"]}
                for k, v in sorted(tiers.items(), key=lambda kv: -kv[1]["seconds"])
            },
            "modules": {k: round(v, 1) for k, v in sorted(modules.items(), key=lambda kv: -kv[1])},
            "slowest": [{"test": k, "seconds": round(v["seconds"], 1), "outcome": v["outcome"]} for k, v in slowest],
            "clusters": {
                "started": len(clusters),
                "owned": sum(1 for c in clusters if c.get("owned")),
                "by_test": dict(sorted(by_test.items(), key=lambda kv: -kv[1])),
            },
        }
