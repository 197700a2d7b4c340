"""``%kdist scale``'s predictions, checked (issue 46.4): the kernel and its engines run in a
network namespace of their own whose loopback is limited with ``tc ... tbf rate`` (``netem`` is
not available here), so the engines' link is a slow one. The probe predicts the 2-rank step from
the 1-rank probe and the measured link; the measured 2-rank step must be within 20 % of it, for
a compute-bound model (a small CNN, a batch of 256 per rank) and a communication-bound one (a
wide Dense model, a batch of 16), and the verdicts differ. Each engine runs one thread
(``KDist.threads_per_rank = 1``, as each rank would have a device of its own), so a rank's
compute is the same at 1 and 2 ranks on this 2-core machine; engines kdist starts there stay in
that namespace (``KDist.private_network = False``).
"""

from __future__ import annotations

import os
import textwrap

import pytest

from conftest import run_in_fresh_shell
from test_netns import _run, netns_unavailable

pytestmark = [pytest.mark.netns, pytest.mark.engines, pytest.mark.slow, pytest.mark.timeout(900)]

#: the namespace's loopback: 200 Mbit/s, shared by both directions of the engines' traffic
RATE = "200mbit"

WIDE = """
import numpy as np, keras
x = np.random.default_rng(hvd.rank()).normal(size=(1024, 256)).astype("float32"); y = x[:, :1]
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dense(512, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
model.fit(x, y, batch_size=16, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""

CNN = """
import numpy as np, keras
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(2048, 32, 32, 3)).astype("float32"); y = (x.mean(axis=(1, 2, 3)) > 0).astype("int64")
model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
                          keras.layers.Conv2D(32, 3, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=256, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""

BODY = """
ip.run_line_magic("config", "KDist.threads_per_rank = 1")
ip.run_line_magic("config", "KDist.private_network = False")
for name, cell in (("wide", WIDE), ("cnn", CNN)):
    table = ip.run_cell_magic("kdist", "scale --strategy horovod --np 2 --no-dashboard --timeout 300", cell)
    out[name] = {"text": repr(table), "errors": table.prediction_errors(), "advice": table.advice,
                 "speedups": [r.speedup for r in table.rows], "bandwidth": table.link.bandwidth}
ip.run_line_magic("kdist", "stop")
"""


def test_the_probe_predicts_two_ranks_within_20_percent_and_the_verdicts_differ():
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here (make test "
                                                      "builds it into .venv)")
    ns = f"kdist-scale-{os.getpid()}"
    _run("ip", "netns", "add", ns)
    try:
        # a network's packet size, not loopback's 64 KiB (tbf drops a packet over its burst)
        _run("ip", "-n", ns, "link", "set", "lo", "mtu", "1500", "up")
        _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate",
             RATE, "burst", "64kb", "latency", "100ms")
        out = run_in_fresh_shell(f"WIDE, CNN = {WIDE!r}, {CNN!r}\n" + textwrap.dedent(BODY), {},
                                 prefix=("ip", "netns", "exec", ns))
    finally:
        _run("ip", "netns", "del", ns, check=False)
    wide, cnn = out["wide"], out["cnn"]
    for table in (wide, cnn):
        print(table["text"])
        (error,) = table["errors"].values()
        assert error <= 0.20, table["text"]
        assert table["bandwidth"] < 30e6, table["text"]  # the ring saw the tbf rate, not loopback's
    assert wide["advice"][0].startswith("communication-bound: "), wide["text"]
    assert cnn["advice"][0].startswith("compute-bound: "), cnn["text"]
    assert wide["speedups"][1] < 1 < cnn["speedups"][1]
