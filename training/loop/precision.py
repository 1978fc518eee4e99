"""The training step's precision, in one place.

Under "bfloat16" (what "auto" gives on CUDA): the trainable parameters, their gradients and AdamW's state stay
float32 and the forward runs under autocast; the weights that do not train (a LoRA run's backbone, the frozen
policy's copy of the baseline model) are *held* in bfloat16, so they take half the memory and autocast makes no
per-use copy of them for the backward. The log-softmax and every loss run in float32 whatever the forward's dtype
(``pipeline/models/head.py``, ``latent.at_least_float32``). Under "float32" nothing is cast and no autocast runs.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from tokweight.pipeline.models.dtypes import resolve_dtype, torch_dtype


def forward_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The forward's torch dtype for a config's ``dtype`` ("auto", "float32", "bfloat16") on ``device``."""
    return torch_dtype(resolve_dtype(dtype, device))


def autocast(dtype: str, device: torch.device):
    """The context a training or validation forward runs in: bfloat16 autocast, or nothing."""
    lower = forward_dtype(dtype, device)
    return torch.autocast(device.type, dtype=lower, enabled=lower != torch.float32)


def hold_frozen(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast every parameter that does not train to ``dtype``, in place (a tied weight is one parameter, cast once)."""
    if dtype == torch.float32:
        return
    for p in model.parameters():
        if not p.requires_grad and p.is_floating_point():
            p.data = p.data.to(dtype)
