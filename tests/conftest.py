"""Shared fixtures. Importing this isolates IPython and Jupyter state in temp folders
(before anything reads them), so tests never touch the developer's profiles."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_driver import isolated_env  # noqa: E402

_HOME = Path(tempfile.mkdtemp(prefix="kdist-tests-"))
isolated_env(_HOME, env=os.environ)  # this process: before anything reads these variables

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = Path(os.environ.get("KDIST_TEST_OUTPUT", ROOT / "test-output"))


def pytest_configure(config):
    """The suite's account of its time and clusters (tests/account.py), in OUTPUT/account.json;
    the check that nothing kdist started outlives the session (tests/leftovers.py)."""
    from account import Account

    from leftovers import Leftovers

    config.pluginmanager.register(Account(OUTPUT, os.environ.get("KDIST_ACCOUNT", "account")), "kdist-account")
    config.pluginmanager.register(Leftovers(), "kdist-leftovers")  # nothing kdist started is left


@pytest.fixture(scope="session")
def test_output() -> Path:
    """Folder for artefacts a person may want to look at (screenshots, executed notebooks)."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return OUTPUT


@pytest.fixture(scope="session")
def shell():
    """One IPython shell for the session with kdist loaded.

    ``shell.run_cell_magic`` re-raises what the magic raises, so tests see the
    exact exception type (UsageError, CellFailed, ...).
    """
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kdist_magics")
    yield ip
    ip.run_line_magic("unload_ext", "kdist_magics")


@pytest.fixture
def ip(shell):
    """The session shell with a clean user namespace and default configuration."""
    import kdist_magics

    ext = kdist_magics._extension
    saved = {name: getattr(ext, name) for name in ext.trait_names() if ext.trait_metadata(name, "config")}
    keep = dict(shell.user_ns)
    from traitlets.config import Config

    section = Config(__import__("copy").deepcopy(dict(shell.config.get("KDist", {}))))
    yield shell
    for name, value in saved.items():
        setattr(ext, name, value)
    # %config also writes into the shell's config, which a reloaded extension would read
    shell.config["KDist"] = section
    shell.user_ns.clear()
    shell.user_ns.update(keep)


def run_cell(ip, source: str):
    """Run ``source`` as a notebook cell would and re-raise its error, if any."""
    result = ip.run_cell(source, store_history=False)
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        raise error
    return result.result


def python_without(*modules: str) -> str:
    """Snippet that fails if any of ``modules`` got imported."""
    return f"import sys; bad=[m for m in {modules!r} if m in sys.modules]; assert not bad, bad"


PY = sys.executable


from kernel_driver import FRESH_SHELL_PRELUDE, run_in_fresh_shell  # noqa: E402,F401  (one runner)


#: a cell for multiworker across processes (JAX, torch): a small regression trained with
#: ``fit`` on whole arrays, leaving per rank its weights, losses, steps and first random draw
PROCESS_FIT = """
import numpy as np, keras
rng = np.random.default_rng(0)
x = rng.normal(size=(257, 4)).astype("float32")   # 257: one sample left out, 128 per process
y = (x @ np.array([1., -2., .5, 3.], dtype="float32"))[:, None]
kd_first = float(np.random.random())   # kdist seeds every process alike for each run
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
class Seen(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.steps = 0
    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
seen = Seen()
history = model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[seen])
kd_weights = [w.tolist() for w in model.get_weights()]
kd_loss = history.history["loss"]
kd_steps = seen.steps
"""


@pytest.fixture
def user_cluster(tmp_path):
    """A user's cluster of 2 engines (test_multiworker, test_scale): ``ipcluster start`` on
    loopback with a known cluster id; stopped by the test, by its pids."""
    import time

    import ipyparallel as ipp

    from kdist_magics.cluster.cluster import kill_pids
    from kdist_magics.cluster.lifetime import process_tree

    cluster_id = f"kdist-user-{int(time.time())}"
    cluster = ipp.Cluster(n=2, cluster_id=cluster_id, controller_ip="127.0.0.1", log_level=40, shutdown_atexit=False)
    cluster.start_cluster_sync()
    client = cluster.connect_client_sync()
    client.wait_for_engines(2, timeout=120)
    engine_pids = set(client[:].apply_sync(__import__("os").getpid))
    client.close()
    roots = {cluster.controller.pid} | {l.pid for es in cluster.engines.values() for l in es.launchers.values()}
    tree = process_tree(roots)
    try:
        yield cluster_id, engine_pids
    finally:
        try:
            cluster.stop_cluster_sync()
        except Exception:
            pass
        kill_pids(tree, grace=5)  # nannies may linger ~30 s after stop_cluster: end ours by pid
