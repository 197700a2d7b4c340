"""What kdist asks of Ray for ``--launcher ray``: the connection, one placement group per
cluster, and an actor per rank that runs that rank's engine.

Nothing here knows about ipyparallel: :mod:`.ray_engines` builds the engines from these.

- :func:`connect` joins the Ray cluster at ``--address`` (or ``RAY_ADDRESS``, or the one this
  machine runs), one line when there is none, or no Ray.
- :func:`reserve` makes the placement group (one bundle per rank: CPU, and a GPU or TPU each
  where the cluster has one per rank), waits for it within a timeout, and removes it again,
  saying what was asked and what the cluster has, when Ray cannot place it.
- :class:`EngineHost` is the actor: in the bundle Ray gave it, it starts
  ``python -m kdist_magics.cluster.ray_actors engine ...`` (ipyparallel's engine, the process named for
  kdist: :data:`.lifetime.STARTED`), which dies with the actor (``PR_SET_PDEATHSIG``); the actor
  dies with the kernel (Ray ends a driver's actors and placement groups with it).
- :func:`release` stops the engines, kills the actors and removes the group.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass

from ..errors import ClusterError
from ..messages import RAY_MISSING, ray_asks_token, ray_no_cluster, ray_unplaceable

PLACEMENTS = ("spread", "pack")
#: Ray's namespace for what kdist asks for (its actors' names start with "kdist-")
NAMESPACE = "kdist"


@dataclass(frozen=True)
class RayOptions:
    """``--address`` (None: ``RAY_ADDRESS``, else the cluster this machine runs) and
    ``--placement`` (spread the ranks over nodes, or pack them on as few as fit)."""

    address: str | None = None
    placement: str = "spread"

    def where(self) -> str:
        return self.address or os.environ.get("RAY_ADDRESS") or "auto"


def require():
    """The ``ray`` module, or one line naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ClusterError(RAY_MISSING) from None
    return ray


def _answers(address: str) -> str | None:
    """Why nothing answers at ``host:port`` (None: something does, or it is not host:port)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return None
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def connect(options: RayOptions) -> bool:
    """Join the Ray cluster (this kernel becomes one of its drivers). True when kdist joined it
    here (and so leaves it in :func:`disconnect`); False when the kernel was already joined."""
    ray = require()
    if ray.is_initialized():
        return False
    address = options.where()
    if (why := _answers(address)) is not None:
        raise ClusterError(ray_no_cluster(address, why))
    import logging

    # ipyparallel starts engine launchers off the main thread, where Ray 2.60's init warns that
    # it set no SIGTERM handler: the kernel wants none (Ray's would exit the kernel on SIGTERM),
    # so the warning is dropped, not shown to the user
    worker_log = logging.getLogger("ray._private.worker")
    worker_log.addFilter(_no_sigterm_warning)
    try:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            log_to_driver=False,
            logging_level=logging.WARNING,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        if "AuthToken" in f"{exc} {exc.__cause__}":
            raise ClusterError(ray_asks_token(address)) from None
        raise ClusterError(ray_no_cluster(address, str(exc).splitlines()[0])) from None
    finally:
        worker_log.removeFilter(_no_sigterm_warning)
    return True


def _no_sigterm_warning(record) -> bool:
    return "SIGTERM handler is not set" not in record.getMessage()


def connected() -> bool:
    """Is this process a driver of a Ray cluster? (Ray's calls start a local cluster of their own
    when it is not: kdist never calls Ray then.)"""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def disconnect(joined: bool) -> None:
    if joined:
        import ray

        if ray.is_initialized():
            ray.shutdown()


def bundle(n: int) -> dict[str, float]:
    """One rank's share: a CPU, and a GPU (or TPU) where the cluster has one for every rank."""
    import ray

    total = ray.cluster_resources()
    share = {"CPU": 1.0}
    for device in ("GPU", "TPU"):
        if total.get(device, 0) >= n:
            share[device] = 1.0
            break
    return share


def new_name() -> str:
    """A name for a placement group this kernel makes: ``kdist-<kernel pid>-<time>`` (see
    :func:`held`)."""
    return f"kdist-{os.getpid()}-{time.monotonic_ns()}"


def live_nodes() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def node_alive(node_id: str, wait: float = 2.0) -> bool:
    """Is this Ray node up? Ray's own table says so for some seconds after a node died (until
    its health checks fail), so a node Ray still lists must also answer at its raylet's port."""
    import ray

    node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
    if node is None or not node.get("Alive"):
        return False
    try:
        socket.create_connection((node["NodeManagerAddress"], int(node["NodeManagerPort"])), timeout=wait).close()
    except (OSError, KeyError, ValueError):
        return False
    return True


def reserve(n: int, share: dict[str, float], placement: str, timeout: float, name: str):
    """A placement group of ``n`` bundles named ``name``, ready; or, after ``timeout`` s, none
    and one line."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([dict(share) for _ in range(n)], strategy=placement.upper(), name=name)
    try:
        ray.get(group.ready(), timeout=timeout)
    except Exception as exc:  # GetTimeoutError, or the group failed
        remove_placement_group(group)
        if not isinstance(exc, ray.exceptions.GetTimeoutError):
            raise ClusterError(f"Ray could not make the placement group: {exc}") from None
        raise ClusterError(
            ray_unplaceable(
                n, share, placement, timeout, ray.cluster_resources(), ray.available_resources(), live_nodes()
            )
        ) from None
    return group


def hosts(group, n: int, share: dict[str, float], name: str) -> list:
    """One :class:`EngineHost` actor in each bundle of ``group``, named after it (``name``, the
    group's, then ``-<bundle>``, in :data:`NAMESPACE`), so what kdist holds is listed by name."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actor = ray.remote(EngineHost)
    devices = {"num_gpus": share.get("GPU", 0)} | ({"resources": {"TPU": share["TPU"]}} if "TPU" in share else {})
    return [
        actor.options(
            num_cpus=share["CPU"],
            max_restarts=0,
            **devices,
            name=f"{name}-{i}",
            namespace=NAMESPACE,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=i),
        ).remote()
        for i in range(n)
    ]


def held(all_drivers: bool = False) -> dict[str, list[str]]:
    """What kdist holds on the Ray cluster this process is joined to: its placement groups
    not removed and its actors alive, by name (:func:`new_name`); this kernel's only,
    unless ``all_drivers``. The session check of the Ray tier asks it."""
    import ray
    from ray.util.placement_group import placement_group_table

    mine = "kdist-" if all_drivers else f"kdist-{os.getpid()}-"
    groups = [
        v.get("name", "")
        for v in placement_group_table().values()
        if v.get("state") != "REMOVED" and (v.get("name") or "").startswith(mine)
    ]
    actors = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == NAMESPACE and a["name"].startswith(mine)
    ]
    return {"placement groups": sorted(groups), "actors": sorted(actors)}


def release(actors: list, group, grace: float = 5.0) -> None:
    """Stop each actor's engine, kill the actors, remove the placement group (each step done
    even when an earlier one fails: a node may be gone)."""
    import ray
    from ray.util.placement_group import remove_placement_group

    if not connected():  # nothing to ask: Ray ended what this driver held when it disconnected
        return
    try:
        ray.get([a.stop.remote(grace) for a in actors], timeout=grace + 10)
    except Exception:
        pass
    for a in actors:
        try:
            ray.kill(a, no_restart=True)
        except Exception:
            pass
    if group is not None:
        try:
            remove_placement_group(group)
        except Exception:
            pass


class EngineHost:
    """A Ray actor (made one by :func:`hosts`): one rank's engine on the node Ray chose."""

    def __init__(self):
        self.proc = None
        self.log = None

    def start(self, args: list[str], env: dict[str, str], name: str) -> dict:
        """Start the engine (``args``: ipyparallel's engine arguments); where it runs."""
        import subprocess
        import tempfile

        import ray

        self.log = os.path.join(tempfile.gettempdir(), f"{name}.log")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kdist_magics.cluster.ray_actors", "engine", *args],
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        return {"pid": self.proc.pid, "host": socket.gethostname(), "node": ray.get_runtime_context().get_node_id()}

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def stop(self, grace: float) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except Exception:
                self.proc.kill()
        self.proc.wait()
        if self.log:
            try:
                os.remove(self.log)
            except OSError:
                pass
        return self.proc.returncode

    def output(self, limit: int = 1500) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-limit:]
        except (OSError, TypeError):
            return ""


def _die_with_parent() -> None:  # runs in the engine's process, before it executes
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def engine(args: list[str]) -> None:
    """A rank's engine: ipyparallel's, run here as ``__main__``, so its command line says kdist
    started it."""
    import runpy

    sys.argv = ["ipyparallel.engine", *args]
    runpy.run_module("ipyparallel.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":  # pragma: no cover - run as an engine in an EngineHost actor
    if sys.argv[1:2] == ["engine"]:
        engine(sys.argv[2:])
