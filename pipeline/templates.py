"""Sequence templates and the index maps of the supervised set S (SPEC §2).

z-free (entangled model, baseline, posterior input):
    <bos> <x> x_1..x_m </x> <y> y_1..y_n </y> <eos>
z-conditioned (CVAE decoder), with M latent slots:
    <bos> <x> x_1..x_m </x> <z> <z_k>*M </z> <y> y_1..y_n </y> <eos>

S is y_1..y_n and </y>, so T = n + 1. Every per-token array in tokweight is indexed by
position in S (0..T-1); the layouts below say where S position 0 sits in each template.
The logit that predicts sequence position p sits at p - 1 (next-token prediction).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import numpy as np
import torch

from pipeline.errors import SampleError
from pipeline.vocab import Vocab

# Bump when the templates or the definition of S change: it is part of every fingerprint.
TEMPLATE_VERSION = "tokweight-templates-v1:S=y+</y>"


@dataclass(frozen=True)
class Layout:
    """Positions in one sequence. ``slots`` = 0 is the z-free template."""

    m: int  # len(x)
    n: int  # len(y)
    slots: int = 0

    @property
    def T(self) -> int:
        return self.n + 1

    @property
    def z_pos(self) -> int:
        """Position of ``<z>``: its logits are the prior over the latent tokens."""
        if not self.slots:
            raise ValueError("the z-free template has no <z>")
        return self.m + 3

    @property
    def slot_positions(self) -> range:
        return range(self.m + 4, self.m + 4 + self.slots)

    @property
    def s_start(self) -> int:
        """Sequence position of y_1, the first element of S."""
        z_section = self.slots + 2 if self.slots else 0
        return self.m + 4 + z_section

    @property
    def length(self) -> int:
        return self.s_start + self.T + 1  # ... </y> <eos>

    def s_positions(self) -> range:
        return range(self.s_start, self.s_start + self.T)

    def s_logit_positions(self) -> range:
        return range(self.s_start - 1, self.s_start + self.T - 1)


def _check_y(y: Sequence[str], key: str | None) -> None:
    if len(y) == 0:
        raise SampleError("empty-y", "y is empty: S would only hold </y>", key=key)


def zfree_ids(vocab: Vocab, x: Sequence[str], y: Sequence[str], *, key: str | None = None) -> list[int]:
    _check_y(y, key)
    v = vocab.id
    return ([v("<bos>"), v("<x>")] + vocab.encode_symbols(x, key=key, field_name="x") + [v("</x>"), v("<y>")]
            + vocab.encode_symbols(y, key=key, field_name="y") + [v("</y>"), v("<eos>")])


def zcond_ids(vocab: Vocab, x: Sequence[str], y: Sequence[str], slot_ids: Sequence[int], *,
              key: str | None = None) -> list[int]:
    """The z-conditioned template with ``slot_ids`` in the latent slots (one id per slot)."""
    _check_y(y, key)
    if not slot_ids:
        raise ValueError("the z-conditioned template needs at least one latent slot")
    v = vocab.id
    return ([v("<bos>"), v("<x>")] + vocab.encode_symbols(x, key=key, field_name="x") + [v("</x>"), v("<z>")]
            + list(slot_ids) + [v("</z>"), v("<y>")] + vocab.encode_symbols(y, key=key, field_name="y")
            + [v("</y>"), v("<eos>")])


def s_targets(ids: Sequence[int], layout: Layout) -> list[int]:
    """Token ids of S read off a sequence: the echo the store keeps to check alignment."""
    return [ids[p] for p in layout.s_positions()]


def check_length(length: int, block_size: int, *, key: str | None = None) -> None:
    if length > block_size:
        raise SampleError("too-long", f"sequence of {length} tokens exceeds the model context of {block_size}",
                          key=key)


@dataclass(frozen=True)
class Batch:
    """Right-padded sequences and where S sits in each.

    input_ids:   (B, L) long, <pad> = 0 past each sequence's end
    logit_pos:   (B, T_max) long, the position whose logits predict S position t (0 where masked)
    targets:     (B, T_max) long, S token ids (0 where masked)
    mask:        (B, T_max) bool, True on real S positions
    """

    input_ids: torch.Tensor
    logit_pos: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor

    def to(self, device) -> "Batch":
        return Batch(*(t.to(device) for t in (self.input_ids, self.logit_pos, self.targets, self.mask)))


def collate(seqs: Sequence[Sequence[int]], layouts: Sequence[Layout], *, pad_to: int | None = None) -> Batch:
    """Pad sequences to one length and build the S index maps (array operations, no per-row tensors)."""
    lengths = np.array([len(s) for s in seqs])  # (B,)
    expected = np.array([lay.length for lay in layouts])
    if (bad := np.flatnonzero(lengths != expected)).size:
        i = int(bad[0])
        raise ValueError(f"sequence {i} has {lengths[i]} tokens, its layout says {expected[i]}")
    L = int(lengths.max()) if pad_to is None else pad_to
    T = np.array([lay.T for lay in layouts])  # (B,)
    s_start = np.array([lay.s_start for lay in layouts])  # (B,)
    input_ids = np.zeros((len(seqs), L), dtype=np.int64)
    input_ids[np.arange(L) < lengths[:, None]] = np.fromiter(chain.from_iterable(seqs), np.int64, lengths.sum())
    t = np.arange(T.max())  # (T_max,)
    mask = t < T[:, None]  # (B, T_max)
    logit_pos = np.where(mask, s_start[:, None] - 1 + t, 0)
    targets = np.where(mask, np.take_along_axis(input_ids, np.where(mask, logit_pos + 1, 0), axis=1), 0)
    return Batch(*(torch.from_numpy(a) for a in (input_ids, logit_pos, targets, mask)))


def gather_s(per_position: torch.Tensor, logit_pos: torch.Tensor) -> torch.Tensor:
    """(B, L, ...) values per sequence position -> (B, T_max, ...) at the positions predicting S."""
    idx = logit_pos
    for _ in range(per_position.dim() - 2):
        idx = idx.unsqueeze(-1)
    idx = idx.expand(*logit_pos.shape, *per_position.shape[2:])
    return per_position.gather(1, idx)


def token_surprisal(logits_s: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token NLL in nats, float32: -(logit[target] - logsumexp(logits)); 0 where masked.

    logits_s: (B, T, V) logits at the positions predicting S; targets, mask: (B, T).
    """
    logits_s = logits_s.float()
    nll = torch.logsumexp(logits_s, dim=-1) - logits_s.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return nll.masked_fill(~mask, 0.0)
