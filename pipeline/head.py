"""The output head on selected hidden states: per-token NLL of targets, in chunks of positions.

Full-vocabulary logits at every position of every row are (rows, L, V) floats: with a
131k-token vocabulary, K = 4 copies of 8 sequences of 24 tokens already hold 0.4 GB, and
their log-softmax and gradients several times that. Only the states that predict a target
need the head, so backbones return hidden states and the head runs here, on those rows
only, a chunk of rows at a time, the log-softmax in float32 whatever the model's dtype.
Under autograd each chunk's logits are recomputed in the backward instead of kept
(``torch.utils.checkpoint``), so a step holds one chunk's logits at a time as well.

``model`` is any backbone of ``pipeline.backbone``'s interface: ``head(hidden)`` -> logits
and ``cfg.vocab_size``.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

LOGIT_CHUNK_ELEMENTS = 1 << 24
"""Float32 logits per chunk (64 MiB): with a 131k-token vocabulary, 128 rows. A training step's backward
holds about four chunk-sized tensors at once (the recomputed logits, their log-softmax and two gradients)."""


def target_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(N, V) logits, (N,) target ids -> (N,) NLL in nats, float32: -log_softmax(logits)[target]. Cross-entropy
    fuses the log-softmax and its backward: fewer passes over (N, V) than logsumexp(logits) - logits[target]."""
    return F.cross_entropy(logits.float(), targets, reduction="none")


def _head_nll(model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return target_nll(model.head(hidden), targets)


def head_nll(model, hidden: torch.Tensor, targets: torch.Tensor,
             chunk_elements: int = LOGIT_CHUNK_ELEMENTS) -> torch.Tensor:
    """(N, d) hidden states, (N,) the tokens they predict -> (N,) NLL in nats, float32. The head sees
    ``chunk_elements`` // V rows at a time, in the forward and (recomputing them) in the backward."""
    chunk = max(1, chunk_elements // model.cfg.vocab_size)  # rows per chunk
    nll = partial(checkpoint, _head_nll, use_reentrant=False) if torch.is_grad_enabled() else _head_nll
    return torch.cat([nll(model, h, t) for h, t in zip(hidden.split(chunk), targets.split(chunk))])


def nll_over_s(model, hidden: torch.Tensor, logit_pos: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
               chunk_elements: int = LOGIT_CHUNK_ELEMENTS) -> torch.Tensor:
    """(B, T_max) per-token NLL over S in nats, float32, 0 where masked, from hidden (B, L, d): the head
    runs only on the states at ``logit_pos`` (B, T_max) where ``mask`` (B, T_max) holds."""
    rows, t = mask.nonzero(as_tuple=True)  # (N,) each, row-major: the order of mask's True entries
    nll = head_nll(model, hidden[rows, logit_pos[rows, t]], targets[rows, t], chunk_elements)  # (N,)
    return torch.zeros(mask.shape, dtype=nll.dtype, device=nll.device).masked_scatter(mask, nll)
