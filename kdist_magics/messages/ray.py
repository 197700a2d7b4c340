"""kdist's words for ``--launcher ray`` (cluster/ray.py, cluster/ray_engines.py). Imported
through :mod:`kdist_magics.messages`."""

from __future__ import annotations

RAY_MISSING = (
    "--launcher ray needs Ray in the kernel's environment (and on every Ray node): pip install 'kdist_magics[ray]'"
)


def ray_no_cluster(address: str, why: str) -> str:
    return (
        f"--launcher ray: no Ray cluster at {address} ({why}). Start one (ray start --head) "
        f"or give its address: --address HOST:PORT, or set RAY_ADDRESS"
    )


def ray_asks_token(address: str) -> str:
    return (
        f"--launcher ray: the Ray cluster at {address} asks for its authentication token: set "
        f"RAY_AUTH_MODE=token and the token (RAY_AUTH_TOKEN, or ~/.ray/auth_token) in the "
        f"kernel's environment before its first Ray cell, as for any Ray driver"
    )


def ray_placing(n: int, address: str, nodes: int, cpus: float, bundle: dict, placement: str) -> str:
    return (
        f"placing {n} engines on the Ray cluster at {address} ({nodes} node{'s' if nodes != 1 else ''}, "
        f"{cpus:g} CPUs): one bundle each {_bundle(bundle)}, {placement} (a placement group "
        f"kdist removes when the engines stop)..."
    )


def ray_unplaceable(n: int, bundle: dict, placement: str, seconds: float, total: dict, free: dict, nodes: int) -> str:
    """A placement group Ray could not satisfy within ``seconds``: what was asked, what is there."""
    have = ", ".join(f"{k} {free.get(k, 0):g} free of {total.get(k, 0):g}" for k in bundle)
    return (
        f"Ray could not place {n} bundles of {_bundle(bundle)} ({placement}) within {seconds:g} s: "
        f"the cluster has {nodes} node{'s' if nodes != 1 else ''}, {have}. Nothing is left "
        f"reserved; ask for fewer ranks (--np) or add nodes"
    )


def ray_node_died(node: str, host: str) -> str:
    return f"on node {node[:12]} ({host}): the Ray node died"


def ray_actor_ended(host: str, why: str) -> str:
    return f"on {host}: the Ray actor holding its engine ended ({why})"


def ray_engine_ended(host: str, code: int | None) -> str:
    return f"on {host}: its engine process ended" + (f" with status {code}" if code is not None else "")


def ray_given_back(status: str) -> str:
    """After a run that did not finish (its record's ``status``: "interrupted", "timeout",
    "failed"): what kdist gave back to the team."""
    ended = {"interrupted": "was stopped", "timeout": "timed out"}.get(status, "failed")
    return (
        f"the run {ended}: kdist ended its engines on the Ray cluster and removed their "
        f"placement group, so the resources are free for others; the next cell places new engines"
    )


def _bundle(bundle: dict) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in bundle.items()) + "}"
