"""The output head on selected hidden states: per-token NLL of targets, in chunks of positions.

Full-vocabulary logits at every position of every row are (rows, L, V) floats: with a
131k-token vocabulary, K = 4 copies of 8 sequences of 24 tokens already hold 0.4 GB, and
their log-softmax and gradients several times that. Only the states that predict a target
need the head, so backbones return hidden states and the head runs here, on those rows
only, a chunk of rows at a time, the log-softmax in float32 whatever the model's dtype.
Under autograd each chunk's logits are recomputed in the backward instead of kept
(``torch.utils.checkpoint``), so a step holds one chunk's logits at a time as well.

``model`` is any backbone of ``pipeline.models.backbone``'s interface: ``head(hidden)`` -> logits
and ``cfg.vocab_size``.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

LOGIT_CHUNK_BYTES = {"cpu": 1 << 26, "cuda": 1 << 30}
"""Float32 logits per head chunk, by device type (others take the CPU's). On the CPU 64 MiB (with Qwen2.5's
152,064-token vocabulary, 110 rows): a CPU operator costs little to call, so small chunks keep memory low at
little cost. On a GPU up to 1 GiB (1,765 rows at 152,064 tokens), and at most 1/64 of the device's memory: each
chunk is a handful of kernel launches in the forward and as many in the backward, and many small chunks would
leave the device waiting on the host. A training step's backward holds about four chunk-sized tensors at once
(the recomputed logits, their log-softmax and two gradients)."""


def chunk_rows(vocab_size: int, device: torch.device, chunk_elements: int | None = None) -> int:
    """Rows of hidden states per head chunk on ``device``: ``chunk_elements`` logits over a ``vocab_size``
    vocabulary (None: ``LOGIT_CHUNK_BYTES`` of float32 for the device), at least one."""
    if chunk_elements is None:
        chunk_bytes = LOGIT_CHUNK_BYTES.get(device.type, LOGIT_CHUNK_BYTES["cpu"])
        if device.type == "cuda":
            chunk_bytes = min(chunk_bytes, torch.cuda.get_device_properties(device).total_memory // 64)
        chunk_elements = chunk_bytes // 4
    return max(1, chunk_elements // vocab_size)


def token_logits(module, hidden: torch.Tensor, ids: torch.Tensor | None = None, *,
                 transpose: bool = False) -> torch.Tensor:
    """(..., d) hidden states -> (..., V) logits of a module holding token rows (an output head, or a tied input
    embedding: ``transpose``, as ``hidden @ weight.T``), or (..., len(ids)) those of the tokens ``ids`` only. A
    weight parametrized by trainable rows over a frozen one (``training.cvae.lora.LatentRows``: what offers ``logits``)
    gives its logits without rebuilding the (V, d) weight."""
    bias = getattr(module, "bias", None)
    rows = trainable_rows_of(module)
    if rows is not None:
        return rows.logits(module.parametrizations.weight.original, hidden, ids, bias)
    if transpose:
        return hidden @ (module.weight if ids is None else module.weight[ids]).T
    if ids is None:
        return module(hidden)
    return F.linear(hidden, module.weight[ids], None if bias is None else bias[ids])


def trainable_rows_of(module):
    """The weight's parametrization that offers ``logits`` and ``lookup`` (trainable rows over a frozen weight),
    when it is the only one and is on; else None."""
    parametrizations = getattr(module, "parametrizations", None)
    chain = getattr(parametrizations, "weight", None)
    if chain is None or len(chain) != 1 or not hasattr(chain[0], "logits") or not chain[0].enabled:
        return None
    return chain[0]


def target_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(N, V) logits, (N,) target ids -> (N,) NLL in nats, float32: -log_softmax(logits)[target]. Cross-entropy
    fuses the log-softmax and its backward: fewer passes over (N, V) than logsumexp(logits) - logits[target]."""
    return F.cross_entropy(logits.float(), targets, reduction="none")


def _head_nll(model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return target_nll(model.head(hidden), targets)


def head_nll(model, hidden: torch.Tensor, targets: torch.Tensor, chunk_elements: int | None = None) -> torch.Tensor:
    """(N, d) hidden states, (N,) the tokens they predict -> (N,) NLL in nats, float32. The head sees
    ``chunk_rows`` rows at a time, in the forward and (recomputing them) in the backward; each row's NLL is its
    own log-softmax, so the chunking does not change the values."""
    chunk = chunk_rows(model.cfg.vocab_size, hidden.device, chunk_elements)
    nll = partial(checkpoint, _head_nll, use_reentrant=False) if torch.is_grad_enabled() else _head_nll
    return torch.cat([nll(model, h, t) for h, t in zip(hidden.split(chunk), targets.split(chunk))])


def s_index(mask: torch.Tensor, count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, t), each (N,) long: the True entries of ``mask`` (R, T_max), row-major, as ``mask.nonzero``
    gives them. With ``count`` (N, a host int) and a mask whose rows hold their True entries first (S's: each
    row's first T), without reading the mask back from the device: every output size is then known on the host."""
    if count is None:
        return mask.nonzero(as_tuple=True)
    lengths = mask.sum(1)  # (R,) each row's T
    rows = torch.arange(len(mask), device=mask.device).repeat_interleave(lengths, output_size=count)
    firsts = (lengths.cumsum(0) - lengths).repeat_interleave(lengths, output_size=count)  # (N,) its row's first entry
    return rows, torch.arange(count, device=mask.device) - firsts


def nll_over_s(model, hidden: torch.Tensor, logit_pos: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
               chunk_elements: int | None = None, count: int | None = None) -> torch.Tensor:
    """(B, T_max) per-token NLL over S in nats, float32, 0 where masked, from hidden (B, L, d): the head
    runs only on the states at ``logit_pos`` (B, T_max) where ``mask`` (B, T_max) holds. ``count``: the mask's
    True entries, a host int (``Batch.s_tokens``, times the copies), with which the step reads nothing back from
    the device (``s_index``); None: the mask is read (a host sync on a GPU)."""
    rows, t = s_index(mask, count)  # (N,) each, row-major: the order of mask's True entries
    nll = head_nll(model, hidden[rows, logit_pos[rows, t]], targets[rows, t], chunk_elements)  # (N,)
    return torch.zeros(mask.shape, dtype=nll.dtype, device=nll.device).index_put((rows, t), nll)
