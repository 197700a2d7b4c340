"""``%kdist scale [options]``: the probe (:mod:`..scale.probe`) on the last cell that trained,
its options with those given here on top."""

from __future__ import annotations

from dataclasses import replace

from IPython.core.error import UsageError

from ..messages import SCALE_NOTHING_TRAINED


def run(magics, rest: str):
    from ..scale.probe import scale

    if magics.last_trained is None:
        raise UsageError(SCALE_NOTHING_TRAINED)
    spec, cell = magics.last_trained
    if rest:
        given = magics.parse(rest)
        spec = replace(spec, **{name: getattr(given, name) for name in given.given})
    return scale(magics, spec, cell)
