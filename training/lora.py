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
from torch.nn.utils import parametrize

from tokweight.pipeline.extras import require
from tokweight.pipeline.hf import HFBackbone
from tokweight.training.configs import CVAEConfig
from tokweight.training.cvae import latent_tokens_needed


def require_peft():
    """The peft module, or a one-line error naming the extra that installs it."""
    return require("peft", "lora", "--lora-rank")


class LatentRows(nn.Module):
    """A parametrization of an embedding weight (V, d): its rows ``ids`` are the trainable ``rows``, the others
    the frozen weight's. Off (``enabled`` False), the frozen weight itself: the checkpoint's rows."""

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor):
        super().__init__()
        self.register_buffer("ids", ids.to(weight.device), persistent=False)
        self.rows = nn.Parameter(weight.detach()[self.ids].clone())
        self.enabled = True

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return weight
        return weight.index_copy(0, self.ids, self.rows.to(weight.dtype))

    @torch.no_grad()
    def write(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Set the trainable rows of tokens ``ids`` (a subset of ``self.ids``) to ``values``."""
        where = {int(i): n for n, i in enumerate(self.ids.tolist())}
        self.rows[[where[int(i)] for i in ids]] = values.to(self.rows.dtype)


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
    return list(rows.values())
