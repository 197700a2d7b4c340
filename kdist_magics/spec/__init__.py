"""Parse a ``%%kdist`` line into a frozen, validated :class:`RunSpec`.

The options are declared once, in :mod:`.options` (:data:`OPTIONS`, re-exported here with
the names they take); :func:`declare` puts them on the magic (so ``%%kdist?`` shows them) and
on a module-level parser, so the fast test tier can parse lines without an IPython shell. Every invalid
value raises exactly :class:`IPython.core.error.UsageError`, before anything
starts.
"""

from __future__ import annotations

import keyword
import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from .options import (
    ENGINE_STRATEGIES,
    KERNEL_STRATEGIES,
    KINDS,
    LAUNCHERS,
    OPTIONS,
    OUT_MODES,
    RAY_OPTIONS,
    SLURM_OPTIONS,
    STRATEGIES,
    _kdist,
    declare,
)

__all__ = [
    "ENGINE_STRATEGIES",
    "KERNEL_STRATEGIES",
    "KINDS",
    "LAUNCHERS",
    "OPTIONS",
    "OUT_MODES",
    "RAY_OPTIONS",
    "SLURM_OPTIONS",
    "STRATEGIES",
    "RunSpec",
    "declare",
    "from_args",
    "launcher_given",
    "parse_line",
    "sharded_on_engines",
    "validate",
]


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
        _check_in_kernel(spec)
    if spec.mesh is not None:
        from ..strategies.sharded.mesh import check_mesh

        if s not in ("auto", "sharded"):
            raise UsageError(f"--mesh applies to sharded, not {s}")
        check_mesh(spec.mesh, spec.devices if "devices" in given else None, spec.np if "np" in given else None)
    _check_launcher(spec)
    if s in ENGINE_STRATEGIES and "devices" in given:
        raise UsageError(f"--devices applies to mirrored; for {s} give the number of ranks with --np N")
    if s in ("default", "tpu") and "devices" in given:
        raise UsageError(f"--devices applies to mirrored or sharded, not {s}")
    return spec


def _check_in_kernel(spec: RunSpec) -> None:
    """Options only engine strategies take, refused for a cell that runs in the notebook."""
    s, given = spec.strategy, spec.given
    for opt, name in (
        ("--np", "np"),
        ("--push", "push"),
        ("--pull", "pull"),
        ("--cluster-id", "cluster_id"),
        ("--profile", "profile"),
    ):
        if name in given:
            raise UsageError(
                f"{opt} applies to engine strategies (horovod, multiworker), not {s}:\n"
                f"a {s} cell already runs in the notebook's own namespace"
                + ("; use --devices N for replicas" if name == "np" else "")
                + ("; sharded takes it across engines, with --np N" if s == "sharded" else "")
            )
    if "out" in given and spec.out != "rank0":
        raise UsageError(f"--out applies to engine strategies (horovod, multiworker), not {s}")


def _check_launcher(spec: RunSpec) -> None:
    if spec.launcher not in LAUNCHERS:
        raise UsageError(f"--launcher: {spec.launcher!r} is not a launcher; choose from {', '.join(LAUNCHERS)}")
    for name, options in (("slurm", SLURM_OPTIONS), ("ray", RAY_OPTIONS)):
        named = [f"--{n}" for n in options if n in spec.given]
        if spec.launcher != name and named:
            what = "a cluster kdist submits to Slurm" if name == "slurm" else "engines Ray places"
            raise UsageError(f"{', '.join(named)} applies to --launcher {name} ({what}); add --launcher {name}")
    if spec.launcher == "local":
        return
    # (sharded runs in the notebook, or across engines: --np N, or a Slurm job's or Ray's engines)
    options = SLURM_OPTIONS if spec.launcher == "slurm" else RAY_OPTIONS
    named = " ".join([f"--launcher {spec.launcher}"] + [f"--{n}" for n in options if n in spec.given])
    if spec.strategy in KERNEL_STRATEGIES and spec.strategy != "sharded" and "launcher" in spec.given:
        raise UsageError(f"{named} starts engines (horovod, multiworker, sharded), not {spec.strategy}")
    if spec.attach:
        raise UsageError(
            f"--launcher {spec.launcher} starts a cluster kdist owns; --cluster-id/--profile "
            f"attach to one somebody started (give one or the other)"
        )


def _launcher_options(args: Any, launcher: str, values: dict[str, Any], given: set[str]) -> None:
    """The Slurm and Ray options into ``values`` (for the launcher that takes them) and ``given``."""
    slurm = {name: getattr(args, name) for name in SLURM_OPTIONS}
    given |= {name for name, value in slurm.items() if value is not None}
    if launcher == "slurm":
        from ..cluster.slurm import SlurmOptions

        try:
            values["slurm"] = SlurmOptions.of(**slurm)
        except ValueError as exc:  # unbalanced quotes in --sbatch
            raise UsageError(f"--sbatch: cannot read {slurm['sbatch']!r} ({exc})") from None
    ray = {name: getattr(args, name) for name in RAY_OPTIONS}
    given |= {name for name, value in ray.items() if value is not None}
    if launcher == "ray":
        from ..cluster.ray_actors import RayOptions

        values["ray"] = RayOptions(ray["address"], ray["placement"] or "spread")


def from_args(args: Any, defaults: Mapping[str, Any] | None = None) -> RunSpec:
    """Build a RunSpec from parsed arguments and configured defaults."""
    defaults = dict(defaults or {})
    given = set()
    values: dict[str, Any] = {}
    for key in (
        "strategy",
        "np",
        "min_np",
        "max_np",
        "devices",
        "timeout",
        "out",
        "checkpoint",
        "tensorboard",
        "cluster_id",
        "profile",
    ):
        v = getattr(args, key)
        if v is None:
            v = defaults.get(key)
        else:
            given.add(key)
        if v is not None:
            values[key] = v
    if args.mesh is not None:
        from ..strategies.sharded.mesh import parse_mesh

        given.add("mesh")
        values["mesh"] = parse_mesh(args.mesh)
    launcher = args.launcher or defaults.get("launcher") or "local"
    if args.launcher is not None:
        given.add("launcher")
    elif "cluster_id" in values or "profile" in values:
        launcher = "local"  # attaching: KDist.launcher is for the clusters kdist starts
    values["launcher"] = launcher
    _launcher_options(args, launcher, values, given)
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
