"""A launcher is registered, not a branch: kdist's own Slurm and Ray launchers and another
package's are found by name (the ``kdist_magics.launchers`` entry point), and a cell's
``--launcher`` starts the cluster the named one returns (fast tier: fakes, no engines)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kdist_magics.cluster import launchers
from kdist_magics.spec import RunSpec


def test_kdists_own_launchers_are_found_by_name():
    from kdist_magics.cluster import ray_engines, slurm_engines

    assert launchers.submitter("slurm") is slurm_engines.submit
    assert launchers.submitter("ray") is ray_engines.submit
    assert launchers.names()[0] == "local" and {"ray", "slurm"} <= set(launchers.names())
    with pytest.raises(LookupError, match="no launcher 'nowhere' is registered"):
        launchers.submitter("nowhere")


def fake_entry_points(group):
    assert group == launchers.GROUP
    return [
        SimpleNamespace(name="fake", value="test_launchers:fake_submit"),
        SimpleNamespace(name="slurm", value="test_launchers:fake_submit"),
    ]  # kdist's own stays


made = []


def fake_submit(n, ctx, news):
    news(f"placing {n} engines my way")
    made.append((n, ctx.spec.launcher))
    return "the fake launcher's cluster"


def test_another_packages_launcher_starts_the_cells_cluster(monkeypatch):
    from kdist_magics.cluster import slurm_engines
    from kdist_magics.strategies.engines import start

    monkeypatch.setattr(launchers, "entry_points", fake_entry_points)
    assert launchers.submitter("fake") is fake_submit
    assert launchers.submitter("slurm") is slurm_engines.submit
    said = []
    monkeypatch.setattr(start, "say", said.append)
    strategy = SimpleNamespace(size=lambda spec: 3)
    ctx = SimpleNamespace(spec=RunSpec(strategy="horovod", launcher="fake"), quiet=False)
    assert start.new_cluster(strategy, ctx) == "the fake launcher's cluster"
    assert made[-1] == (3, "fake") and said == ["placing 3 engines my way"]


def test_a_warm_cluster_of_another_launcher_is_not_reused(monkeypatch):
    from kdist_magics.strategies.engines import start

    torn = []
    cluster = SimpleNamespace(
        running=True, n=2, attached=False, cluster_id=None, profile=None, launcher="local", options=None
    )
    strategy = SimpleNamespace(cluster=cluster, size=lambda spec: 2, teardown=lambda: torn.append(True))
    monkeypatch.setattr(start, "say", lambda text: None)
    ctx = SimpleNamespace(spec=RunSpec(strategy="horovod", launcher="fake"), quiet=False)
    assert start.reuse(strategy, ctx) is None and torn == [True]


class HeldCluster:
    """What a run leaves behind: an owned cluster that a launcher keeps, or gives back, after a
    run that did not finish (``kept_after_a_failed_run``: Ray's gives back)."""

    owned = True

    def __init__(self, kept: bool):
        self.kept_after_a_failed_run = kept
        self.stopped = 0

    def give_up(self):
        pass

    def stop(self):
        self.stopped += 1


@pytest.mark.parametrize(
    "kept, exc, words",
    [
        (False, KeyboardInterrupt(), "the run was stopped"),
        (False, RuntimeError("a rank raised"), "the run failed"),
        (True, KeyboardInterrupt(), None),
    ],
)
def test_a_run_that_does_not_finish_gives_a_shared_clusters_engines_back(monkeypatch, capsys, kept, exc, words):
    """Stop or a failure mid-run: a cluster that is not kept then (Ray's: a team's resources) is
    stopped at once and the user told in one line; a local one stays warm for the next cell;
    a run that finishes keeps either."""
    from kdist_magics.strategies.engines import run as engine_run
    from kdist_magics.strategies.engines import start
    from kdist_magics.strategies.engines.strategy import EngineStrategy

    strategy = EngineStrategy()
    held = strategy.cluster = HeldCluster(kept)
    monkeypatch.setattr(start, "check_syntax", lambda cell, ctx: None)

    def go(run):
        run.cluster = held
        raise exc

    monkeypatch.setattr(engine_run.EngineRun, "go", go)
    ctx = SimpleNamespace(spec=RunSpec(strategy="horovod"), record=None)
    with pytest.raises(type(exc)):
        strategy.run("pass", ctx)
    out = capsys.readouterr().out
    if words is None:
        assert (held.stopped, strategy.cluster, out) == (0, held, "")
    else:
        assert (held.stopped, strategy.cluster) == (1, None) and words in out
        assert "removed their placement group" in out and out.count("\n") == 1

    held = strategy.cluster = HeldCluster(False)
    monkeypatch.setattr(engine_run.EngineRun, "go", lambda run: "the value")
    assert strategy.run("pass", ctx) == "the value" and held.stopped == 0  # a finished run keeps it
