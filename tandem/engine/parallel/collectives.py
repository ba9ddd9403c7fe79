"""The tensor-parallel group's collectives: forming the group, and the one all-reduce a step runs.

    every rank: join(store_dir, rank, world) --FileStore in a 0700 directory--> gloo (CPU) or
                NCCL (CUDA) process group, every collective bounded by ``timeout_s``

The rendezvous is a file in a private directory rank 0 made (mode 0700): no port is opened
for it. Gloo's pair connections bind the loopback interface only (``GLOO_SOCKET_IFNAME=lo``,
set before the group forms), on ephemeral ports. A peer that dies closes its connections, so
the others' pending collective fails at once; a peer that hangs is cut off by the timeout.
Either way the collective raises, and the rank exits: nothing waits forever.
The NCCL path (CUDA devices, ``cuda:<rank>``) is written but has not run on a GPU here.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

COLLECTIVE_TIMEOUT_S = 60.0  # a step's all-reduce waits at most this for its peers
LOOPBACK_IFNAME = "lo"  # Linux's loopback interface: gloo binds here and nowhere else


def join(store_dir: str, rank: int, world: int, device: str,
         timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
    """Form (or join) the group of ``world`` ranks whose rendezvous file lies in
    ``store_dir``; blocks until every rank joined or ``timeout_s`` passed."""
    if sys.platform == "linux":
        os.environ["GLOO_SOCKET_IFNAME"] = LOOPBACK_IFNAME
    store = dist.FileStore(os.path.join(store_dir, "rendezvous"), world)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def leave() -> None:
    """Tear the group down (this process is done with it)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_device(device: str, rank: int) -> str:
    """The device rank ``rank`` computes on: ``cuda:<rank>`` on CUDA, the CPU otherwise."""
    return f"cuda:{rank}" if device.startswith("cuda") else device


def rank_threads(asked: int | None, world: int) -> int:
    """A rank's share of the engine's CPU threads (all cores when none were asked)."""
    total = asked if asked is not None else (os.cpu_count() or 1)
    return max(1, total // world)


class AllReduce(nn.Module):
    """A row-parallel layer: its partial product summed over the group (each rank holds some
    input columns; the bias is on rank 0 only)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x).contiguous()
        dist.all_reduce(out)  # bounded by the group's timeout
        return out
