"""The ``%%kdist`` line's options, declared once (:data:`OPTIONS`), and the names they take:
the strategies by kind (:data:`KINDS`), output modes, launchers. :func:`declare` puts them on
the magic (so ``%%kdist?`` shows them) and on :func:`_kdist`, the parser the fast tier uses
without an IPython shell."""

from __future__ import annotations

from typing import Any

from IPython.core.magic_arguments import argument, magic_arguments

from ..cluster.launchers import names as launcher_names

#: the one table of strategy kinds: where each runs the cell, in the order auto prefers them
#: when nothing else decides ("kernel": the notebook's own namespace; "engines": ipyparallel
#: engines, one process per rank)
KINDS: dict[str, str] = {
    "default": "kernel",
    "mirrored": "kernel",
    "tpu": "kernel",
    "horovod": "engines",
    "multiworker": "engines",
    "sharded": "kernel",
}
STRATEGIES = ("auto", *KINDS)
ENGINE_STRATEGIES = tuple(name for name, kind in KINDS.items() if kind == "engines")
KERNEL_STRATEGIES = tuple(name for name, kind in KINDS.items() if kind == "kernel")
OUT_MODES = ("rank0", "all", "none")
#: "local" and every registered launcher (:mod:`kdist_magics.cluster.launchers`)
LAUNCHERS = launcher_names()
#: the options of a Ray cluster's placement (--launcher ray only)
RAY_OPTIONS = ("address", "placement")
#: the options passed to sbatch (--launcher slurm only)
SLURM_OPTIONS = ("partition", "time", "account", "gres", "sbatch")

OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (
        ("--strategy", "-s"),
        dict(
            default=None,
            choices=STRATEGIES,
            metavar="NAME",
            help=f"how to distribute the cell: {', '.join(STRATEGIES)} (default: %%config KDist.strategy, 'auto')",
        ),
    ),
    (
        ("--np", "-n"),
        dict(default=None, type=int, metavar="N", help="number of ranks (engines) for horovod/multiworker, N >= 1"),
    ),
    (
        ("--min-np",),
        dict(
            default=None,
            type=int,
            dest="min_np",
            metavar="K",
            help="horovod only: elastic run; when ranks are lost the rest re-form and go on while "
            "at least K are left (the cell uses hvd.elastic.run and a state object)",
        ),
    ),
    (
        ("--max-np",),
        dict(
            default=None,
            type=int,
            dest="max_np",
            metavar="M",
            help="horovod only: elastic run that takes in engines registering with the cluster "
            "during the run, up to M ranks (they join at the next commit)",
        ),
    ),
    (
        ("--devices",),
        dict(
            default=None,
            type=int,
            metavar="N",
            help="number of devices for mirrored or sharded (GPUs, or logical CPU devices without GPUs), N >= 1",
        ),
    ),
    (
        ("--mesh",),
        dict(
            default=None,
            metavar="D,M",
            help="sharded only: the device mesh, data axis D by model axis M (D x M devices); "
            "default: the smallest model axis the model fits, the rest data",
        ),
    ),
    (
        ("--timeout",),
        dict(
            default=None,
            type=float,
            metavar="SECONDS",
            help="stop the run after SECONDS (> 0), under every strategy: engine ranks still busy are "
            "stopped and named; a cell in the kernel is interrupted (status timeout)",
        ),
    ),
    (
        ("--push",),
        dict(
            default=None,
            metavar="NAMES",
            help="comma-separated notebook variables copied to every rank before the cell",
        ),
    ),
    (
        ("--pull",),
        dict(
            default=None,
            metavar="NAMES",
            help="comma-separated names copied from rank 0 into the notebook after the cell",
        ),
    ),
    (
        ("--out",),
        dict(
            default=None,
            choices=OUT_MODES,
            metavar="WHICH",
            help="whose output to show: rank0 (default), all (prefixed [rank N]) or none",
        ),
    ),
    (
        ("--checkpoint",),
        dict(
            default=None,
            metavar="DIR",
            help="every strategy: the model is saved to DIR/last.keras after every epoch (by rank 0 on "
            "engines; kept on interrupt or failure)",
        ),
    ),
    (
        ("--tensorboard",),
        dict(
            default=None,
            metavar="DIR",
            help="write every rank's step and epoch metrics as TensorBoard event files under "
            "DIR/rank<N> (then %%tensorboard --logdir DIR)",
        ),
    ),
    (("--no-dashboard",), dict(action="store_true", dest="no_dashboard", help="do not show the live dashboard widget")),
    (
        ("--no-telemetry",),
        dict(
            action="store_true",
            dest="no_telemetry",
            help="do not attach the telemetry callback to fit() (implies --no-dashboard)",
        ),
    ),
    (
        ("--cluster-id",),
        dict(
            default=None,
            dest="cluster_id",
            metavar="ID",
            help="attach to a running ipyparallel cluster with this cluster id (never stopped by kdist)",
        ),
    ),
    (
        ("--profile",),
        dict(default=None, metavar="NAME", help="IPython profile of the ipyparallel cluster to attach to"),
    ),
    (
        ("--launcher",),
        dict(
            default=None,
            choices=LAUNCHERS,
            metavar="WHERE",
            help="where a cluster kdist starts runs its engines: local (this machine), slurm (a Slurm "
            "job kdist submits, watches and cancels) or ray (a Ray cluster's nodes, one placement "
            "group kdist removes after; default: %%config KDist.launcher)",
        ),
    ),
    (("--partition",), dict(default=None, metavar="NAME", help="--launcher slurm: sbatch --partition")),
    (("--time",), dict(default=None, metavar="LIMIT", help="--launcher slurm: sbatch --time (the job's time limit)")),
    (("--account",), dict(default=None, metavar="NAME", help="--launcher slurm: sbatch --account")),
    (("--gres",), dict(default=None, metavar="SPEC", help="--launcher slurm: sbatch --gres (gpu:4)")),
    (
        ("--sbatch",),
        dict(
            default=None,
            metavar="'ARGS'",
            help="--launcher slurm: more sbatch options in one quoted string, passed to sbatch as they are",
        ),
    ),
    (
        ("--address",),
        dict(
            default=None,
            metavar="HOST:PORT",
            help="--launcher ray: the Ray cluster (default: RAY_ADDRESS, else the one this machine runs)",
        ),
    ),
    (
        ("--placement",),
        dict(
            default=None,
            choices=("spread", "pack"),
            metavar="HOW",
            help="--launcher ray: spread the ranks over Ray's nodes (default) or pack them on as few as fit",
        ),
    ),
)


def declare(func):
    """Decorate a magic function with every option in :data:`OPTIONS`."""
    for flags, kwargs in reversed(OPTIONS):
        func = argument(*flags, **kwargs)(func)
    return magic_arguments()(func)


@declare
def _kdist(line):  # pragma: no cover - carrier of the parser only
    """Run the cell distributed with a chosen strategy."""
