"""What the strategies ask of PyTorch, in one place: joining and leaving a ``torch.distributed``
process group (:func:`join_group`: its TCPStore, Gloo or NCCL, this rank's GPU), whether a
process is in one already, and ``fit`` made data parallel (:func:`averaged_fit`: process 0's
weights at the start, every step's gradients all-reduced, timed where the all-reduce runs).
The JAX side is :mod:`.on_jax`, TensorFlow's :mod:`.on_tf`. Importing this module imports no
torch: each call does."""

from __future__ import annotations

import datetime
import os
import sys
import time
from typing import Any


def in_a_group() -> bool:
    """Whether this process is in a ``torch.distributed`` process group (torch not imported:
    no)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:
        return False


def visible_gpu() -> str:
    """This rank's GPU as ``CUDA_VISIBLE_DEVICES`` names it ('all' when unset; '' when torch
    sees none)."""
    import torch

    if not torch.cuda.is_available():
        return ""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "") or "all"


def join_group(
    address: str,
    port: int,
    processes: int,
    process: int,
    backend: str,
    ifname: str,
    listener: Any,
    timeout_s: float,
    replace_ifname: bool = False,
) -> tuple[Any, str]:
    """Join the process group whose TCPStore rank 0 serves at ``address:port`` (rank 0 hands
    its ``listener`` socket to the store, which owns and closes it); Gloo's pairs on
    ``ifname`` (where the user set none, unless ``replace_ifname``). Returns the store and the
    device Keras' tensors go to (this rank's GPU as device 0 where torch sees one)."""
    if replace_ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if process == 0:
        store = dist.TCPStore(
            address, port, processes, True, timeout, wait_for_workers=False, master_listen_fd=listener.detach()
        )
    else:
        store = dist.TCPStore(address, port, processes, False, timeout)
    dist.init_process_group(backend, store=store, rank=process, world_size=processes, timeout=timeout)
    device = "cpu"
    if torch.cuda.is_available():  # Keras puts its tensors there too
        torch.cuda.set_device(0)  # kdist left this rank its GPU as device 0 (rank_gpus 'own'/'shared')
        device = "cuda:0"
    return store, device


def group_size() -> dict[str, int]:
    """This process's place in its group, as torch.distributed says it."""
    import torch.distributed as dist

    return {"process": dist.get_rank(), "processes": dist.get_world_size()}


def leave_group() -> None:
    """Destroy this process's group, if it has one."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def averaged_fit():
    """A callback for ``fit``: process 0's weights at the start; while it trains, every step's
    gradients are averaged over the processes before the optimizer applies them."""
    import keras
    import torch
    import torch.distributed as dist

    from ...watch.collective import CollectiveClock

    def averaged(apply, clock):
        def apply_averaged(grads, trainable_variables=None):
            present = [g for g in grads if g is not None]
            if present:
                flat = torch.cat([g.reshape(-1) for g in present])
                # timed where it runs on the CPU, where Gloo's all_reduce returns once done (a
                # CUDA one returns once queued: not timed, its split stays inferred)
                began = time.perf_counter() if flat.device.type == "cpu" else None
                dist.all_reduce(flat)
                if began is not None:
                    clock.add(time.perf_counter() - began)
                flat /= dist.get_world_size()
                out, at = [], 0
                for g in grads:
                    if g is None:
                        out.append(None)
                        continue
                    out.append(flat[at : at + g.numel()].view_as(g))
                    at += g.numel()
                grads = out
            return apply(grads, trainable_variables)

        return apply_averaged

    class AveragedFit(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            with torch.no_grad():
                for v in self.model.variables:
                    dist.broadcast(v.value.data, 0)
            optimizer = self.model.optimizer
            self._optimizer = optimizer
            clock = CollectiveClock.on(optimizer)
            optimizer.apply = averaged(type(optimizer).apply.__get__(optimizer), clock)

        def on_train_end(self, logs=None):
            optimizer = getattr(self, "_optimizer", None)
            if optimizer is not None:
                optimizer.__dict__.pop("apply", None)
                CollectiveClock.off(optimizer)

    return AveragedFit()
