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
