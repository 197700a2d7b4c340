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

