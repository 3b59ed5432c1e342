"""torch.distributed set-up from torchrun's environment and the few collectives the tools use (without torchrun,
no ``WORLD_SIZE`` above 1, everything here is a no-op on one process)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """This process's place: ``rank`` of ``world_size``, ``local_rank`` of ``local_world_size`` on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def from_env(env: dict[str, str] | None = None) -> DistInfo:
    """Rank and world size from torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_*``)."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(world_size=world)
    return DistInfo(int(env.get("RANK", "0")), world, int(env.get("LOCAL_RANK", "0")),
                    int(env.get("LOCAL_WORLD_SIZE", str(world))))


def init(device: str) -> tuple[DistInfo, str]:
    """Join torchrun's process group (NCCL on CUDA, gloo on CPU); returns the info and ``device`` (``MODEL.DEVICE``;
    a plain ``cuda`` becomes ``cuda:<local rank>``). On CPU the node's cores are shared between its processes."""
    info = from_env()
    if not info.distributed:
        return info, device
    cuda = torch.device(device).type == "cuda"
    if cuda:
        if device == "cuda":
            device = f"cuda:{info.local_rank}"
        torch.cuda.set_device(torch.device(device))
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.local_world_size))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo", init_method="env://")
    return info, device


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects)."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
