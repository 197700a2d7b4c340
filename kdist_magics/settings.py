"""The ``%config KDist`` settings: the defaults a cell's line overrides and how kdist runs what
it starts (threads, GPUs per rank, priorities, who may connect). They are traitlets on
:class:`Settings`, which the magics class :class:`~kdist_magics.magics.KDist` extends, so
``%config KDist.np = 4`` works; a run gets them as :class:`~kdist_magics.strategies.base.RunOptions`.
"""

from __future__ import annotations

from IPython.core.magic import Magics
from traitlets import Bool, CaselessStrEnum, Float, Integer, Unicode

from . import spec as specmod
from .cluster.placement import RANK_GPUS
from .strategies.base import RunOptions


class Settings(Magics):
    """The traits of ``%config KDist`` (``KDist.class_traits(config=True)``)."""

    strategy = CaselessStrEnum(
        specmod.STRATEGIES, default_value="auto", help="strategy used when a cell gives no --strategy"
    ).tag(config=True)
    np = Integer(
        None, allow_none=True, help="ranks for engine strategies when a cell gives no --np (None: one per GPU, else 2)"
    ).tag(config=True)
    devices = Integer(
        None,
        allow_none=True,
        help="mirrored replicas when a cell gives no --devices (None: all GPUs, else 2 logical CPU devices)",
    ).tag(config=True)
    timeout = Float(None, allow_none=True, help="seconds after which a run is stopped (None: no limit)").tag(
        config=True
    )
    out = CaselessStrEnum(specmod.OUT_MODES, default_value="rank0", help="whose output engine strategies show").tag(
        config=True
    )
    launcher = CaselessStrEnum(
        specmod.LAUNCHERS,
        default_value="local",
        help="where a cluster kdist starts runs its engines when a cell gives no "
        "--launcher: 'local' (this machine), 'slurm' (a Slurm job kdist "
        "submits, watches and cancels; the controller listens on "
        "KDist.bind_address, which every node must reach) or 'ray' (a Ray "
        "cluster's nodes, one placement group)",
    ).tag(config=True)
    dashboard = Bool(True, help="show the live dashboard widget").tag(config=True)
    telemetry = Bool(True, help="attach the telemetry callback to fit()").tag(config=True)
    bind_address = Unicode(
        RunOptions.bind_address,
        help="address the rendezvous/TF_CONFIG ports listen on for a local "
        "cluster; attached clusters use an address every engine reaches",
    ).tag(config=True)
    worker_network = Unicode(
        RunOptions.worker_network,
        help="multiworker on an attached cluster: each engine's TF_CONFIG "
        "address: '' (the one it reaches the controller with), an "
        "interface name ('eth0'), a network ('10.0.0.0/16') or an "
        "address to route towards",
    ).tag(config=True)
    rank_gpus = CaselessStrEnum(
        RANK_GPUS,
        default_value=RunOptions.rank_gpus,
        help="engine strategies: 'own' (each rank sees one GPU of its host, "
        "set before any framework starts; more ranks than GPUs is an "
        "error), 'shared' (ranks share GPUs round-robin, each with part of "
        "the memory), 'all' (every rank sees every GPU, as under "
        "horovodrun)",
    ).tag(config=True)
    threads_per_rank = Integer(
        RunOptions.threads_per_rank, allow_none=True, help="intra-op threads per rank (None: cores / ranks)"
    ).tag(config=True)
    freeze_gc = Bool(
        RunOptions.freeze_gc,
        help="engine strategies: during a run, Python's cyclic GC skips the "
        "objects each rank held before it (gc.freeze), so no full "
        "collection stalls every rank at the next allreduce; cyclic "
        "garbage among them is collected after the run",
    ).tag(config=True)
    tf_info_logs = Bool(
        RunOptions.tf_info_logs,
        help='show TensorFlow\'s Python INFO log lines ("Reduce to ... then broadcast to ...") inside kdist cells',
    ).tag(config=True)
    helper_nice = Integer(
        RunOptions.helper_nice,
        min=0,
        max=19,
        help="nice value added to what kdist runs beside the ranks (the kernel's "
        "dashboard and sampler threads, the controller, the engines' IOPub, "
        "heartbeat, control and telemetry threads), so it never takes a "
        "rank's core; 0 leaves every priority as it is",
    ).tag(config=True)
    same_user_only = Bool(
        RunOptions.same_user_only,
        help="kdist's own listeners (the Horovod rendezvous, the abort line) "
        "accept connections from this user only: on a shared host every user "
        "shares loopback. False: anyone's (to debug with outside tools); "
        "%kdist status says so",
    ).tag(config=True)
    private_network = Bool(
        RunOptions.private_network,
        help="a cluster kdist starts runs its engines in a network namespace of "
        "their own (no privilege needed where the host allows user "
        "namespaces): nothing they listen on (Gloo, TF gRPC, the JAX "
        "coordinator, torch's store) can be reached by other local users, "
        "and the kernel reaches the controller over Unix sockets. Takes "
        "effect at the next cluster start; %kdist status says which "
        "holds",
    ).tag(config=True)
    preload = Bool(
        RunOptions.preload,
        help="engines kdist starts import the strategy's framework (TensorFlow and "
        "Horovod, TensorFlow, JAX or torch) as they start, while the controller and "
        "the other engines start, instead of after them (not where GPUs are "
        "visible: a rank's GPU is chosen as its run starts). Takes effect at the "
        "next cluster start",
    ).tag(config=True)
    stop_grace = Float(
        RunOptions.stop_grace,
        help="seconds ranks get to stop after an interrupt (SIGINT) before they are killed and the engines restarted",
    ).tag(config=True)
