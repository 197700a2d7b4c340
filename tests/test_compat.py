"""Fast tier: the version shims in kdist_magics.compat work on both sides of each change."""

from kdist_magics.compat import net_connections


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

    from kdist_magics import compat

    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    assert compat.colab_widgets_enabled() is False  # not on Colab: nothing
    calls = []
    colab = types.ModuleType("google.colab")
    colab.output = types.SimpleNamespace(enable_custom_widget_manager=lambda: calls.append(1))
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    assert compat.colab_widgets_enabled() is True
    assert compat.colab_widgets_enabled() is False and calls == [1]  # once per kernel
