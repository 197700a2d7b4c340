"""``%kdist scale``'s predictions, checked, as ``benchmarks/scale_prediction.py``
(P10) measures them: a shell with kdist in a network namespace of its own whose loopback is
limited with ``tc ... tbf rate`` (``netem`` is not available here), so the engines' link is a
slow one; each rank computes on one thread pinned to a core of its own (as each rank would have
a device of its own), so a rank's compute is the same at 1 and 2 ranks on this 2-core machine.
The probe predicts the 2-rank step from the 1-rank probe and the measured link; the measured
2-rank step must be within 20 % of it, for a compute-bound model (a small CNN, a batch of 512
per rank) and a communication-bound one (a wide Dense model, a batch of 16), and the verdicts
differ. Each model then runs once more on 2 ranks over the slow link, and its live split
(the all-reduce timed on every rank) puts the link where it is: in communication for the wide
model, whose gradients the link holds up, not in compute, which stays near the 1-rank step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from test_netns import netns_unavailable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from scale_prediction import probe_on_a_slow_link, probe_on_two_hosts  # noqa: E402

#: not the netns tier's marker: that tier runs beside two other sessions, whose load on this
#: 2-core machine a rank's compute would feel at 2 ranks and not at 1 (a rehearsal saw a CNN's
#: 2-rank step 80% over its prediction there, and the probe rightly said the ranks slowed each
#: other); its namespace's name is its own (kdist-scale-<pid>), so the main suite, which runs
#: alone, takes it
#: how the probe's advice begins where the ranks slowed each other beyond what the link explains
CONTENDED = "the ranks slow each other down"

pytestmark = [pytest.mark.engines, pytest.mark.horovod, pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_probe_predicts_two_ranks_within_20_percent_and_the_verdicts_differ():
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here (make test builds it into .venv)")
    out = probe_on_a_slow_link(split=True)
    if any(t["advice"] and CONTENDED in t["advice"][0] for t in (out["wide"], out["cnn"])):
        # the probe itself found the ranks slowing each other beyond the link (two pinned ranks
        # share this VM's memory bandwidth: the CNN's 2-rank step ran 11-28 % over its 1-rank
        # one from run to run, rehearsal 29 the most; rehearsal 35 saw 26 % with a prediction
        # within 19 %, so the verdict, not the error, said so), so that run tested the host, not
        # the model; the probe runs once more, and its figures and verdicts are judged
        print(out["wide"]["text"] + "\n" + out["cnn"]["text"])
        print("the ranks slowed each other down: the probe again")
        out = probe_on_a_slow_link(split=True)
    wide, cnn = out["wide"], out["cnn"]
    for table in (wide, cnn):
        print(table["text"])
        (error,) = table["errors"].values()
        assert error <= 0.20, table["text"]
        assert table["bandwidth"] < 30e6, table["text"]  # the link's tbf rate, not loopback's
        # timed through the collective the cell uses (Horovod's), not kdist's own ring
        assert "; link (Horovod's all-reduce) " in table["text"], table["text"]
    assert wide["advice"][0].startswith("communication-bound: "), wide["text"]
    assert cnn["advice"][0].startswith("compute-bound: "), cnn["text"]
    assert wide["speedups"][1] < 1 < cnn["speedups"][1]
    from kdist_magics.messages import SPLIT_TIMED

    for name, table in (("wide", wide), ("cnn", cnn)):
        rows = table["split"]
        print(name, rows)
        assert len(rows) == 2 and all(r["source"] == SPLIT_TIMED for r in rows), rows
    # the slow link is the wide model's communication, not its compute
    comm = min(r["communication_s"] for r in wide["split"])
    assert all(comm > 2 * r["compute_s"] for r in wide["split"]), wide["split"]
    assert all(r["compute_s"] > r["communication_s"] for r in cnn["split"]), cnn["split"]


@pytest.mark.long  # the long tier's session: it asserts what the probe says, not its timing
def test_ranks_on_two_hosts_time_the_link_between_them_and_more_hosts_are_predicted():
    """One rank on each of two namespace hosts whose way out is held to 200 Mbit/s: the probe
    times the link between the hosts with Horovod's all-reduce (a tbf rate, not loopback's), says
    so (2 hosts), checks its 2-rank prediction against the measured 2-rank step, and predicts 4
    and 8 hosts over that link; the next cell runs. P10's error on two hosts is make bench's
    (``scale_prediction.py --hosts 2``): beside the other sessions a timing says little."""
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here (make test builds it into .venv)")
    wide = probe_on_two_hosts(models=1)["wide"]
    text = wide["text"]
    print(text)
    assert wide["hosts"] == 2 and "(Horovod's all-reduce) " in text and "(2 ranks, 2 hosts)" in text, text
    assert wide["bandwidth"] < 30e6, text  # the veths' tbf rate, not the bridge's
    assert list(wide["errors"]) == ["2"], text  # the measured 2-rank step, against its prediction
    assert list(wide["more_hosts"]) == ["4", "8"], text
    assert "more hosts, 1 rank each, over the link between hosts as measured (2 hosts): 4 hosts ~" in text
