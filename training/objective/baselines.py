"""Where b_t comes from each step (docs/contract.md §3 `policy`); every policy returns (B, T_max) nats over S, detached.

- precomputed: the store's row, joined into the batch by the data stream (no forward pass);
- frozen:      a frozen copy of the baseline (entangled) model, one extra z-free forward; in a LoRA run
               on that model, the run's own backbone with its adapters off (``AdaptersOff``), no copy;
- dynamic:     the current backbone's z-free surprisal, taken from the posterior's z-free
               pass (the backbone is shared, so no extra pass).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn as nn

from tokweight.pipeline.models.backbone import s_nll
from tokweight.training.config.components import POLICIES

if TYPE_CHECKING:
    from tokweight.training.cvae.model import CVAEOutput
    from tokweight.training.loop.batches import TrainBatch

Baseline = Callable[["TrainBatch", "CVAEOutput"], torch.Tensor]


def precomputed(batch: TrainBatch, out: CVAEOutput) -> torch.Tensor:
    if batch.b is None:
        raise ValueError("policy 'precomputed' needs batches joined with a store (b is missing)")
    return batch.b


def dynamic(batch: TrainBatch, out: CVAEOutput) -> torch.Tensor:
    return out.zfree_nll


class Frozen:
    """b from a frozen baseline model, read in eval mode without gradients: a copy of ``model`` with its weights copied
    straight to ``device`` in ``dtype`` (the forward's: a bfloat16 run holds the copy in bfloat16), the original left
    as it is; or (``Frozen.loaded``) a model loaded for this alone, held as it is."""

    def __init__(self, model, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape_only = any(p.is_meta for p in model.parameters())  # an FSDP rank's: rank 0 broadcasts the weights
        weights = {id(p): nn.Parameter(torch.empty(p.shape, dtype=dtype, device="meta") if shape_only
                                       else p.detach().to(device, dtype, copy=True), requires_grad=False)
                   for p in model.parameters()}  # deepcopy takes these for the parameters: no full-size detour
        copied = copy.deepcopy(model, memo=weights)
        self.model = (copied.to_empty(device=device) if shape_only else copied.to(device)).eval()

    @classmethod
    def loaded(cls, model) -> Frozen:
        """``model`` itself, no copy (eval's and encode's baseline checkpoint, which nothing trains)."""
        frozen = cls.__new__(cls)
        frozen.model = model.eval().requires_grad_(False)
        return frozen

    def __call__(self, batch: TrainBatch, out: CVAEOutput | None = None) -> torch.Tensor:
        with torch.no_grad():
            return s_nll(self.model, batch.zfree)


class AdaptersOff:
    """b from the trained backbone itself with its LoRA adapters and latent rows off (``lora.Adapters.off``):
    the baseline checkpoint the adapters sit on, without a second copy of its weights. As ``Frozen`` reads its
    copy: in eval mode, without gradients, and over the checkpoint's own ``vocab_size`` tokens (the latent
    rows the run appended after them are left out of the softmax)."""

    def __init__(self, backbone, adapters, vocab_size: int):
        self.backbone, self.adapters = backbone, adapters
        self.cfg = replace(backbone.cfg, vocab_size=vocab_size)  # what head.nll_over_s reads

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        return self.backbone.hidden(idx)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.backbone.head(hidden)[..., : self.cfg.vocab_size]

    def __call__(self, batch: TrainBatch, out: CVAEOutput | None = None) -> torch.Tensor:
        training = self.backbone.training
        self.backbone.eval()
        try:
            with torch.no_grad(), self.adapters.off():
                return s_nll(self, batch.zfree)
        finally:
            self.backbone.train(training)


def frozen(model, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Frozen:
    if model is None:
        raise ValueError("policy 'frozen' needs the baseline model")
    return Frozen(model, device, dtype)


MAKERS: dict[str, Callable[..., Baseline]] = {
    "precomputed": lambda *_: precomputed,
    "frozen": frozen,
    "dynamic": lambda *_: dynamic,
}
"""(baseline model or None, device, dtype) -> the step's ``Baseline``, for each policy ``components.POLICIES`` names."""


def make_baseline(policy: str, baseline_model, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> Baseline:
    """The step's ``Baseline`` for ``policy``; a frozen model's copy on ``device`` in ``dtype``."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {policy!r}")
    return MAKERS[policy](baseline_model, device, dtype)
