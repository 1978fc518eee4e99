"""The CVAE: the entangled backbone + a z pathway (conditioning) + a latent, composed.

One backbone serves three reads per step, all beginning with the same ``<bos> <x> x </x>``:
- the z-free pass: its pooled hidden state feeds the posterior head, and its S NLLs
  are the current model's z-free surprisal (the ``dynamic`` baseline, no extra pass);
- the z-conditioned pass: every example's latent copies (K for a discrete latent, one
  sample for a continuous one) as ONE batched forward of B * copies rows;
- the prior: the decoder's own output at ``<z>`` (the position before the first slot; taken from
  copy 0, which has seen x only, or from an unconditioned prefix pass when the z pathway reaches the prefix).

Every pass returns hidden states; the output head runs only where it is read
(``pipeline/models/head.py``): on the states that predict S, in chunks, and at ``<z>`` on the
latent tokens' rows alone. Full-vocabulary logits at every position would be
B * (copies + 1) * L * V floats, most of them never read.

That common prefix (the tokens before ``<z>``) runs once (``SharedPrefix``: its keys and values), and the z-free pass and
the copies continue it: the same per-token NLLs and gradients as full passes, without K + 1
copies of the prefix's work. Not with the layernorm and memory pathways, whose z reaches the prefix too.

A batch in length groups (``batches.Groups``) runs the z-free pass and the copies group by group, each group padded
to its own longest row; the posterior, the latent's draws and every output are the whole batch's, in its order.

A discrete latent's copies carry every value whatever the posterior says, so with ``merge_passes`` (``io.merge_passes``,
on CUDA) a forward that makes gradients runs the z-free pass beside them: one forward of B * (K + 1) rows, each z-free
row padded to its copies' length and reading zero offsets (``Conditioning.with_z_free_rows``); the same NLLs,
posterior and gradients to rounding (with dropout, other masks).

Posterior input: the z-free hidden state at the last position (``<eos>``), which has
attended to all of x and y, or the mean of the states that predict S (``posterior_pool``).
The model returns per-token NLLs; the objective is a pure function of them (``training/objective/loss.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from tokweight.pipeline.models.head import nll_over_s
from tokweight.pipeline.models.gpt import GPT, SharedPrefix
from tokweight.pipeline.tokens.templates import gather_s
from tokweight.pipeline.tokens.vocab import Vocab, WithLatents
from tokweight.training.cvae.conditioning import Conditioning
from tokweight.training.config.components import CVAEConfig
from tokweight.training.loop.batches import Groups, TrainBatch
from tokweight.training.objective.global_batch import LOCAL, GlobalBatch
from tokweight.training.cvae.latent import CategoricalLatent, GaussianLatent


@dataclass
class CVAEOutput:
    post: Any  # (B, K) log q, or ((B, D) mu, (B, D) logvar)
    prior: Any  # same shapes as post
    nll: torch.Tensor  # (B, copies, T_max) l_t(z) nats over S, 0 where masked
    zfree_nll: torch.Tensor  # (B, T_max) the current backbone's z-free surprisal, detached
    pooled: torch.Tensor | None = None  # (B, d_post) the posterior head's input
    z: torch.Tensor | None = None  # (B * copies, F) the latent value of each decoder copy


@dataclass(frozen=True)
class Frame:
    """Where each row's backbone input starts: at 0 (whole sequences), or past a shared prefix of
    ``start`` tokens (the prefix's keys and values in ``prefix``), so positions shift by ``start``."""

    prefix: SharedPrefix | None = None
    start: torch.Tensor | None = None  # (B,)

    @classmethod
    def shared(cls, backbone, batch: TrainBatch) -> Frame:
        """The prefix both templates share: <bos> <x> x </x>, the tokens before <z>."""
        start = batch.z_pos
        return cls(backbone.prefix(batch.zcond.input_ids[:, : batch.widths.prefix], start), start)

    def ids(self, ids: torch.Tensor, width: int) -> torch.Tensor:
        """(B, L) sequences -> their tokens from ``start`` on (B, ``width``), ``width`` (a host int) the longest
        row's tokens from its start on; past a row's end, any tokens (attention is causal: a row's own tokens
        never see them)."""
        if self.prefix is None:
            return ids
        cols = self.start[:, None] + torch.arange(width, device=ids.device)
        return ids.gather(1, cols.clamp(max=ids.shape[1] - 1))

    def pos(self, pos: torch.Tensor) -> torch.Tensor:
        """(B, ...) sequence positions -> positions in this frame (masked entries, 0, stay in range)."""
        if self.prefix is None:
            return pos
        return (pos - self.start.view(-1, *[1] * (pos.dim() - 1))).clamp(min=0)

    def rows(self, copies: int) -> SharedPrefix | None:
        """The prefix for ``copies`` rows per example (none for whole sequences)."""
        return None if self.prefix is None else self.prefix.repeated(copies)

    def rows_then_one(self, copies: int) -> SharedPrefix | None:
        """The prefix for ``copies`` rows per example followed by one more row per example (none for whole
        sequences)."""
        if self.prefix is None:
            return None
        examples = torch.arange(len(self.start), device=self.start.device)
        return self.prefix.selected(torch.cat([examples.repeat_interleave(copies), examples]))


class CVAE(nn.Module):
    def __init__(self, backbone: GPT, latent: nn.Module, conditioning: Conditioning, pool: str = "last",
                 share_prefix: bool = True):
        super().__init__()
        self.backbone, self.latent, self.conditioning = backbone, latent, conditioning
        self.pool = pool  # CVAEConfig.posterior_pool
        self.share_prefix = share_prefix  # exact either way (tests/training/cvae/test_shared_prefix.py); off: for the bench
        self.merge_passes = False  # the train loop's ``io.merge_passes``: see ``merges_passes``

    @property
    def shares_prefix(self) -> bool:
        return self.share_prefix and not self.conditioning.modulates_prefix and self.backbone.prefix_shareable

    @property
    def merges_passes(self) -> bool:
        """The z-free pass and the copies run as one forward (``merge_passes``, set from ``io.merge_passes``): where
        the copies need not wait for the posterior (a discrete latent's copies carry every value) and the pathway lets
        z-free rows beside them (``Conditioning.passes_merge``), in a forward that makes gradients. Without them
        (validation, eval) the passes stay two: each frees its states before the next runs, and one pass of
        B * (K + 1) rows would peak above the copies' B * K (docs/benchmarks.md, the planner)."""
        return (self.merge_passes and torch.is_grad_enabled() and isinstance(self.latent, CategoricalLatent)
                and self.conditioning.passes_merge)

    @property
    def posterior_parameters(self) -> list[nn.Parameter]:
        """The posterior head's own parameters: where the gradient diagnostic is measured."""
        return list(self.latent.head.parameters())

    def posterior_input(self, batch: TrainBatch, hidden_free: torch.Tensor, frame: Frame = Frame()) -> torch.Tensor:
        """(B, d) what the posterior head reads from the backbone's z-free states ``hidden_free`` (B, L, d) in
        ``frame``: the state at <eos> ("last") or their mean over the positions that predict S ("mean")."""
        if self.pool == "mean":
            states = gather_s(hidden_free, frame.pos(batch.zfree.logit_pos))  # (B, T_max, d)
            mask = batch.zfree.mask[..., None].to(states.dtype)
            return (states * mask).sum(1) / mask.sum(1).clamp(min=1)
        rows = torch.arange(len(batch), device=batch.last_pos.device)
        return hidden_free[rows, frame.pos(batch.last_pos)]

    def forward(self, batch: TrainBatch, generator: torch.Generator | None = None,
                global_batch: GlobalBatch = LOCAL, *, at_posterior_mean: bool = False,
                free_only: bool = False) -> CVAEOutput:
        """``generator`` draws a continuous latent's noise for the whole ``global_batch``, so an
        example's noise does not depend on how many ranks share the step. ``at_posterior_mean``: a
        continuous latent's decoder runs one copy per example at its posterior's mean instead of the draws
        (eval's NLL under the example's own latent value). ``free_only``: the z-free pass alone, its ``pooled``
        and ``zfree_nll`` (the rest None), through the forward so that FSDP gathers the weights as for a step. A
        batch with length ``groups`` runs its passes group by group, each padded to its own longest row; the
        posterior, the latent's draws and the outputs are the batch's, in its order."""
        groups = Groups.of(batch)
        frames = [Frame.shared(self.backbone, p) if self.shares_prefix and not free_only else Frame()
                  for p in groups.parts]
        merged = self.merges_passes and not free_only
        if merged:  # every value's copy, whatever the posterior: beside the z-free rows, in one forward
            z = self.latent.every_value(len(batch), batch.z_pos.device)[0]  # the output's: each group makes its own
            free, decoded = zip(*(self._one_forward(p, frame) for p, frame in zip(groups.parts, frames)))
        else:
            free = [self._z_free(p, frame) for p, frame in zip(groups.parts, frames)]
        pooled = groups.merge([pooled for pooled, _ in free])  # (B, d_post)
        zfree_nll = groups.merge([nll for _, nll in free], batch.zfree.mask.shape[1])
        if free_only:
            return CVAEOutput(None, None, None, zfree_nll, pooled)
        post = self.latent.posterior(pooled)
        if not merged:
            z, slot_ids = (self.latent.mean_inputs(post) if at_posterior_mean
                           else self.latent.decoder_inputs(post, generator, global_batch))
            C = len(z) // len(batch)  # example i's copies are rows i*C .. i*C + C-1
            decoded = [self._decode_copies(p, frame, z_part, ids_part, C) for p, frame, z_part, ids_part
                       in zip(groups.parts, frames, groups.split(z, C), groups.split(slot_ids, C))]  # (nll, prior)
        nll = groups.merge([nll for nll, _ in decoded], batch.zcond.mask.shape[1])
        prior = groups.merge([prior for _, prior in decoded])
        return CVAEOutput(post, prior, nll, zfree_nll, pooled, z)

    def _z_free(self, batch: TrainBatch, frame: Frame) -> tuple[torch.Tensor, torch.Tensor]:
        """The z-free pass: (the posterior head's input (B, d), the z-free NLL (B, T_max) nats over S, detached)."""
        hidden = self.backbone.hidden(frame.ids(batch.zfree.input_ids, batch.widths.free_suffix), prefix=frame.rows(1))
        return self._read_z_free(batch, hidden, frame)

    def _read_z_free(self, batch: TrainBatch, hidden_free: torch.Tensor, frame: Frame):
        """The z-free pass's states (B, L, d) -> (the posterior head's input (B, d), the z-free NLL (B, T_max))."""
        free = batch.zfree
        pooled = self.posterior_input(batch, hidden_free, frame)
        with torch.no_grad():
            zfree_nll = nll_over_s(self.backbone, hidden_free, frame.pos(free.logit_pos), free.targets, free.mask,
                                   count=free.s_tokens)
        return pooled, zfree_nll

    def _decode_copies(self, batch: TrainBatch, frame: Frame, z: torch.Tensor, slot_ids: torch.Tensor | None, C: int):
        """The z-conditioned pass of every example's ``C`` copies (``z`` (B*C, F), ``slot_ids``) as one forward of
        B * C rows, and the prior: (the NLL (B, C, T_max) nats over S, the prior)."""
        ids, kwargs = self._copy_inputs(batch, frame.ids(batch.zcond.input_ids, batch.widths.cond_suffix), frame,
                                        z, slot_ids, C)
        hidden = self.backbone.hidden(ids, prefix=frame.rows(C), **kwargs)  # (B*C, L', d): all copies at once
        return self._read_copies(batch, hidden, frame, C)

    def _one_forward(self, batch: TrainBatch, frame: Frame):
        """The z-free pass and a copy per value (``C`` = K) as one forward of B * (C + 1) rows, the copies' B * C and
        then the B z-free rows, each padded to the longer template (tokens past a row's end are never read:
        attention is causal): (``_read_z_free``'s pair, ``_read_copies``' pair)."""
        free, cond, B, C = batch.zfree.input_ids, batch.zcond.input_ids, len(batch), self.latent.k
        z, slot_ids = self.latent.every_value(B, free.device)
        if frame.prefix is None:
            width = max(free.shape[1], cond.shape[1])
            free, cond = (nn.functional.pad(ids, (0, width - ids.shape[1])) for ids in (free, cond))
        else:
            width = max(batch.widths.free_suffix, batch.widths.cond_suffix)
            free, cond = frame.ids(free, width), frame.ids(cond, width)
        ids, kwargs = self._copy_inputs(batch, cond, frame, z, slot_ids, C)
        ids, kwargs = self.conditioning.with_z_free_rows(ids, kwargs, free)
        hidden = self.backbone.hidden(ids, prefix=frame.rows_then_one(C), **kwargs)
        return self._read_z_free(batch, hidden[B * C:], frame), self._read_copies(batch, hidden[: B * C], frame, C)

    def _copy_inputs(self, batch: TrainBatch, cond_ids: torch.Tensor, frame: Frame, z: torch.Tensor,
                     slot_ids: torch.Tensor | None, C: int) -> tuple[torch.Tensor, dict]:
        """The copies' backbone inputs: each example's z-conditioned ids (B, L') ``C`` times with its values written
        in, and the pathway's keyword arguments."""
        rep = lambda t: t.repeat_interleave(C, 0)
        return self.conditioning.decoder_inputs(self.backbone, rep(cond_ids), rep(frame.pos(batch.slot_pos)), z,
                                                slot_ids)

    def _read_copies(self, batch: TrainBatch, hidden: torch.Tensor, frame: Frame, C: int):
        """The copies' states (B*C, L', d) -> (their NLL (B, C, T_max) nats over S, the prior)."""
        cond, B = batch.zcond, len(batch)
        rep = lambda t: t.repeat_interleave(C, 0)  # each example's row for its C copies
        count = None if cond.s_tokens is None else C * cond.s_tokens
        nll = nll_over_s(self.backbone, hidden, rep(frame.pos(cond.logit_pos)), rep(cond.targets), rep(cond.mask),
                         count=count)
        prior = self.latent.prior(*self._at_z(batch, hidden[::C], frame))
        return nll.view(B, C, -1), prior

    def _at_z(self, batch: TrainBatch, hidden: torch.Tensor, frame: Frame):
        """What the prior reads at <z>, from a pass that has not seen z: the logits of the latent's
        ``prior_tokens`` (B, K) (None if it reads none) and the hidden state (B, d)."""
        if self.conditioning.modulates_prefix:
            hidden = self.backbone.hidden(batch.zcond.input_ids[:, : batch.widths.prefix + 1])
        rows = torch.arange(len(batch), device=hidden.device)
        at_z = hidden[rows, frame.pos(batch.z_pos)]  # (B, d)
        tokens = self.latent.prior_tokens
        return (None if tokens is None else self.backbone.head(at_z, tokens)), at_z


def check_backbone(backbone, cfg: CVAEConfig) -> None:
    """Refuse what this backbone cannot do, naming it: a Hugging Face model has no z-modulable
    LayerNorms (``n_layernorms`` 0)."""
    kind = getattr(backbone.cfg, "model_type", "") or "tokweight"
    if cfg.cond == "layernorm" and not backbone.cfg.n_layernorms:
        raise ValueError(f"the layernorm z pathway needs a backbone whose LayerNorms it can modulate; the {kind!r} "
                         "backbone has none: use --cond token, prefix or memory")
    if cfg.cond == "query" and not isinstance(backbone, GPT):
        backbone.query_sites()  # refuses an architecture whose queries it cannot find


def build_cvae(backbone: GPT, vocab: Vocab, cfg: CVAEConfig) -> CVAE:
    """backbone: the built-in GPT or any backbone with its interface (``pipeline.models.backbone``)."""
    check_backbone(backbone, cfg)
    d, n_ln = backbone.cfg.d_model, backbone.cfg.n_layernorms
    if cfg.latent == "discrete":
        if cfg.k > vocab.k_max:
            raise ValueError(f"k={cfg.k} exceeds the vocabulary's {vocab.k_max} latent tokens <z_0>..: append the "
                             "missing ones first (add_latent_tokens)")
        latent = CategoricalLatent(cfg.k, d, [vocab.latent_id(k) for k in range(cfg.k)])
    else:
        latent = GaussianLatent(cfg.z_dim, d, cfg.prior, cfg.samples)
    conditioning = Conditioning(cfg.cond, cfg.slots, d, n_ln, latent.features, continuous=cfg.latent == "continuous",
                                memory_shape=backbone.memory_shape, query_shape=backbone.query_shape)
    return CVAE(backbone, latent, conditioning, cfg.posterior_pool)


def latent_tokens_needed(cfg: CVAEConfig) -> int:
    """Latent tokens the z pathway writes: a discrete latent's K values; a continuous one's slots hold a
    projection of z, written over one placeholder token."""
    return cfg.k if cfg.latent == "discrete" else 1


def grow_embeddings(backbone, n: int) -> None:
    """Append ``n`` token rows to the backbone's embeddings, each the mean of the existing rows (no draw:
    the recipe spreads latent rows afterwards, ``spread_latent_embeddings``)."""
    if not isinstance(backbone, GPT):
        backbone.grow_vocab(n)  # pipeline.models.hf.HFBackbone
        return
    old = backbone.wte.weight.detach()  # (V, d), tied to the output head
    wte = nn.Embedding(len(old) + n, old.shape[1], device=old.device, dtype=old.dtype)
    with torch.no_grad():
        wte.weight.copy_(torch.cat([old, old.mean(0, keepdim=True).expand(n, -1)]))
    backbone.wte = wte
    backbone.cfg = replace(backbone.cfg, vocab_size=len(old) + n)


def add_latent_tokens(backbone, vocab, needed: int):
    """The vocabulary with at least ``needed`` latent tokens: ``vocab`` itself when the checkpoint has them,
    else with the missing ones appended after the backbone's last row, whose embeddings grow to match. Only
    the trainable copy changes: its checkpoint's store and fingerprint stay those of ``vocab``."""
    missing = needed - vocab.k_max
    if missing <= 0:
        return vocab
    first = backbone.cfg.vocab_size
    grow_embeddings(backbone, missing)
    return WithLatents(vocab, missing, first)


def token_row_spread(weight: torch.Tensor, exclude: torch.Tensor, chunk_rows: int = 8192) -> float:
    """RMS distance of an embedding's rows from their mean, over every row but ``exclude`` (the latent tokens):
    the scale of the inputs a backbone reads, in which the latent rows' offsets are given. In float64 and in
    chunks of rows (E||w||^2 - ||E w||^2), so a 128k-token vocabulary needs no centred copy of the matrix."""
    keep = torch.ones(len(weight), dtype=torch.bool, device=weight.device)
    keep[exclude] = False
    total, squares = torch.zeros(weight.shape[1], dtype=torch.float64, device=weight.device), 0.0
    for rows, kept in zip(weight.detach().split(chunk_rows), keep.split(chunk_rows)):
        rows = rows[kept].double()
        total += rows.sum(0)
        squares += rows.pow(2).sum().item()
    n = int(keep.sum())
    mean = total / n
    return math.sqrt(max(squares / n - mean.dot(mean).item(), 0.0))


def spread_latent_embeddings(backbone: GPT, latent_ids: list[int], norm: float, generator: torch.Generator,
                             center: bool = False) -> None:
    """Re-initialise the rows of ``<z_0..z_{K-1}>`` as mutually orthogonal random vectors of one norm;
    with ``center``, as the checkpoint's mean latent row plus such vectors, orthogonal to that mean.

    Why: an entangled checkpoint never sees a latent token, and with tied embeddings every unseen token's row
    receives the same push (its logit pushed down), so the K rows end up nearly parallel: the decoder starts
    almost z-invariant. Orthogonal rows give each k a distinct direction from step 0. Replacing the rows,
    though, feeds the decoder inputs it never saw (a base trained with z sections reads its mean latent row as
    "ignore"), and the offsets add up over several slots: centred rows at a fraction of the token-row spread
    keep the decoder near intact.
    """
    K, d = len(latent_ids), backbone.cfg.d_model
    if K + center > d:
        raise ValueError(f"cannot make {K} orthogonal latent embeddings in d_model={d}")
    weight = backbone.wte.weight
    ids = torch.tensor(latent_ids, device=weight.device)
    with torch.no_grad():
        # drawn and orthonormalised on the CPU, in float64: the same rows from a seed on every device
        mean = weight[ids].double().mean(0).cpu() if center else torch.zeros(d, dtype=torch.float64, device="cpu")
        directions = torch.randn(d, K, generator=generator, dtype=torch.float64, device="cpu")
        if center:  # orthonormalise against the mean first, so each row is mean + (a direction off it)
            directions = torch.linalg.qr(torch.cat([mean[:, None], directions], 1))[0][:, 1:]
        else:
            directions = torch.linalg.qr(directions)[0]  # (d, K) orthonormal
        write_rows(backbone.wte, ids, (mean[None] + norm * directions.T).to(weight.device, weight.dtype))


def write_rows(embedding: nn.Module, ids: torch.Tensor, rows: torch.Tensor) -> None:
    """Set an embedding's rows ``ids`` to ``rows``: in its weight, or where a LoRA run keeps them, trainable
    over its frozen weight (``lora.LatentRows``), which keeps the checkpoint's rows for the base model."""
    if parametrize.is_parametrized(embedding, "weight"):
        for parametrization in embedding.parametrizations.weight:
            parametrization.write(ids, rows)
    else:
        embedding.weight[ids] = rows
