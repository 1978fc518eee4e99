"""A GPT-2 style decoder-only Transformer in plain PyTorch.

Learned absolute positions, pre-LayerNorm blocks, GELU MLP (4x), tied input/output
embeddings, biases everywhere: the GPT-2 architecture, so that `export_hf` can hand the
same weights to `transformers.GPT2LMHeadModel` and get the same logits.

The CVAE hooks are two optional arguments of `forward`, both plain tensors:
- `tok_emb` replaces the token embeddings (a continuous z written into latent slots);
- `ln_cond` modulates every LayerNorm's scale and shift (z-conditioned LayerNorm).
The model returns logits and the final hidden states, never a loss.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    block_size: int = 64  # longest sequence, in tokens
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must be in [0, 1)")

    @property
    def n_layernorms(self) -> int:
        """LayerNorms in forward order: ln_1, ln_2 per block, then ln_f."""
        return 2 * self.n_layer + 1

    def to_json(self) -> dict:
        return asdict(self)


def _modulate(h: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
    """h (B, L, d) after a LayerNorm; cond (B, 2, d) = (delta scale, delta shift)."""
    if cond is None:
        return h
    return h * (1.0 + cond[:, 0, None, :]) + cond[:, 1, None, :]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        # (B, n_head, L, d_head)
        q, k, v = (t.view(B, L, self.n_head, d // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).reshape(B, L, d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cond_1=None, cond_2=None):
        x = x + self.drop(self.attn(_modulate(self.ln_1(x), cond_1)))
        return x + self.mlp(_modulate(self.ln_2(x), cond_2))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, L) token ids -> (B, L, d) token embeddings (no positions)."""
        return self.wte(idx)

    def hidden(self, idx: torch.Tensor, *, tok_emb: torch.Tensor | None = None,
               ln_cond: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, L) -> final hidden states (B, L, d), after the last LayerNorm.

        tok_emb: (B, L, d) replaces `embed(idx)` when given.
        ln_cond: (B, n_layernorms, 2, d) scale/shift deltas, LayerNorms in forward order.
        """
        B, L = idx.shape
        if L > self.cfg.block_size:
            raise ValueError(f"sequence length {L} exceeds block_size {self.cfg.block_size}")
        x = self.embed(idx) if tok_emb is None else tok_emb
        x = self.drop(x + self.wpe(torch.arange(L, device=idx.device)))
        conds = [None] * self.cfg.n_layernorms if ln_cond is None else ln_cond.unbind(1)
        for i, block in enumerate(self.h):
            x = block(x, conds[2 * i], conds[2 * i + 1])
        return _modulate(self.ln_f(x), conds[-1])

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) hidden states -> (..., V) logits (the output embedding is tied to wte)."""
        return hidden @ self.wte.weight.T

    def forward(self, idx: torch.Tensor, *, tok_emb: torch.Tensor | None = None,
                ln_cond: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """idx (B, L) -> logits (B, L, V) and final hidden states (B, L, d); see ``hidden``."""
        hidden = self.hidden(idx, tok_emb=tok_emb, ln_cond=ln_cond)
        return self.head(hidden), hidden
