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

from tokweight.pipeline.errors import SampleError
from tokweight.pipeline.vocab import Vocab

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


Text = Sequence[str] | str  # a list of symbols, looked up one to one, or a string for a tokenizer


def template_ids(vocab: Vocab, x: Text, y: Text, slot_ids: Sequence[int] = (), *,
                 key: str | None = None) -> tuple[list[int], Layout]:
    """A sample in the z-free template (no ``slot_ids``) or the z-conditioned one (one id per
    latent slot), and its layout. The one place x and y become ids: the layout counts their
    tokens, which for a string is what the vocabulary's tokenizer made of it."""
    x_ids = vocab.encode_symbols(x, key=key, field_name="x")
    y_ids = vocab.encode_symbols(y, key=key, field_name="y")
    if not y_ids:
        raise SampleError("empty-y", "y is empty: S would only hold </y>", key=key)
    v = vocab.id
    z_section = [v("<z>"), *slot_ids, v("</z>")] if slot_ids else []
    ids = [v("<bos>"), v("<x>"), *x_ids, v("</x>"), *z_section, v("<y>"), *y_ids, v("</y>"), v("<eos>")]
    return ids, Layout(len(x_ids), len(y_ids), len(slot_ids))


def zfree_ids(vocab: Vocab, x: Text, y: Text, *, key: str | None = None) -> list[int]:
    return template_ids(vocab, x, y, key=key)[0]


def zcond_ids(vocab: Vocab, x: Text, y: Text, slot_ids: Sequence[int], *, key: str | None = None) -> list[int]:
    """The z-conditioned template with ``slot_ids`` in the latent slots (one id per slot)."""
    if not slot_ids:
        raise ValueError("the z-conditioned template needs at least one latent slot")
    return template_ids(vocab, x, y, slot_ids, key=key)[0]


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
