"""``%kdist scale``'s predictions, checked (issue 46.4): two engines as two hosts in network
namespaces (tests/test_netns.py's ``Hosts``, one engine each), host B's link limited with
``tc ... tbf rate`` in both directions (``netem`` is not available here). The probe predicts the
2-rank step from the 1-rank probe and the measured link; the measured 2-rank step must be within
20 % of it, for a compute-bound model (a small CNN, a batch of 64 per rank) and a
communication-bound one (a wide Dense model, a batch of 16), and the verdicts differ. The
engines run one thread each (as each rank would have a device of its own), so a rank's compute
is the same at 1 and 2 ranks on this 2-core machine.
"""

from __future__ import annotations

import os

import pytest

import kdist_magics
import test_netns
from test_netns import Hosts, _run, netns_unavailable

pytestmark = [pytest.mark.netns, pytest.mark.engines, pytest.mark.slow, pytest.mark.timeout(900)]

#: host B's link: 100 Mbit/s each way
RATE = "100mbit"

HVD_WIDE = """
import numpy as np, keras
x = np.random.default_rng(hvd.rank()).normal(size=(1024, 256)).astype("float32"); y = x[:, :1]
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dense(512, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
model.fit(x, y, batch_size=16, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""

HVD_CNN = """
import numpy as np, keras
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(2048, 32, 32, 3)).astype("float32"); y = (x.mean(axis=(1, 2, 3)) > 0).astype("int64")
model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
                          keras.layers.Conv2D(32, 3, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""


@pytest.fixture(scope="module")
def limited():
    """Two "hosts", one engine each, one thread per engine; host B's link at :data:`RATE`."""
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed here (make test "
                                                      "builds it into .venv)")
    saved_hosts, test_netns.HOSTS = test_netns.HOSTS, {"kd-host-a": 1, "kd-host-b": 1}
    threads = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    saved_env = {k: os.environ.get(k) for k in threads}
    h = Hosts()
    try:
        h.build()
        ns_b, veth_b = h.namespaces["kd-host-b"], h.veths[1]
        for where in (["tc"], ["ip", "netns", "exec", ns_b, "tc"]):
            dev = veth_b if where == ["tc"] else h.inner
            _run(*where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", RATE, "burst", "64kb",
                 "latency", "100ms")
        h.start_controller()
        os.environ.update(threads)
        h.launch_engines()
        yield h
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        test_netns.HOSTS = saved_hosts
        h.destroy()
        if h.log is not None:
            h.log.close()
        assert h.tag not in _run("ip", "netns", "list", check=False).stdout


def probe(shell, hosts, cell: str):
    ext = kdist_magics._extension
    saved = ext.bind_address
    ext.bind_address = hosts.bridge_ip  # Horovod's rendezvous, reachable from the namespaces
    try:
        return shell.run_cell_magic("kdist", f"scale --strategy horovod --np 2 --no-dashboard "
                                             f"--cluster-id {hosts.cluster_id}", cell)
    except Exception:
        print("engine log:\n" + hosts.engine_log())
        raise
    finally:
        ext.bind_address = saved


def test_the_probe_predicts_two_ranks_within_20_percent_and_the_verdicts_differ(shell, limited):
    shell.run_line_magic("kdist", "stop")
    wide = probe(shell, limited, HVD_WIDE)
    cnn = probe(shell, limited, HVD_CNN)
    shell.run_line_magic("kdist", "stop")
    for table in (wide, cnn):
        print(repr(table))
        assert table.link.hosts == 2 and table.link.ranks == 2
        assert table.link.bandwidth < 13e6  # the tbf rate (12.5 MB/s) is what the ring saw
        (error,) = table.prediction_errors().values()
        assert error <= 0.20, repr(table)
    assert wide.advice[0].startswith("communication-bound: ")
    assert cnn.advice[0].startswith("compute-bound: ")
    assert wide.rows[1].speedup < 1 < cnn.rows[1].speedup
