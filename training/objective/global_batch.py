"""The global batch of a data-parallel step, for the terms that couple its examples.

Most of the objective is a mean over examples: each rank takes the mean over its own
rows, and averaging the ranks' gradients gives the gradient of the global mean. Three
terms are not such means, and each rank alone would compute them over the wrong batch:
the Sinkhorn-balanced E-step (columns balanced over the batch), example-inverse's
normalisation of v_i to batch mean 1, and free bits' floor on the batch-mean KL. They
take a ``GlobalBatch`` argument; ``LOCAL`` (one process) makes each operation the plain
one, so a single process computes exactly what it computed before.

Rank r holds rows [r * B, (r + 1) * B) of the global batch (``stream.TrainStream`` builds
it so), every rank the same B: the rank-order concatenation of the ranks' rows is the
one-process batch of the same global size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class GlobalBatch:
    def __init__(self, rank: int = 0, world: int = 1):
        self.rank, self.world = rank, world

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's rows of ``x`` (B, ...) in rank order, detached: (world * B, ...)."""
        x = x.detach()
        if self.world == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global-batch tensor (world * B, ...) -> (B, ...)."""
        return x.chunk(self.world)[self.rank] if self.world > 1 else x

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """Mean over the global batch's rows of ``x`` (B, ...), with the gradient of the local mean:
        averaged over the ranks, that is the gradient of the global mean."""
        local = x.mean(0)
        if self.world == 1:
            return local
        total = local.detach().clone()
        dist.all_reduce(total)
        return local + (total / self.world - local).detach()

    def average(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` averaged over the ranks, detached (``x`` itself in a job of one)."""
        if self.world == 1:
            return x
        total = x.detach().clone()
        dist.all_reduce(total)
        return total / self.world

    def masked_mean(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Detached mean of ``x`` (B,) over the global batch's rows where ``keep`` (B,) bool; nan if none. A
        masked sum over a count, with no boolean indexing (whose output size the host would read back)."""
        sums = torch.stack([(x.detach() * keep).sum(), keep.sum().to(x.dtype)])
        if self.world > 1:
            dist.all_reduce(sums)
        return sums[0] / sums[1]


LOCAL = GlobalBatch()
