"""Fast tier: the version shims (the `compat_*` modules of each component) work on both sides
of each change."""

import pytest

from kdist_magics.cluster.compat_psutil import net_connections


class NewPsutil:  # psutil >= 6.0
    def net_connections(self, kind):
        return [("new", kind)]


class OldPsutil:  # psutil 5.9 (Colab's 5.9.5)
    def connections(self, kind):
        return [("old", kind)]


def test_net_connections_on_both_psutils():
    assert net_connections(NewPsutil(), "tcp") == [("new", "tcp")]
    assert net_connections(OldPsutil(), "tcp") == [("old", "tcp")]
    assert net_connections(OldPsutil()) == [("old", "inet")]


def test_colab_widget_manager_is_enabled_once_and_only_on_colab(monkeypatch):
    import sys
    import types

    from kdist_magics.watch import compat_colab

    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    assert compat_colab.colab_widgets_enabled() is False  # not on Colab: nothing
    calls = []
    colab = types.ModuleType("google.colab")
    colab.output = types.SimpleNamespace(enable_custom_widget_manager=lambda: calls.append(1))
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    assert compat_colab.colab_widgets_enabled() is True
    assert compat_colab.colab_widgets_enabled() is False and calls == [1]  # once per kernel


def test_device_put_takes_keras_variables_only_while_a_cell_runs():
    jax = pytest.importorskip("jax", reason="JAX is in the core install (make test has it)")
    import numpy as np

    from kdist_magics.strategies.frameworks.compat_jax import device_put_takes_keras_variables

    original = jax.device_put
    with device_put_takes_keras_variables():
        assert jax.device_put is not original and jax.device_put.__wrapped__ is original
        put = jax.device_put({"a": np.arange(3.0), "b": [np.ones(2)]})  # other leaves: untouched
        np.testing.assert_array_equal(put["a"], np.arange(3.0))
        np.testing.assert_array_equal(put["b"][0], np.ones(2))
    assert jax.device_put is original


LOCATIONS_RANK = """
import sys
rank, port = int(sys.argv[1]), sys.argv[2]
import jax
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank)
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from kdist_magics.strategies.frameworks.compat_jax import locations_alike
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), np.ones(4) * (rank + 1))
cell = "total = float(jax.jit(lambda a: a.sum())(x))"   # one cell, a file of its own per process
before = jax.config.jax_traceback_in_locations_limit
with locations_alike():
    exec(compile(cell, f"/tmp/ipykernel_{rank}/cell.py", "exec"))
print("total", total, "limit back", jax.config.jax_traceback_in_locations_limit == before)
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_one_cell_compiles_to_one_program_on_every_jax_process(tmp_path):
    """JAX 0.12.1: the same jit with a collective, run from a differently named file on each
    process (as IPython kernels name a cell), returns under locations_alike (it hung there)."""
    pytest.importorskip("jax", reason="JAX is in the core install (make test has it)")
    import subprocess
    import sys

    from kdist_magics.cluster.network import free_port

    script = tmp_path / "rank.py"
    script.write_text(LOCATIONS_RANK)
    port = str(free_port("127.0.0.1"))
    env = {**__import__("os").environ, "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in (0, 1)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=90)[0])
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-2000:]
        # 4 x 1 + 4 x 2 over both processes' halves; the limit is back to JAX's own after
        assert "total 12.0 limit back True" in out, out[-2000:]


def test_locations_alike_only_while_a_cell_runs():
    jax = pytest.importorskip("jax", reason="JAX is in the core install (make test has it)")
    from kdist_magics.strategies.frameworks.compat_jax import locations_alike

    before = jax.config.jax_traceback_in_locations_limit
    with locations_alike():
        assert jax.config.jax_traceback_in_locations_limit == 0
    assert jax.config.jax_traceback_in_locations_limit == before
