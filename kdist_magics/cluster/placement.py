"""Which engine is which rank, and which GPU each rank sees.

Ranks are grouped by host (engines sharing a host get consecutive ranks, as under Horovod);
a rank's local rank is its place among its host's ranks. Pure functions: the kernel plans,
the engines apply (:func:`kdist_magics.rank.lifecycle.prepare`).
"""

from __future__ import annotations


def host_grouped_ranks(hostnames: list[str]) -> list[int]:
    """Rank of each engine: hosts in order of first appearance, engines in order within a host."""
    order: dict[str, list[int]] = {}
    for i, host in enumerate(hostnames):
        order.setdefault(host, []).append(i)
    ranks = [0] * len(hostnames)
    rank = 0
    for indices in order.values():
        for i in indices:
            ranks[i] = rank
            rank += 1
    return ranks


def local_ranks(hostnames: list[str], ranks: list[int]) -> list[tuple[int, int]]:
    """``(local_rank, local_size)`` of each engine: its place among its host's ranks, in rank
    order, and how many ranks its host has."""
    by_host: dict[str, list[int]] = {}
    for host, rank in zip(hostnames, ranks):
        by_host.setdefault(host, []).append(rank)
    return [(sorted(by_host[h]).index(r), len(by_host[h])) for h, r in zip(hostnames, ranks)]


#: ``KDist.rank_gpus``: what each rank sees of its host's GPUs
RANK_GPUS = ("own", "shared", "all")


class TooFewGPUs(Exception):
    """More ranks on a host than it has GPUs, with ``KDist.rank_gpus = 'own'``."""


def visible_gpus(env, root: str = "/") -> list[str]:
    """The GPUs a process on this host may use, as ``CUDA_VISIBLE_DEVICES`` entries: what the
    environment already restricts them to (a scheduler, the user), else the NVIDIA driver's
    device files (``/dev/nvidia0`` ...), without NVML or a framework."""
    import glob
    import os
    import re

    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip() and not g.strip().startswith("-")]
    found = [re.fullmatch(r"nvidia(\d+)", os.path.basename(p)) for p in glob.glob(os.path.join(root, "dev", "nvidia*"))]
    return [str(i) for i in sorted(int(m.group(1)) for m in found if m)]


def gpu_env(
    gpus: list[str], local_rank: int, local_size: int, policy: str = "own", host: str = "this host"
) -> dict[str, str]:
    """The environment that gives a rank its GPU (set before any framework starts).

    ``own``: rank ``local_rank`` sees only GPU ``gpus[local_rank]`` (so every framework's
    device 0 is the rank's own GPU); more ranks than GPUs is :class:`TooFewGPUs`. ``shared``:
    ranks beyond the GPU count share them round-robin, each with its part of the memory (JAX's
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``, TensorFlow's memory growth). ``all``: nothing is set,
    every rank sees every GPU (as under horovodrun). No GPUs: nothing is set.
    """
    if policy not in RANK_GPUS:
        raise ValueError(f"KDist.rank_gpus must be one of {', '.join(RANK_GPUS)}, not {policy!r}")
    if not gpus or policy == "all":
        return {}
    if local_size > len(gpus) and policy == "own":
        raise TooFewGPUs(
            f"{local_size} ranks on {host}, which has {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: "
            f"kdist gives every rank a GPU of its own. Ask for --np {len(gpus)} per host, or share: "
            f"%config KDist.rank_gpus = 'shared' (each rank gets part of a GPU's memory) or 'all' "
            f"(every rank sees every GPU)"
        )
    env = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA's numbering = NVML's (the dashboard's)
        "CUDA_VISIBLE_DEVICES": gpus[local_rank % len(gpus)],
    }
    sharing = -(-local_size // len(gpus))  # ranks per GPU, rounded up
    if sharing > 1:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.9 / sharing:.2f}"
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    return env


def default_np() -> int:
    """Ranks when ``--np`` is not given: one per GPU when NVML sees GPUs, else 2."""
    try:
        import pynvml  # type: ignore

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
        if count:
            return int(count)
    except Exception:
        pass
    return 2
