"""The ``%%kdist`` cell magic and ``%kdist`` line magic: parse, choose, run.

One execute path: line -> :class:`~kdist_magics.spec.RunSpec` -> strategy ->
:class:`~kdist_magics.watch.record.RunRecord`. Defaults are traitlets, so
``%config KDist.np = 4`` works.
"""

from __future__ import annotations

from typing import Any

from IPython.core.magic import cell_magic, line_magic, magics_class

from . import spec as specmod
from .errors import quiet_cell_failed
from .messages import backend_changed, line_help, say, tensorboard_line
from .settings import Settings
from .watch.record import RunRecord


@magics_class
class KDist(Settings):
    """Distributed Keras training from one notebook cell (its ``%config KDist`` settings are
    :class:`~kdist_magics.settings.Settings`')."""

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        if shell is not None:
            shell.configurables.append(self)
            quiet_cell_failed(shell, install=True)
        self._strategies: dict[str, Any] = {}
        self.last_record: RunRecord | None = None
        self.last_trained: tuple[specmod.RunSpec, str] | None = None  # %kdist scale's default
        self.last_scale = None
        self._sharing_said = False  # the shared-host line (messages.shared_host) was printed
        self._observers: list = []

    def observe_runs(self, callback):
        """Call ``callback(record)`` with every new run's RunRecord before the run starts (to
        ``subscribe`` to its rows as they land: tests, benchmarks, tools). Returns a function
        that stops it."""
        self._observers.append(callback)
        return lambda: self._observers.remove(callback) if callback in self._observers else None

    # -- configuration -------------------------------------------------------
    def defaults(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "np": self.np,
            "devices": self.devices,
            "timeout": self.timeout,
            "out": self.out,
            "dashboard": self.dashboard,
            "telemetry": self.telemetry,
            "launcher": self.launcher,
        }

    def parse(self, line: str) -> specmod.RunSpec:
        return specmod.parse_line(line, self.defaults(), magic=self.kdist)

    def strategy_object(self, name: str):
        """The strategy kept for ``name`` (made on first use); a new one where the Keras backend
        has changed since the kept one was made for another (its engines stop, in one line)."""
        kept = self._strategies.get(name)
        if kept is not None and kept.backend is not None:
            from .strategies.frameworks.backends import keras_backend

            if (now := keras_backend()) != kept.backend:
                say(backend_changed(name, kept.backend, now))
                del self._strategies[name]
                kept.teardown()
        if name not in self._strategies:
            from .strategies import create

            self._strategies[name] = create(name)
        return self._strategies[name]

    # -- %%kdist -------------------------------------------------------------
    @specmod.declare
    @cell_magic
    def kdist(self, line: str, cell: str):
        """Run the cell distributed with a chosen strategy.

        Examples::

            %%kdist --strategy horovod --np 2 --pull model,history
            %%kdist --strategy mirrored --devices 2
            %%kdist                      # --strategy auto: picks one and says why
        """
        if line.split()[:1] == ["scale"]:  # %%kdist scale [options]: the probe, on this cell
            from .scale.probe import scale

            return scale(self, self.parse(line.split(None, 1)[1] if " " in line.strip() else ""), cell)
        spec = self.parse(line)
        reason = None
        if spec.strategy == "auto":
            spec, reason = self.choose(spec, cell)
            say(f"--strategy auto chose {spec.strategy}: {reason}")
        if spec.strategy == "multiworker":
            from .strategies.multiworker.run_script import refuse_torch_code_elsewhere

            refuse_torch_code_elsewhere(cell, self.shell.user_ns)
        strategy = self.strategy_object(spec.strategy)
        if strategy.in_kernel:
            from .strategies.kernel.tpu_hygiene import refuse_late_initialize

            refuse_late_initialize(self.shell.transform_cell(cell), spec.strategy)
        record = RunRecord(spec.strategy, size=strategy.size(spec), spec=spec, reason=reason)
        probed = self.last_scale
        if probed is not None and probed.strategy == spec.strategy and probed.cell == cell:
            from .strategies.frameworks.backends import keras_backend

            if probed.describes(spec.strategy, cell, record.size, keras_backend()):
                probed.lend(record)
            else:
                record.probe_other = True
        self.last_record = record
        for observe in list(self._observers):
            observe(record)
        if spec.tensorboard:
            from .watch.tensorboard import attach

            events = attach(record, spec.tensorboard)
            say(tensorboard_line(str(events.directory)))
        if spec.dashboard:
            from .watch.dashboard import show

            show(record, nice=self.helper_nice)  # a live view; finalises itself when the record ends
        value = self.execute(strategy, cell, spec, record)
        if any(m.get("kind") == "step" for m in record.metrics):
            self.last_trained = (spec, cell)
        return value

    def execute(
        self,
        strategy,
        cell: str,
        spec: specmod.RunSpec,
        record: RunRecord,
        probe: tuple[int, float | None] | None = None,
    ):
        """Run ``cell`` with ``strategy`` and finish ``record`` (:func:`.cell.execute`)."""
        from .cell import execute

        return execute(self, strategy, cell, spec, record, probe)

    def choose(self, spec: specmod.RunSpec, cell: str | None = None) -> tuple[specmod.RunSpec, str]:
        """Resolve ``--strategy auto``: from ``%kdist scale``'s figures on this cell where there
        are any (the ranks too, unless --np was given), else by the rules."""
        from .choose.advisor import choose, hardware_for

        if cell is not None and self.last_scale is not None and self.last_scale.cell == cell:
            from .scale.probe import choose_measured

            if (chosen := choose_measured(self.last_scale, spec)) is not None:
                return chosen

        name, reason = choose(self.shell.user_ns, spec, hardware=hardware_for(self))
        return spec.with_strategy(name), reason

    # -- %kdist --------------------------------------------------------------
    @line_magic("kdist")
    def kdist_line(self, line: str):
        # the docstring (what %kdist? shows) is messages.line_help(), set below the class
        from .commands import dispatch

        return dispatch(self, line)

    def close(self) -> None:
        """Tear down every strategy (engines, servers, connections)."""
        strategies, self._strategies = self._strategies, {}
        for strategy in strategies.values():
            strategy.teardown()


KDist.kdist_line.__doc__ = line_help()
