"""``%kdist start [options]``: warm the engines for these options (:mod:`..strategies.engines.warm`)."""

from __future__ import annotations

from IPython.core.error import UsageError

from .. import spec as specmod
from ..messages import say, warm_started
from ..strategies.base import RunOptions
from ..watch.record import RunRecord


def run(magics, rest: str) -> None:
    from ..strategies import RunContext

    spec = magics.parse(rest)
    if spec.strategy == "auto":
        spec, _ = magics.choose(spec)
    if specmod.KINDS.get(spec.strategy) != "engines":
        raise UsageError(
            f"%kdist start warms engines (--strategy "
            f"{' or '.join(specmod.ENGINE_STRATEGIES)}); {spec.strategy} runs in the "
            f"notebook's own kernel and needs no start"
        )
    strategy = magics.strategy_object(spec.strategy)
    record = RunRecord(spec.strategy, size=strategy.size(spec), spec=spec)
    ctx = RunContext(shell=magics.shell, spec=spec, record=record, options=RunOptions.of(magics), quiet=True)
    warming = strategy.warm(ctx)
    say(warm_started(warming.n, spec.strategy, strategy.warm_modules))
