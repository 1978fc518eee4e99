"""This process's place in a ``torchrun`` job, or a job of one when there is no launcher.

Both stages use it. Extraction needs no tensor traffic between ranks, only a few control
messages (the plan from rank 0, every rank's finished parts back to it), so its group is
gloo, also when the model runs on GPUs; training averages gradients and gathers batch
statistics, over NCCL when its tensors live on GPUs. ``torchrun`` exports RANK /
WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; without WORLD_SIZE > 1 no group is
created.
"""

from __future__ import annotations

import os
from datetime import timedelta


class RankFailed(RuntimeError):
    """Another rank of the job failed; its message is included."""


def resolve_device(requested: str) -> str:
    """``requested`` with "auto" resolved: "cuda" when torch sees a GPU, else "cpu"."""
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def rank_device(requested: str, local_rank: int) -> str:
    """The device a rank runs on: "cuda" (or "auto" on a machine with GPUs) means this node's GPU number
    LOCAL_RANK."""
    requested = resolve_device(requested)
    return f"cuda:{local_rank}" if requested == "cuda" else requested


class Ranks:
    def __init__(self, timeout_s: float = 1800.0, backend: str = "gloo"):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._dist = None
        self._owns_group = False
        if self.world > 1:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
                self._owns_group = True
            self._dist = dist

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested: str):
        """``requested`` as this rank's torch device (``rank_device``); a GPU is made current."""
        import torch

        device = torch.device(rank_device(requested, self.local_rank))
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL and the object collectives use the current device
        return device

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if self._dist is None:
            return obj
        box = [obj]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self._dist is None:
            return [obj]
        out = [None] * self.world
        self._dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait until every rank is here (a job of one: return)."""
        if self._dist is not None:
            self._dist.barrier()

    def close(self) -> None:
        if self._dist is not None and self._owns_group:
            self._dist.barrier()  # without it two-rank runs sometimes ended in SIGABRT at exit (docs/reference.md)
            self._dist.destroy_process_group()
        self._dist = None
