"""torch.distributed set-up from torchrun's environment and the few collectives the tools use (without torchrun,
no ``WORLD_SIZE`` above 1, everything here is a no-op on one process), and which process of the run died when one
stops early."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from minidet.errors import RuntimeFailure
from minidet.machine import cores

_PEERS: list[tuple[str, int]] = []  # (host, pid) of every rank, from init


class PeerError(RuntimeFailure):
    """A collective failed because another process of the run is gone; ``str(err)`` says which."""


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, which only waits to be reaped, has ended); Linux ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # the state follows the (name)
    except (OSError, IndexError):
        return False


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
    a plain ``cuda`` becomes ``cuda:<local rank>``). On CPU the node's cores are shared between its processes.
    Every rank's host and pid are gathered, for :func:`dead_ranks`."""
    info = from_env()
    if not info.distributed:
        return info, device
    cuda = torch.device(device).type == "cuda"
    if cuda:
        if device == "cuda":
            device = f"cuda:{info.local_rank}"
        torch.cuda.set_device(torch.device(device))
    else:
        torch.set_num_threads(max(1, (cores() or 1) // info.local_world_size))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo", init_method="env://")
    _PEERS[:] = all_gather((socket.gethostname(), os.getpid()))
    return info, device


def dead_ranks() -> list[tuple[int, int]]:
    """``(rank, pid)`` of the processes of this run on this machine that have ended (torchrun ends the others when
    one dies; a rank on another machine cannot be seen from here)."""
    if not _PEERS or not os.path.isdir("/proc"):
        return []
    me = (socket.gethostname(), os.getpid())
    return [(r, pid) for r, (host, pid) in enumerate(_PEERS) if host == me[0] and pid != me[1]
            and not process_alive(pid)]


def describe_dead(dead: list[tuple[int, int]]) -> str:
    """``"rank 1 (pid 4242) of the run died"`` for :func:`dead_ranks`' list."""
    return f"{' and '.join(f'rank {r} (pid {pid})' for r, pid in dead)} of the run died"


def _collective(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - gloo / NCCL report a lost peer in their own words
        if dead := dead_ranks():
            raise PeerError(describe_dead(dead)) from e
        raise


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects)."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    _collective(lambda: dist.broadcast_object_list(box, src=0))
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    _collective(lambda: dist.all_gather_object(out, obj))
    return out


def shutdown() -> None:
    _PEERS.clear()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
