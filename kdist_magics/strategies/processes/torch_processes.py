"""``--strategy multiworker`` under ``KERAS_BACKEND=torch``: one torch process per engine.

Every engine joins a ``torch.distributed`` process group for the cell (Gloo on CPU, NCCL
when every rank has a GPU), torn down after it. Two ways to train, both ending with the same
weights on every rank:

* **Keras' guide "Multi-GPU distributed training with PyTorch"**: wrap the Keras model in
  ``torch.nn.parallel.DistributedDataParallel``, feed it through a ``DistributedSampler``,
  write the torch loop. The process group is ready when the cell starts, so the guide's
  ``setup_device``/``init_process_group`` lines are left out.
* **Code written for ``torchrun``**: every rank has torchrun's variables (``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``, ...), and the cell's own
  ``init_process_group()``/``destroy_process_group()`` join and leave the run's group
  (:mod:`.launcher_env`).
* **``model.fit(x, y)``**: Keras (<= 3.15) has no torch data parallelism of its own, so while
  the cell runs kdist's ``fit`` takes process 0's weights at the start and averages the
  gradients of every step over the processes (one ``all_reduce`` of all of them) before the
  optimizer applies them; in-memory arrays are split into per-process parts
  (:func:`~kdist_magics.strategies.frameworks.fit_data.process_shards`). Metrics are each process's own.

Per run:

1. **Plan** (:meth:`TorchMultiWorkerStrategy._cluster`): each engine reports whether torch is
   installed and what Keras and ``torch.distributed`` already hold. torch missing is a
   one-line error before any engine runs the cell; an engine whose Keras runs on another
   backend, or with a process group kdist did not make, is restarted (owned) or named
   (attached).
2. **Rendezvous** (:meth:`before_cell`): NCCL when every rank has a GPU of its own, else Gloo
   (also for ranks sharing a GPU, ``KDist.rank_gpus = 'shared'``: NCCL refuses those). Rank 0
   opens the store's listening socket itself, bound to loopback for a cluster kdist started
   (to rank 0's address towards the others, ``KDist.worker_network``, for an attached one),
   and hands it to ``TCPStore`` (``master_listen_fd``: torch's own server would listen on
   every interface); Gloo's pairs use the interface of that address (``GLOO_SOCKET_IFNAME``).
   Then every rank joins.
3. **After the cell**: the patches go and the process group is destroyed; a run stopped
   mid-way (ranks may be inside a collective) restarts an owned cluster first.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from ...cluster.cluster import EngineCluster
from ...errors import KDistError
from ...cluster.network import engine_address, interface_of, join, listening
from ...cluster.placement import host_grouped_ranks
from ..engines import finish, waiting
from ..base import RunContext
from .group import ProcessGroupStrategy
from ..frameworks import on_torch
from ..frameworks.fit_data import process_shards
from .launcher_env import torch_calls, torchrun_env

SETUP_TIMEOUT = 120.0  # seconds for every process to join (they wait for each other)


class TorchMultiWorkerStrategy(ProcessGroupStrategy):
    setup_words = "torch.distributed (the process group)"
    warm_modules = ("torch",)
    exposure = "torch"  # messages.EXPOSED: what other local users can reach
    backend = "torch"

    def __init__(self):
        super().__init__()
        self.store = ""  # host:port of rank 0's store during a run

    # -- plan ------------------------------------------------------------------
    def _plan(self, cluster: EngineCluster, ctx: RunContext) -> str:
        """Ranks; '' when the engines can join, else why they must restart."""
        infos = [
            ar.get(timeout=60) for ar in [cluster.client[e.engine_id].apply_async(_probe) for e in cluster.engines]
        ]
        self._ranks = host_grouped_ranks([e.hostname for e in cluster.engines])
        missing = sorted(r for r, i in zip(self._ranks, infos) if not i["torch"])
        if missing:
            raise KDistError(
                f"KERAS_BACKEND=torch: PyTorch is not installed on rank "
                f"{', '.join(map(str, missing))} (pip install torch in the engines' "
                f"environment). The cell did not run."
            )
        for rank, info in sorted(zip(self._ranks, infos)):
            if info["keras"] not in (None, "torch"):
                return f"Keras already runs on {info['keras']} on rank {rank}"
            if info["group"]:
                return f"rank {rank} is in a torch.distributed process group kdist did not make"
        return ""

    # -- hooks -----------------------------------------------------------------
    def before_cell(self, cluster: EngineCluster, ctx: RunContext, ranks: list[int]) -> None:
        import secrets

        mode = "loopback" if cluster.loopback else ctx.options.worker_network
        by_rank = dict(zip(ranks, cluster.engines))
        during = "while torch.distributed was set up"
        lead = {by_rank[0].engine_id: 0}
        try:
            opened = waiting.gather(
                self.run_now, [cluster.client[by_rank[0].engine_id].apply_async(_listen, mode)], lead, 60, during
            )[0]
        except KDistError:  # rank 0 or the controller ended: named
            raise
        except Exception as exc:
            raise KDistError(
                f"torch's store could not listen on rank 0: "
                f"{getattr(exc, 'ename', type(exc).__name__)}: {getattr(exc, 'evalue', exc)}"
            ) from None
        address, port = opened["address"], opened["port"]
        self.check_reachable(address, cluster, "torch's store")
        self.store = join(address, port)
        cudas = waiting.gather(
            self.run_now, [cluster.client[e.engine_id].apply_async(_cuda) for e in cluster.engines], ranks, 60, during
        )
        gpus = [(e.hostname, cuda) for e, cuda in zip(cluster.engines, cudas)]
        # NCCL when every rank has a GPU of its own (it refuses two ranks on one GPU)
        backend = "nccl" if all(g for _, g in gpus) and len(set(gpus)) == len(gpus) else "gloo"
        seed = secrets.randbelow(2**31)  # one per run, the same on every process
        envs = torchrun_env([e.hostname for e in cluster.engines], ranks, (address, port))
        ars = [
            cluster.client[e.engine_id].apply_async(_setup, address, port, len(ranks), rank, backend, mode, seed, env)
            for e, rank, env in zip(cluster.engines, ranks, envs)
        ]
        waiting.setup_results(
            self.run_now, ars, ranks, "torch.distributed", self.store, SETUP_TIMEOUT, "joining torch.distributed failed"
        )

    def after_cell(self, cluster: EngineCluster, ctx: RunContext, ok: bool) -> None:
        finish.end_collective_cell(self.run_now, ok, "the torch processes' collectives", _leave)
        self.store = ""

    def teardown(self) -> None:
        self.store = ""
        super().teardown()


# -- engine side -----------------------------------------------------------------------
_run: dict[str, Any] = {}  # on an engine: the current cell's process group, socket and patches


def _probe() -> dict[str, Any]:  # runs on an engine
    """torch installed?, Keras' backend, a process group that is not kdist's."""
    import importlib.util

    keras = sys.modules.get("keras")
    return {
        "torch": importlib.util.find_spec("torch") is not None,
        "keras": keras.backend.backend() if keras is not None else None,
        "group": "group" not in _run and on_torch.in_a_group(),
    }


def _listen(mode: str) -> dict[str, Any]:  # runs on rank 0's engine
    """Open the store's listening socket on this engine's address for ``mode`` (never every
    interface); ``TCPStore`` takes it over in :func:`_setup`."""
    _leave()
    address = engine_address(mode)
    sock = _run["socket"] = listening(address, 128)
    return {"address": address, "port": sock.getsockname()[1]}


def _cuda() -> str:  # runs on an engine, after kdist chose its GPU (CUDA_VISIBLE_DEVICES)
    """This rank's GPU ('' when torch sees none)."""
    return on_torch.visible_gpu()


def _setup(
    address: str, port: int, processes: int, process: int, backend: str, mode: str, seed: int, env: dict | None = None
) -> dict[str, Any]:
    """On an engine: join the process group, seed Keras alike everywhere, bind ``strategy``,
    make ``fit`` data parallel; ``env``: torchrun's variables for this rank
    (:func:`.launcher_env.torchrun_env`)."""
    import os

    from IPython import get_ipython

    os.environ.update(env or {})
    os.environ["KERAS_BACKEND"] = "torch"
    # Gloo's pairs listen on the interface that has this engine's address (loopback: "lo")
    ifname = interface_of("127.0.0.1" if mode == "loopback" else engine_address(mode))
    listener = _run.pop("socket") if process == 0 else None
    _run["group"], device = on_torch.join_group(
        address, port, processes, process, backend, ifname, listener, SETUP_TIMEOUT, replace_ifname=mode == "loopback"
    )
    import keras

    keras.utils.set_random_seed(seed)  # the same initial weights on every process
    strategy = TorchProcessesStrategy(process, processes, backend, device)
    stack = contextlib.ExitStack()
    stack.enter_context(
        process_shards(
            process,
            processes,
            say=print if process == 0 else (lambda m: None),
            fit_callbacks=lambda: [on_torch.averaged_fit()],
        )
    )
    stack.enter_context(torch_calls(process, processes))  # the cell's own init_process_group()
    _run["stack"] = stack
    shell = get_ipython()
    if shell is not None:
        shell.user_ns["strategy"] = strategy
    return {"backend": backend, **on_torch.group_size()}


def _leave() -> None:  # runs on an engine
    """Undo the cell's patches and destroy its process group (idempotent)."""
    stack = _run.pop("stack", None)
    if stack is not None:
        stack.close()
    if _run.pop("group", None) is not None:
        on_torch.leave_group()
    sock = _run.pop("socket", None)
    if sock is not None:
        sock.close()


class TorchProcessesStrategy:
    """``strategy`` on a torch process: where it is in the process group."""

    def __init__(self, process_index: int, num_processes: int, backend: str, device: str):
        self.process_index = self.rank = process_index
        self.num_processes = self.num_replicas_in_sync = num_processes
        self.backend = backend
        self.device = device

    def __repr__(self) -> str:
        return (
            f"<torch.distributed {self.backend}: process {self.process_index} of {self.num_processes} on {self.device}>"
        )
