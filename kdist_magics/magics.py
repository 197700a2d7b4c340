"""The ``%%kdist`` cell magic and ``%kdist`` line magic: parse, choose, run.

One execute path: line -> :class:`~kdist_magics.spec.RunSpec` -> strategy ->
:class:`~kdist_magics.watch.record.RunRecord`. Defaults are traitlets, so
``%config KDist.np = 4`` works.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from traitlets import Bool, CaselessStrEnum, Float, Integer, Unicode

from .cluster import namespace
from . import spec as specmod
from .errors import CellFailed, KDistError, StrategyUnavailable
from .messages import (EXPOSED, LINE_COMMANDS, NOT_RUN, PHASE_CELL, SCALE_NOTHING_TRAINED,
                       backend_changed, line_help, say,
                       shared_host, tensorboard_line, warm_started)
from .cluster.placement import RANK_GPUS
from .strategies.base import RunOptions
from .watch.record import RunRecord
from .watch.tf_logs import quiet_info


@magics_class
class KDist(Magics):
    """Distributed Keras training from one notebook cell."""

    strategy = CaselessStrEnum(specmod.STRATEGIES, default_value="auto",
                               help="strategy used when a cell gives no --strategy").tag(config=True)
    np = Integer(None, allow_none=True,
                 help="ranks for engine strategies when a cell gives no --np "
                      "(None: one per GPU, else 2)").tag(config=True)
    devices = Integer(None, allow_none=True,
                      help="mirrored replicas when a cell gives no --devices "
                           "(None: all GPUs, else 2 logical CPU devices)").tag(config=True)
    timeout = Float(None, allow_none=True,
                    help="seconds after which a run is stopped (None: no limit)").tag(config=True)
    out = CaselessStrEnum(specmod.OUT_MODES, default_value="rank0",
                          help="whose output engine strategies show").tag(config=True)
    launcher = CaselessStrEnum(specmod.LAUNCHERS, default_value="local",
                               help="where a cluster kdist starts runs its engines when a cell gives no "
                                    "--launcher: 'local' (this machine) or 'slurm' (a Slurm job kdist "
                                    "submits, watches and cancels; the controller listens on "
                                    "KDist.bind_address, which every node must reach)").tag(config=True)
    dashboard = Bool(True, help="show the live dashboard widget").tag(config=True)
    telemetry = Bool(True, help="attach the telemetry callback to fit()").tag(config=True)
    bind_address = Unicode(RunOptions.bind_address,
                           help="address the rendezvous/TF_CONFIG ports listen on for a local "
                                "cluster; attached clusters use an address every engine reaches"
                           ).tag(config=True)
    worker_network = Unicode(RunOptions.worker_network,
                             help="multiworker on an attached cluster: each engine's TF_CONFIG "
                                  "address: '' (the one it reaches the controller with), an "
                                  "interface name ('eth0'), a network ('10.0.0.0/16') or an "
                                  "address to route towards").tag(config=True)
    rank_gpus = CaselessStrEnum(RANK_GPUS, default_value=RunOptions.rank_gpus,
                                help="engine strategies: 'own' (each rank sees one GPU of its host, "
                                     "set before any framework starts; more ranks than GPUs is an "
                                     "error), 'shared' (ranks share GPUs round-robin, each with part of "
                                     "the memory), 'all' (every rank sees every GPU, as under "
                                     "horovodrun)").tag(config=True)
    threads_per_rank = Integer(RunOptions.threads_per_rank, allow_none=True,
                               help="intra-op threads per rank (None: cores / ranks)").tag(config=True)
    freeze_gc = Bool(RunOptions.freeze_gc, help="engine strategies: during a run, Python's cyclic GC skips the "
                                "objects each rank held before it (gc.freeze), so no full "
                                "collection stalls every rank at the next allreduce; cyclic "
                                "garbage among them is collected after the run").tag(config=True)
    tf_info_logs = Bool(RunOptions.tf_info_logs, help="show TensorFlow's Python INFO log lines (\"Reduce to ... then "
                                    "broadcast to ...\") inside kdist cells").tag(config=True)
    helper_nice = Integer(RunOptions.helper_nice, min=0, max=19,
                          help="nice value added to what kdist runs beside the ranks (the kernel's "
                               "dashboard and sampler threads, the controller, the engines' IOPub, "
                               "heartbeat, control and telemetry threads), so it never takes a "
                               "rank's core; 0 leaves every priority as it is").tag(config=True)
    same_user_only = Bool(RunOptions.same_user_only,
                          help="kdist's own listeners (the Horovod rendezvous, the abort line) "
                               "accept connections from this user only: on a shared host every user "
                               "shares loopback. False: anyone's (to debug with outside tools); "
                               "%kdist status says so").tag(config=True)
    private_network = Bool(RunOptions.private_network,
                           help="a cluster kdist starts runs its engines in a network namespace of "
                                "their own (no privilege needed where the host allows user "
                                "namespaces): nothing they listen on (Gloo, TF gRPC, the JAX "
                                "coordinator, torch's store) can be reached by other local users, "
                                "and the kernel reaches the controller over Unix sockets. Takes "
                                "effect at the next cluster start; %kdist status says which "
                                "holds").tag(config=True)
    preload = Bool(RunOptions.preload,
                   help="engines kdist starts import the strategy's framework (TensorFlow and "
                        "Horovod, TensorFlow, JAX or torch) as they start, while the controller and "
                        "the other engines start, instead of after them (not where GPUs are "
                        "visible: a rank's GPU is chosen as its run starts). Takes effect at the "
                        "next cluster start").tag(config=True)
    stop_grace = Float(RunOptions.stop_grace, help="seconds ranks get to stop after an interrupt (SIGINT) before "
                                 "they are killed and the engines restarted").tag(config=True)

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        if shell is not None:
            shell.configurables.append(self)
            _quiet_cell_failed(shell, install=True)
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
            "strategy": self.strategy, "np": self.np, "devices": self.devices,
            "timeout": self.timeout, "out": self.out,
            "dashboard": self.dashboard, "telemetry": self.telemetry, "launcher": self.launcher,
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
            return self._scale(self.parse(line.split(None, 1)[1] if " " in line.strip() else ""), cell)
        spec = self.parse(line)
        reason = None
        if spec.strategy == "auto":
            spec, reason = self.choose(spec, cell)
            say(f"--strategy auto chose {spec.strategy}: {reason}")
        if spec.strategy == "multiworker":
            self._check_launcher_code(cell)
        strategy = self.strategy_object(spec.strategy)
        if strategy.in_kernel:
            self._check_jax_initialize(cell, spec.strategy)
        record = RunRecord(spec.strategy, size=strategy.size(spec), spec=spec, reason=reason)
        probed = self.last_scale
        if probed is not None and probed.strategy == spec.strategy and probed.cell == cell:
            record.probe_compute_s = probed.compute_s
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

    def _scale(self, spec: specmod.RunSpec, cell: str):
        from .scale.probe import scale

        return scale(self, spec, cell)

    def _check_launcher_code(self, cell: str) -> None:
        """Code written for torchrun under another Keras backend: one line, nothing starts."""
        from .strategies.frameworks.backends import keras_backend
        from .strategies.multiworker.launcher_env import torch_code_elsewhere
        from .strategies.multiworker.run_script import SCRIPT_NAME

        script = self.shell.user_ns.get(SCRIPT_NAME) if SCRIPT_NAME in cell else None
        why = torch_code_elsewhere(script[0] if script else cell, keras_backend())
        if why is not None:
            raise StrategyUnavailable(why)

    def _check_jax_initialize(self, cell: str, name: str) -> None:
        """A cell in the kernel that joins a multi-host JAX job once JAX has started (or kdist
        will start it to find the devices): one line, before anything runs."""
        from .strategies.frameworks.backends import keras_backend
        from .errors import initialize_again, initialize_too_late
        from .strategies.kernel.tpu_hygiene import backend_started, calls_initialize, joined

        call = calls_initialize(self.shell.transform_cell(cell))
        if call is None:
            return
        if joined():
            raise initialize_again(call)
        if backend_started():
            why = "it has started in this kernel (an earlier cell used JAX or Keras on JAX)"
        elif keras_backend() == "jax" and name != "default":
            why = f"--strategy {name} starts it to find the devices before the cell runs"
        else:
            return
        raise initialize_too_late(call, why)

    def execute(self, strategy, cell: str, spec: specmod.RunSpec, record: RunRecord,
                probe: tuple[int, float | None] | None = None):
        from .strategies import RunContext

        ctx = RunContext(shell=self.shell, spec=spec, record=record, options=RunOptions.of(self),
                         probe=probe)
        if strategy.in_kernel:
            record.phase(PHASE_CELL)  # engine strategies name their own phases
        elif not spec.attach and getattr(strategy, "exposure", None) and not self._sharing_said:
            self._sharing_said = True  # once per kernel: what other users here could reach
            why = namespace.unavailable() if self.private_network else None
            if why or not self.private_network:
                from .cluster.peers import other_users

                uids = other_users()
                if uids:
                    say(shared_host(uids, EXPOSED[strategy.exposure], why), warn=True)
        try:
            with quiet_info(not self.tf_info_logs, stderr=strategy.in_kernel):  # set-up's too
                value = strategy.run(cell, ctx)
        except CellFailed as exc:
            status = getattr(exc, "status", "failed")  # "timeout", "interrupted": in the kernel
            if strategy.in_kernel:
                state = "stopped" if status == "interrupted" else "failed"
                for rank in record.ranks:
                    record.set_rank(rank, state=state, error=str(exc))
            record.finish(status, str(exc))
            raise
        except KeyboardInterrupt:
            record.finish("interrupted", "interrupted")
            raise
        except StrategyUnavailable as exc:  # "The cell did not run.": no dashboard stays
            record.finish(NOT_RUN, str(exc))
            raise
        except KDistError as exc:
            record.finish(getattr(exc, "status", "failed"), str(exc))
            raise
        except BaseException as exc:
            record.finish("failed", f"{type(exc).__name__}: {exc}")
            raise
        record.finish("done")
        return value

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
        words = line.split()
        if not words or words[0] not in LINE_COMMANDS:
            raise UsageError(f"%kdist takes one of: {', '.join(LINE_COMMANDS)} "
                             f"(to run a cell distributed, use %%kdist)")
        command, rest = words[0], line.strip()[len(words[0]):].strip()  # quoting kept (run)
        return getattr(self, f"_cmd_{command}")(rest)

    def _cmd_start(self, rest: str):
        from .strategies import RunContext
        from .strategies.engines import warm

        spec = self.parse(rest)
        if spec.strategy == "auto":
            spec, _ = self.choose(spec)
        if specmod.KINDS.get(spec.strategy) != "engines":
            raise UsageError(f"%kdist start warms engines (--strategy {' or '.join(specmod.ENGINE_STRATEGIES)}); "
                             f"{spec.strategy} runs in the notebook's own kernel and needs no start")
        strategy = self.strategy_object(spec.strategy)
        record = RunRecord(spec.strategy, size=strategy.size(spec), spec=spec)
        ctx = RunContext(shell=self.shell, spec=spec, record=record, options=RunOptions.of(self),
                         quiet=True)
        warming = warm.start(strategy, ctx)
        say(warm_started(warming.n, spec.strategy, strategy.warm_modules))

    def _cmd_run(self, rest: str):
        """``%kdist run [kdist options] script.py [script args]`` (:mod:`.strategies.multiworker.run_script`): the
        script as a cell, through the one execute path."""
        from .strategies.multiworker.run_script import script_cell

        found = script_cell(rest, parse=self.parse, user_ns=self.shell.user_ns)
        if found is not None:
            return self.kdist(*found)

    def _cmd_status(self, rest: str):
        lines = ["kdist status"]
        if not self._strategies:
            lines.append("  no strategy has run in this kernel yet")
        for name, strategy in self._strategies.items():
            facts = ", ".join(f"{k}={v}" for k, v in strategy.status().items()) or "ready"
            lines.append(f"  {name}: {facts}")
        lines.append(f"  last run: {self.last_record.summary() if self.last_record else 'none'}")
        if not self.same_user_only:
            lines.append("  isolation: off (KDist.same_user_only = False): kdist's rendezvous and "
                         "abort line accept any local user's connections")
        why = namespace.unavailable() if self.private_network else None
        lines.append("  private network: " + (
            f"not here ({why}): the engines share this host's loopback" if why else
            "on: a cluster kdist starts gets a network of its own" if self.private_network else
            "off (KDist.private_network = False): the engines share this host's loopback"))
        print("\n".join(lines))

    def _cmd_stop(self, rest: str):
        self.close()
        say("stopped everything kdist started")

    def _cmd_restart(self, rest: str):
        names = list(self._strategies)
        self.close()
        say(f"restarted ({', '.join(names) or 'nothing was running'}); "
            "engines start again with the next cell")

    def _cmd_scale(self, rest: str):
        """``%kdist scale [options]``: the probe on the last cell that trained (its options,
        with those given here on top)."""
        if self.last_trained is None:
            raise UsageError(SCALE_NOTHING_TRAINED)
        spec, cell = self.last_trained
        if rest:
            given = self.parse(rest)
            spec = replace(spec, **{name: getattr(given, name) for name in given.given})
        return self._scale(spec, cell)

    def _cmd_advise(self, rest: str):
        from .choose.advisor import advise, hardware_for

        if self.last_scale is not None:  # measured figures first, then the rules
            from .scale.probe import quote

            quote(self.last_scale)
        return advise(self.shell.user_ns, self.parse(rest), hardware=hardware_for(self))

    def close(self) -> None:
        """Tear down every strategy (engines, servers, connections)."""
        strategies, self._strategies = self._strategies, {}
        for strategy in strategies.values():
            strategy.teardown()


KDist.kdist_line.__doc__ = line_help()


def _show_cell_failed(shell, etype, value, tb, tb_offset=None):
    """Custom exception handler for :class:`CellFailed`: show nothing when the cell's own
    traceback is already on screen (its rendering is empty), else the usual rendering."""
    if value._render_traceback_():
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    return []


def _quiet_cell_failed(shell, install: bool) -> None:
    """A notebook front end shows every ``error`` message a kernel sends, even one with an
    empty traceback, so a CellFailed after the user's own traceback (a syntax error, a
    failing in-kernel cell) would be a second, empty error output. IPython's custom
    exception hook lets such a CellFailed mark the cell as failed without sending one.
    Installed only when no other custom handler is set; removed again on unload."""
    if install and not shell.custom_exceptions:
        shell.set_custom_exc((CellFailed,), _show_cell_failed)
    elif not install and shell.custom_exceptions == (CellFailed,):
        shell.set_custom_exc((), None)
