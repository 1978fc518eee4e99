"""LoRA: a frozen backbone with low-rank adapters, for backbones too large to train whole (``train --lora-rank``).

What trains: peft's LoRA adapters on every linear layer of the backbone (attention and MLP; not the output
head), the latent tokens' embedding rows (``LatentRows``: trainable rows over the frozen embedding, in the
input embedding and in an untied output head) and everything outside the backbone (the posterior head,
the prior, the z pathway's projections). The rest of the backbone is frozen: the optimizer holds only the
trained parameters, and a checkpoint stores only them (``run_dir.trained_state``); the frozen weights are
the init checkpoint's, which ``run_dir.load_run`` reads again.

``Adapters.off()`` turns adapters and latent rows off: the backbone is then the checkpoint as loaded, which
the frozen policy reads b from (``baselines.AdaptersOff``) instead of holding a second copy.

peft is the optional ``[lora]`` extra, imported here only, and only when a run asks for adapters.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

from tokweight.pipeline.extras import require
from tokweight.pipeline.models.hf import HFBackbone
from tokweight.training.config.components import CVAEConfig
from tokweight.training.cvae.model import latent_tokens_needed


def require_peft():
    """The peft module, or a one-line error naming the extra that installs it."""
    return require("peft", "lora", "--lora-rank")


class LatentRows(nn.Module):
    """A parametrization of an embedding weight (V, d): its rows ``ids`` are the trainable ``rows``, the others
    the frozen weight's. Off (``enabled`` False), the frozen weight itself: the checkpoint's rows.

    Reading ``weight`` builds the whole (V, d) matrix (and its gradient, of which K rows are kept). The step's hot
    paths do without: an ``nn.Embedding``'s lookups take the frozen rows and put the trainable ones in where the
    ids are latent (``lookup``, ``embed_without_rebuilding``), and the heads' logits are the frozen weight's with
    the latent tokens' columns from the trainable rows (``logits``, read by ``pipeline.models.head.token_logits``)."""

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor):
        super().__init__()
        self.register_buffer("ids", ids.to(weight.device), persistent=False)
        slot = torch.full((len(weight),), -1, dtype=torch.long, device=weight.device)
        slot[self.ids] = torch.arange(len(self.ids), device=weight.device)
        self.register_buffer("slot", slot, persistent=False)  # (V,) token id -> its trainable row, -1: frozen
        self.rows = nn.Parameter(weight.detach()[self.ids].clone())
        self.enabled = True

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return weight
        return weight.index_copy(0, self.ids, self.rows.to(weight.dtype))

    def lookup(self, frozen: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """``frozen`` (..., d) rows looked up for the token ids ``idx`` (...) in the frozen weight -> the same with
        the trainable rows where the id is a latent token."""
        k = self.slot[idx]  # (...) trainable row, -1 for the frozen ones
        return torch.where((k >= 0)[..., None], self.rows.to(frozen.dtype)[k.clamp(min=0)], frozen)

    def logits(self, weight: torch.Tensor, hidden: torch.Tensor, ids: torch.Tensor | None = None,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """(..., d) -> (..., V) logits against the parametrized weight, the frozen ``weight`` (V, d) read as it is
        (no gradient) and the latent tokens' columns from the trainable rows; or (..., len(ids)) of the tokens
        ``ids`` only."""
        rows = self.rows.to(weight.dtype)
        if ids is not None:
            k = self.slot[ids]
            chosen = torch.where((k >= 0)[:, None], rows[k.clamp(min=0)], weight[ids])
            return F.linear(hidden, chosen, None if bias is None else bias[ids])
        out = F.linear(hidden, weight, bias)  # (..., V): the frozen columns
        latent = F.linear(hidden, rows, None if bias is None else bias[self.ids])  # (..., K)
        return out.index_copy(-1, self.ids, latent)

    @torch.no_grad()
    def write(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Set the trainable rows of tokens ``ids`` (a subset of ``self.ids``) to ``values``."""
        where = {int(i): n for n, i in enumerate(self.ids.tolist())}
        self.rows[[where[int(i)] for i in ids]] = values.to(self.rows.dtype)


def embed_without_rebuilding(module: nn.Embedding, rows: LatentRows):
    """An ``nn.Embedding``'s forward for a weight parametrized by ``rows``: the frozen weight's lookup with the
    trainable rows put in (``LatentRows.lookup``); the parametrized weight itself while the rows are off."""
    chain = module.parametrizations.weight

    def forward(idx: torch.Tensor) -> torch.Tensor:
        if not rows.enabled:
            return F.embedding(idx, chain.original, module.padding_idx)
        return rows.lookup(F.embedding(idx, chain.original, module.padding_idx), idx)

    return forward


@dataclass
class Adapters:
    """A backbone's LoRA adapters and trainable latent rows, and the switch that turns both off."""

    peft_model: nn.Module  # peft's PeftModel around the backbone; not a submodule of the CVAE (its weights are)
    latent_rows: list[LatentRows]

    @contextmanager
    def off(self):
        """The backbone as its checkpoint has it: adapters disabled (peft's ``disable_adapter``), latent rows
        the frozen weight's."""
        with self.peft_model.disable_adapter():
            for rows in self.latent_rows:
                rows.enabled = False
            try:
                yield
            finally:
                for rows in self.latent_rows:
                    rows.enabled = True


def latent_row_ids(vocab, cvae: CVAEConfig) -> list[int]:
    """The token ids whose embedding rows a LoRA run trains: those the z pathway writes (and any a run
    appended, which are among them)."""
    return [vocab.latent_id(k) for k in range(latent_tokens_needed(cvae))]


def attach(backbone: nn.Module, rank: int, latent_ids: list[int], seed: int) -> Adapters:
    """Freeze ``backbone`` (the built-in GPT or a Hugging Face one) and add LoRA adapters of ``rank`` and
    trainable latent rows, in place. The adapters' A is drawn from ``seed`` under a forked RNG, so that every
    other draw of the run (dropout) is the one a full-parameter run makes."""
    peft = require_peft()
    # peft excludes the output head from "all-linear" on a transformers model: wrap that model, not HFBackbone
    target = backbone.model if isinstance(backbone, HFBackbone) else backbone
    # GPT-2's Conv1D layers store W as (in, out): say so, or peft sets it per module itself and warns (the same
    # adapters either way; a model with both kinds of layer would still draw its warning for the other kind)
    transposed = any(type(m).__name__ == "Conv1D" for m in target.modules())
    config = peft.LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules="all-linear",
                             fan_in_fan_out=transposed)
    cuda = sorted({p.device for p in backbone.parameters() if p.device.type == "cuda"}, key=str)
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        peft_model = peft.get_peft_model(target, config)  # freezes every weight of target but the adapters'
    return Adapters(peft_model, trainable_rows(backbone, torch.tensor(latent_ids)))


def token_row_modules(backbone: nn.Module) -> list[nn.Module]:
    """The modules holding the backbone's token rows: its input embedding, and a Hugging Face model's output
    head (the built-in GPT's head is its input embedding)."""
    if isinstance(backbone, HFBackbone):
        return [backbone.wte, backbone.model.get_output_embeddings()]
    return [backbone.wte]


def trainable_rows(backbone: nn.Module, ids: torch.Tensor) -> list[LatentRows]:
    """One ``LatentRows`` per distinct token-row weight of the backbone, parametrizing every module that holds
    it: a tied input embedding and output head share theirs."""
    modules = token_row_modules(backbone)
    weights = [module.weight for module in modules]  # before any parametrization replaces the attribute
    rows: dict[int, LatentRows] = {}
    for module, weight in zip(modules, weights):
        if id(weight) not in rows:
            rows[id(weight)] = LatentRows(weight, ids)
        parametrize.register_parametrization(module, "weight", rows[id(weight)], unsafe=True)
        if type(module).forward is nn.Embedding.forward and module.max_norm is None:  # a plain lookup
            module.forward = embed_without_rebuilding(module, rows[id(weight)])
    return list(rows.values())
