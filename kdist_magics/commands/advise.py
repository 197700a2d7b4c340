"""``%kdist advise [options]``: ``--strategy auto``'s reasoning as a table, after the figures a
``%kdist scale`` measured on this kernel's last probed cell."""

from __future__ import annotations


def run(magics, rest: str):
    from ..choose.advisor import advise, hardware_for

    if magics.last_scale is not None:  # measured figures first, then the rules
        from ..scale.probe import quote

        quote(magics.last_scale)
    return advise(magics.shell.user_ns, magics.parse(rest), hardware=hardware_for(magics))
