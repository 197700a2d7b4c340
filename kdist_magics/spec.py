"""Parse a ``%%kdist`` line into a frozen, validated :class:`RunSpec`.

The options are declared once, here (:data:`OPTIONS`). :func:`declare` puts
them on the magic (so ``%%kdist?`` shows them) and on a module-level parser, so
the fast test tier can parse lines without an IPython shell. Every invalid
value raises exactly :class:`IPython.core.error.UsageError`, before anything
starts.
"""

from __future__ import annotations

import keyword
import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

#: the one table of strategy kinds: where each runs the cell, in the order auto prefers them
#: when nothing else decides ("kernel": the notebook's own namespace; "engines": ipyparallel
#: engines, one process per rank)
KINDS: dict[str, str] = {"default": "kernel", "mirrored": "kernel", "tpu": "kernel",
                         "horovod": "engines", "multiworker": "engines", "sharded": "kernel"}
STRATEGIES = ("auto", *KINDS)
ENGINE_STRATEGIES = tuple(name for name, kind in KINDS.items() if kind == "engines")
KERNEL_STRATEGIES = tuple(name for name, kind in KINDS.items() if kind == "kernel")
OUT_MODES = ("rank0", "all", "none")
LAUNCHERS = ("local", "ray", "slurm")
#: the options of a Ray cluster's placement (--launcher ray only)
RAY_OPTIONS = ("address", "placement")
#: the options passed to sbatch (--launcher slurm only)
SLURM_OPTIONS = ("partition", "time", "account", "gres", "sbatch")

OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--strategy", "-s"), dict(default=None, choices=STRATEGIES, metavar="NAME",
        help=f"how to distribute the cell: {', '.join(STRATEGIES)} (default: %%config KDist.strategy, 'auto')")),
    (("--np", "-n"), dict(default=None, type=int, metavar="N",
        help="number of ranks (engines) for horovod/multiworker, N >= 1")),
    (("--min-np",), dict(default=None, type=int, dest="min_np", metavar="K",
        help="horovod only: elastic run; when ranks are lost the rest re-form and go on while "
             "at least K are left (the cell uses hvd.elastic.run and a state object)")),
    (("--max-np",), dict(default=None, type=int, dest="max_np", metavar="M",
        help="horovod only: elastic run that takes in engines registering with the cluster "
             "during the run, up to M ranks (they join at the next commit)")),
    (("--devices",), dict(default=None, type=int, metavar="N",
        help="number of devices for mirrored or sharded (GPUs, or logical CPU devices without GPUs), N >= 1")),
    (("--mesh",), dict(default=None, metavar="D,M",
        help="sharded only: the device mesh, data axis D by model axis M (D x M devices); "
             "default: the smallest model axis the model fits, the rest data")),
    (("--timeout",), dict(default=None, type=float, metavar="SECONDS",
        help="stop the run after SECONDS (> 0), under every strategy: engine ranks still busy are "
             "stopped and named; a cell in the kernel is interrupted (status timeout)")),
    (("--push",), dict(default=None, metavar="NAMES",
        help="comma-separated notebook variables copied to every rank before the cell")),
    (("--pull",), dict(default=None, metavar="NAMES",
        help="comma-separated names copied from rank 0 into the notebook after the cell")),
    (("--out",), dict(default=None, choices=OUT_MODES, metavar="WHICH",
        help="whose output to show: rank0 (default), all (prefixed [rank N]) or none")),
    (("--checkpoint",), dict(default=None, metavar="DIR",
        help="every strategy: the model is saved to DIR/last.keras after every epoch (by rank 0 on "
             "engines; kept on interrupt or failure)")),
    (("--tensorboard",), dict(default=None, metavar="DIR",
        help="write every rank's step and epoch metrics as TensorBoard event files under "
             "DIR/rank<N> (then %%tensorboard --logdir DIR)")),
    (("--no-dashboard",), dict(action="store_true", dest="no_dashboard",
        help="do not show the live dashboard widget")),
    (("--no-telemetry",), dict(action="store_true", dest="no_telemetry",
        help="do not attach the telemetry callback to fit() (implies --no-dashboard)")),
    (("--cluster-id",), dict(default=None, dest="cluster_id", metavar="ID",
        help="attach to a running ipyparallel cluster with this cluster id (never stopped by kdist)")),
    (("--profile",), dict(default=None, metavar="NAME",
        help="IPython profile of the ipyparallel cluster to attach to")),
    (("--launcher",), dict(default=None, choices=LAUNCHERS, metavar="WHERE",
        help="where a cluster kdist starts runs its engines: local (this machine), slurm (a Slurm "
             "job kdist submits, watches and cancels) or ray (a Ray cluster's nodes, one placement "
             "group kdist removes after; default: %%config KDist.launcher)")),
    (("--partition",), dict(default=None, metavar="NAME", help="--launcher slurm: sbatch --partition")),
    (("--time",), dict(default=None, metavar="LIMIT", help="--launcher slurm: sbatch --time (the job's time limit)")),
    (("--account",), dict(default=None, metavar="NAME", help="--launcher slurm: sbatch --account")),
    (("--gres",), dict(default=None, metavar="SPEC", help="--launcher slurm: sbatch --gres (gpu:4)")),
    (("--sbatch",), dict(default=None, metavar="'ARGS'",
        help="--launcher slurm: more sbatch options in one quoted string, passed to sbatch as they are")),
    (("--address",), dict(default=None, metavar="HOST:PORT",
        help="--launcher ray: the Ray cluster (default: RAY_ADDRESS, else the one this machine runs)")),
    (("--placement",), dict(default=None, choices=("spread", "pack"), metavar="HOW",
        help="--launcher ray: spread the ranks over Ray's nodes (default) or pack them on as few as fit")),
)


def declare(func):
    """Decorate a magic function with every option in :data:`OPTIONS`."""
    for flags, kwargs in reversed(OPTIONS):
        func = argument(*flags, **kwargs)(func)
    return magic_arguments()(func)


@declare
def _kdist(line):  # pragma: no cover - carrier of the parser only
    """Run the cell distributed with a chosen strategy."""


@dataclass(frozen=True)
class RunSpec:
    """What one ``%%kdist`` cell asked for, after defaults and validation."""

    strategy: str = "auto"
    np: int | None = None
    min_np: int | None = None
    max_np: int | None = None
    devices: int | None = None
    mesh: tuple[int, int] | None = None  # --strategy sharded: (data axis, model axis)
    timeout: float | None = None
    push: tuple[str, ...] = ()
    pull: tuple[str, ...] = ()
    out: str = "rank0"
    checkpoint: str | None = None
    tensorboard: str | None = None
    dashboard: bool = True
    telemetry: bool = True
    cluster_id: str | None = None
    profile: str | None = None
    launcher: str = "local"
    #: what ``sbatch`` gets (:class:`~kdist_magics.cluster.slurm.SlurmOptions`), with ``--launcher slurm``
    slurm: Any = None
    #: where and how Ray places the ranks (:class:`~kdist_magics.cluster.ray_actors.RayOptions`), with ``--launcher ray``
    ray: Any = None
    #: option names the user wrote on the line (as opposed to defaults)
    given: frozenset[str] = field(default_factory=frozenset)

    @property
    def attach(self) -> bool:
        """True when the run uses a cluster the user started."""
        return self.cluster_id is not None or self.profile is not None

    def with_strategy(self, name: str) -> "RunSpec":
        """The same request with ``auto`` resolved to ``name`` (validated again)."""
        return validate(replace(self, strategy=name))


def _names(option: str, value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    bad = [n for n in names if not n.isidentifier() or keyword.iskeyword(n)]
    if not names or bad:
        shown = ", ".join(repr(b) for b in bad) or repr(value)
        raise UsageError(
            f"{option}: {shown} is not a Python name.\n"
            f"{option} takes comma-separated variable names, e.g. {option} model,history"
        )
    return names


def launcher_given(spec: RunSpec) -> bool:
    """``--launcher slurm`` or ``ray`` on the line (a configured launcher does not move a sharded
    cell)."""
    return "launcher" in spec.given and spec.launcher != "local"


def sharded_on_engines(spec: RunSpec) -> bool:
    """A sharded cell runs on engines (one JAX process each) when the line gives ``--np``, a
    launcher (``--launcher slurm`` or ``ray``: a Slurm job's or Ray's engines) or a cluster to
    attach to."""
    return "np" in spec.given or launcher_given(spec) or bool(spec.attach)


def validate(spec: RunSpec) -> RunSpec:
    """Check the combinations of options; return ``spec`` or raise UsageError."""
    given = spec.given
    if spec.strategy not in STRATEGIES:
        raise UsageError(f"--strategy: {spec.strategy!r} is not a strategy; choose from {', '.join(STRATEGIES)}")
    if spec.out not in OUT_MODES:
        raise UsageError(f"--out: {spec.out!r} is not accepted; choose from {', '.join(OUT_MODES)}")
    if spec.np is not None and spec.np < 1:
        raise UsageError(f"--np: {spec.np} ranks is not possible; give N >= 1")
    if spec.devices is not None and spec.devices < 1:
        raise UsageError(f"--devices: {spec.devices} replicas is not possible; give N >= 1")
    if spec.timeout is not None and not spec.timeout > 0:
        raise UsageError(f"--timeout: {spec.timeout:g} seconds is not possible; give SECONDS > 0")
    s = spec.strategy
    if spec.min_np is not None:
        if spec.min_np < 1:
            raise UsageError(f"--min-np: {spec.min_np} ranks is not possible; give K >= 1")
        if spec.np is not None and spec.min_np > spec.np:
            raise UsageError(f"--min-np {spec.min_np} is more than --np {spec.np}; give K <= N")
        if s not in ("auto", "horovod"):
            raise UsageError(f"--min-np applies to horovod (an elastic Horovod run), not {s}")
    if spec.max_np is not None:
        low = max(spec.np or 1, spec.min_np or 1)
        if spec.max_np < low:
            raise UsageError(f"--max-np {spec.max_np} is less than --np/--min-np {low}; give M >= {low}")
        if s not in ("auto", "horovod"):
            raise UsageError(f"--max-np applies to horovod (an elastic Horovod run), not {s}")
    if spec.tensorboard is not None and not spec.telemetry:
        raise UsageError("--tensorboard writes what the telemetry reports; drop --no-telemetry")
    if s == "sharded" and sharded_on_engines(spec):
        if "devices" in given:
            raise UsageError("--devices applies to sharded in the notebook; across engines give --np N")
    elif s in KERNEL_STRATEGIES:
        for opt, name in (("--np", "np"), ("--push", "push"), ("--pull", "pull"),
                          ("--cluster-id", "cluster_id"), ("--profile", "profile")):
            if name in given:
                raise UsageError(
                    f"{opt} applies to engine strategies (horovod, multiworker), not {s}:\n"
                    f"a {s} cell already runs in the notebook's own namespace"
                    + ("; use --devices N for replicas" if name == "np" else "")
                    + ("; sharded takes it across engines, with --np N" if s == "sharded" else "")
                )
        if "out" in given and spec.out != "rank0":
            raise UsageError(f"--out applies to engine strategies (horovod, multiworker), not {s}")
    if spec.mesh is not None:
        from .strategies.sharded.mesh import check_mesh

        if s not in ("auto", "sharded"):
            raise UsageError(f"--mesh applies to sharded, not {s}")
        check_mesh(spec.mesh, spec.devices if "devices" in given else None,
                   spec.np if "np" in given else None)
    _check_launcher(spec)
    if s in ENGINE_STRATEGIES and "devices" in given:
        raise UsageError(f"--devices applies to mirrored; for {s} give the number of ranks with --np N")
    if s in ("default", "tpu") and "devices" in given:
        raise UsageError(f"--devices applies to mirrored or sharded, not {s}")
    return spec


def _check_launcher(spec: RunSpec) -> None:
    if spec.launcher not in LAUNCHERS:
        raise UsageError(f"--launcher: {spec.launcher!r} is not a launcher; choose from {', '.join(LAUNCHERS)}")
    for name, options in (("slurm", SLURM_OPTIONS), ("ray", RAY_OPTIONS)):
        named = [f"--{n}" for n in options if n in spec.given]
        if spec.launcher != name and named:
            what = "a cluster kdist submits to Slurm" if name == "slurm" else "engines Ray places"
            raise UsageError(f"{', '.join(named)} applies to --launcher {name} ({what}); add "
                             f"--launcher {name}")
    if spec.launcher == "local":
        return
    # (sharded runs in the notebook, or across engines: --np N, or a Slurm job's or Ray's engines)
    options = SLURM_OPTIONS if spec.launcher == "slurm" else RAY_OPTIONS
    named = " ".join([f"--launcher {spec.launcher}"] + [f"--{n}" for n in options if n in spec.given])
    if spec.strategy in KERNEL_STRATEGIES and spec.strategy != "sharded" and "launcher" in spec.given:
        raise UsageError(f"{named} starts engines (horovod, multiworker, sharded), not {spec.strategy}")
    if spec.attach:
        raise UsageError(f"--launcher {spec.launcher} starts a cluster kdist owns; --cluster-id/--profile "
                         f"attach to one somebody started (give one or the other)")


def from_args(args: Any, defaults: Mapping[str, Any] | None = None) -> RunSpec:
    """Build a RunSpec from parsed arguments and configured defaults."""
    defaults = dict(defaults or {})
    given = set()
    values: dict[str, Any] = {}
    for key in ("strategy", "np", "min_np", "max_np", "devices", "timeout", "out", "checkpoint", "tensorboard", "cluster_id", "profile"):
        v = getattr(args, key)
        if v is None:
            v = defaults.get(key)
        else:
            given.add(key)
        if v is not None:
            values[key] = v
    if args.mesh is not None:
        from .strategies.sharded.mesh import parse_mesh

        given.add("mesh")
        values["mesh"] = parse_mesh(args.mesh)
    launcher = args.launcher or defaults.get("launcher") or "local"
    if args.launcher is not None:
        given.add("launcher")
    elif "cluster_id" in values or "profile" in values:
        launcher = "local"  # attaching: KDist.launcher is for the clusters kdist starts
    values["launcher"] = launcher
    slurm = {name: getattr(args, name) for name in SLURM_OPTIONS}
    given |= {name for name, value in slurm.items() if value is not None}
    if launcher == "slurm":
        from .cluster.slurm import SlurmOptions

        try:
            values["slurm"] = SlurmOptions.of(**slurm)
        except ValueError as exc:  # unbalanced quotes in --sbatch
            raise UsageError(f"--sbatch: cannot read {slurm['sbatch']!r} ({exc})") from None
    ray = {name: getattr(args, name) for name in RAY_OPTIONS}
    given |= {name for name, value in ray.items() if value is not None}
    if launcher == "ray":
        from .cluster.ray_actors import RayOptions

        values["ray"] = RayOptions(ray["address"], ray["placement"] or "spread")
    for key in ("push", "pull"):
        raw = getattr(args, key)
        if raw is not None:
            given.add(key)
        values[key] = _names(f"--{key}", raw)
    telemetry = defaults.get("telemetry", True) and not args.no_telemetry
    dashboard = defaults.get("dashboard", True) and not args.no_dashboard and telemetry
    if args.no_dashboard:
        given.add("dashboard")
    if args.no_telemetry:
        given.add("telemetry")
    return validate(RunSpec(**values, dashboard=dashboard, telemetry=telemetry, given=frozenset(given)))


def parse_line(line: str, defaults: Mapping[str, Any] | None = None, magic=None) -> RunSpec:
    """Parse a ``%%kdist`` line (``magic`` is the decorated magic function, if any)."""
    try:
        shlex.split(line)
    except ValueError as exc:  # unbalanced quotes
        raise UsageError(f"%%kdist: cannot read the options ({exc})") from None
    try:
        args = parse_argstring(magic or _kdist, line)
    except UsageError as exc:
        msg = str(exc).replace("unrecognized arguments:", "unknown option(s):")
        raise UsageError(f"%%kdist: {msg}\nSee %%kdist? for the options.") from None
    extra = getattr(args, "_", None)
    if extra:
        raise UsageError(f"%%kdist: unexpected {' '.join(extra)!r}; options start with --")
    return from_args(args, defaults)
