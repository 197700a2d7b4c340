"""Code written for ``torchrun`` or JAX's multi-process launch, run as it is on the engines.

Such code reads the launcher's variables and sets up its own process group. Inside a run the
group is kdist's, set up before the cell; this module makes the framework's own set-up calls
join it instead of failing:

* :func:`torchrun_env`: the variables ``torchrun`` gives each process (``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``ROLE_RANK``,
  ``MASTER_ADDR``/``MASTER_PORT`` of the run's store, ...), set on every torch rank.
* :func:`torch_calls`: while a torch cell runs, ``torch.distributed.init_process_group()``
  (``env://``, ``tcp://...``, any backend) returns at once when the run's group exists -- no
  "trying to initialize the default process group twice!" -- and
  ``destroy_process_group()`` of the default group leaves it to kdist, which ends it after
  the cell (the next cell has a group again). ``torch.multiprocessing.start_processes()``
  and ``spawn()`` (how Keras' torch guide starts one process per GPU from a notebook) start
  nothing: the run's ranks are those processes, so each calls ``fn(LOCAL_RANK, *args)``
  itself, when ``nprocs`` is the number of ranks on its host.
* :func:`jax_calls`: while a JAX cell runs, ``jax.distributed.initialize()`` (and so
  ``keras.distribution.initialize()``) without arguments, or with ones matching the run, does
  nothing -- the run's processes are joined already, and a zero-argument call on a Slurm or
  Open MPI node would otherwise read the scheduler's ranks -- and ``jax.distributed.shutdown()``
  leaves the group to kdist.

A world size or rank that contradicts the run raises
:class:`~kdist_magics.errors.LauncherMismatch`, one line naming ``--np``; nothing waits for
processes that will never come. Addresses, ports, ``init_method`` and timeouts are only how a
launcher finds its peers, so they are not checked.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import Any, Callable

from ...errors import LauncherMismatch
from ...messages import launcher_mismatch, torch_code_other_backend


def torchrun_env(
    hosts: list[str], ranks: list[int], master: tuple[str, int], run_id: str = "kdist"
) -> list[dict[str, str]]:
    """torchrun's variables for each engine (``hosts``, ``ranks`` in engine order); a host is
    a torchrun node (``GROUP_RANK``: hosts in order of their lowest rank)."""
    from ...cluster.placement import local_ranks

    world = len(ranks)
    nodes = sorted(set(hosts), key=lambda h: min(r for x, r in zip(hosts, ranks) if x == h))
    out = []
    for host, rank, (local, local_size) in zip(hosts, ranks, local_ranks(hosts, ranks)):
        out.append(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(local_size),
                "GROUP_RANK": str(nodes.index(host)),
                "GROUP_WORLD_SIZE": str(len(nodes)),
                "ROLE_NAME": "default",
                "ROLE_RANK": str(rank),
                "ROLE_WORLD_SIZE": str(world),
                "MASTER_ADDR": master[0],
                "MASTER_PORT": str(master[1]),
                "TORCHELASTIC_RUN_ID": run_id,
                "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "0",
                "TORCHELASTIC_USE_AGENT_STORE": "False",
            }
        )
    return out


def set_env(env: dict[str, str]) -> None:  # runs on an engine
    os.environ.update(env)


def check_world(call: str, world: int, rank: int, size: Any, index: Any) -> None:
    """Raise LauncherMismatch when ``size``/``index`` (None or -1: not given) contradict a run
    of ``world`` ranks in which this one is ``rank``."""
    __tracebackhide__ = True
    if size not in (None, -1) and int(size) != world:
        raise LauncherMismatch(
            launcher_mismatch(
                call, f"{size} processes", f"{world} ranks (--np {world})", f"give --np {size} on the %%kdist line"
            )
        )
    if index not in (None, -1) and int(index) != rank:
        option = (
            f"give --np {int(index) + 1} or more on the %%kdist line"
            if int(index) >= world
            else "ranks are kdist's (read RANK from the environment)"
        )
        raise LauncherMismatch(
            launcher_mismatch(call, f"rank {index}", f"this engine as rank {rank} of {world}", option)
        )


def _bound(original: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    try:
        return inspect.signature(original).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return dict(kwargs)


@contextlib.contextmanager
def patched(*replacements: tuple[Any, str, Any]):
    """Set ``(owner, name, value)`` attributes inside, restore them after."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in replacements]
    for owner, name, value in replacements:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def torch_calls(rank: int, world: int):  # entered on an engine, for the cell
    """``init_process_group``/``destroy_process_group`` join/leave the run's group (module doc)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    init, destroy = c10d.init_process_group, c10d.destroy_process_group

    def init_process_group(*args, **kwargs):
        __tracebackhide__ = True
        given = _bound(init, args, kwargs)
        check_world("torch.distributed.init_process_group()", world, rank, given.get("world_size"), given.get("rank"))
        if dist.is_initialized():
            return None
        return init(*args, **kwargs)

    def destroy_process_group(group=None):
        if group is None or group is c10d.GroupMember.WORLD:
            return None  # kdist ends the run's group after the cell
        return destroy(group)

    import torch.multiprocessing as mp

    local = int(os.environ.get("LOCAL_RANK", rank))
    here = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    hosts = int(os.environ.get("GROUP_WORLD_SIZE", 1))
    start = _in_this_rank("torch.multiprocessing.start_processes()", mp.start_processes, local, here, world, hosts)
    spawn = _in_this_rank("torch.multiprocessing.spawn()", mp.spawn, local, here, world, hosts)
    init_process_group.__doc__ = init.__doc__
    destroy_process_group.__doc__ = destroy.__doc__
    return patched(
        (dist, "init_process_group", init_process_group),
        (c10d, "init_process_group", init_process_group),
        (dist, "destroy_process_group", destroy_process_group),
        (c10d, "destroy_process_group", destroy_process_group),
        (mp, "start_processes", start),
        (mp, "spawn", spawn),
    )


def _in_this_rank(call: str, original: Callable, local: int, here: int, world: int, hosts: int):
    """``start_processes``/``spawn`` for a rank of a run: no process is started, this rank is
    process ``local`` of the ``here`` on its host, so it calls ``fn(local, *args)`` itself."""

    def start_processes(fn, *args, **kwargs):
        __tracebackhide__ = True
        given = _bound(original, (fn, *args), kwargs)
        nprocs = int(given.get("nprocs", 1))
        if nprocs != here:
            run = f"{here} ranks here (--np {world})"
            each = (
                "start one process per rank of this host: "
                "nprocs=int(os.environ['LOCAL_WORLD_SIZE']) (each rank is one of them)"
            )
            if nprocs > 0:
                words = launcher_mismatch(
                    call,
                    f"{nprocs} processes on this host",
                    run,
                    f"give --np {nprocs * hosts} on the %%kdist line",
                    each,
                )
            else:  # the guide's torch.cuda.device_count() on a host without GPUs
                words = launcher_mismatch(call, "0 processes", run, each, "run on a host with GPUs if it counts them")
            raise LauncherMismatch(words)
        fn(local, *tuple(given.get("args", ())))
        return None if given.get("join", True) else _Started()

    start_processes.__doc__ = original.__doc__
    return start_processes


class _Started:
    """What ``start_processes(..., join=False)`` returns in a run: the work is done already."""

    def join(self, timeout=None, grace_period=None) -> bool:
        return True


def jax_calls(rank: int, world: int):  # entered on an engine, for the cell
    """``jax.distributed.initialize``/``shutdown`` are no-ops for the run (module doc)."""
    import jax

    initialize = jax.distributed.initialize

    def joined(*args, **kwargs):
        __tracebackhide__ = True
        given = _bound(initialize, args, kwargs)
        check_world("jax.distributed.initialize()", world, rank, given.get("num_processes"), given.get("process_id"))
        return None

    def shutdown():
        return None  # the run's processes stay joined; kdist owns the group

    joined.__doc__ = initialize.__doc__
    return patched((jax.distributed, "initialize", joined), (jax.distributed, "shutdown", shutdown))


def uses_torch_distributed(source: str) -> bool:
    """Whether Python ``source`` imports ``torch.distributed`` or calls
    ``init_process_group()``: read from its syntax tree, so a comment or a string that names
    them does not count (IPython syntax, ``%magic`` and ``!cmd`` lines, is turned first)."""
    import ast

    try:
        from IPython.core.inputtransformer2 import TransformerManager

        tree = ast.parse(TransformerManager().transform_cell(source))
    except (SyntaxError, ValueError):
        return False  # the cell's own error comes when it runs
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.startswith("torch.distributed") for a in node.names):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and (
                node.module.startswith("torch.distributed")
                or (node.module == "torch" and any(a.name == "distributed" for a in node.names))
            )
        ):
            return True
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "distributed"
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
        ):
            return True
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "init_process_group":
                return True
    return False


def torch_code_elsewhere(source: str, backend: str) -> str | None:
    """The one line for code written for torchrun (``torch.distributed``) run by ``multiworker``
    under another Keras backend, where torch's launcher variables (RANK, WORLD_SIZE, ...) are
    not set and it would fail with "RANK expected, but not set"; else None."""
    if backend == "torch" or not uses_torch_distributed(source):
        return None
    return torch_code_other_backend(backend)
