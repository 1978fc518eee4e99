"""How z reaches the decoder: the z pathways of the z-conditioned template.

- ``token``:     one latent slot; a discrete z writes its ``<z_k>`` token there, a continuous z
                 a learned projection of z (through ``GPT.forward(tok_emb=...)``);
- ``prefix``:    M slots, filled the same way (``<z_k>`` in each, or a projection to M x d);
- ``layernorm``: one slot as in ``token``, and z also modulates every LayerNorm's scale
                 and shift (``GPT.forward(ln_cond=...)``);
- ``memory``:    z as one extra key/value position per layer (Optimus's "latent as memory"): a
                 learned projection of z's features (a discrete z's one-hot, a continuous z's sample)
                 to every layer's keys and values, which every position attends to
                 (``GPT.forward(memory=...)``; on a Hugging Face backbone a key/value cache holding that
                 position, so any architecture with a ``DynamicCache`` takes it, LayerNorms or not).
                 Memory only: the template's one slot keeps its fixed placeholder, so what the decoder
                 learns of z it learns through the memory alone, and the mode measures that pathway
                 rather than the slot's (``token``) plus something. The keys are given as cached keys,
                 i.e. already rotated: with RoPE that is a key at position 0 (whose rotation is the
                 identity); the tokens' positions start at 0 as without the memory.

``layernorm`` and ``memory`` reach the positions before ``<z>`` too (``modulates_prefix``), so the
prior is then read from an unconditioned pass over the prefix, and the prefix is not shared.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from tokweight.training.configs import COND_MODES


class Conditioning(nn.Module):
    def __init__(self, mode: str, slots: int, d_model: int, n_layernorms: int, features: int, continuous: bool,
                 memory_shape: tuple[int, int, int]):
        """memory_shape: the backbone's (layers, key/value heads, head dim), which the memory pathway fills."""
        super().__init__()
        if mode not in COND_MODES:
            raise ValueError(f"conditioning must be one of {COND_MODES}, got {mode!r}")
        if mode != "prefix" and slots != 1:
            raise ValueError(f"{mode!r} conditioning uses one slot, got slots={slots}")
        self.mode, self.slots, self.d_model, self.n_layernorms = mode, slots, d_model, n_layernorms
        self.memory_shape = tuple(memory_shape)
        self.slot_proj = nn.Linear(features, slots * d_model) if continuous and self.writes_slots else None
        self.ln_proj = nn.Linear(features, n_layernorms * 2 * d_model) if mode == "layernorm" else None
        self.memory_proj = nn.Linear(features, 2 * math.prod(memory_shape)) if mode == "memory" else None
        for lin in filter(None, (self.slot_proj, self.ln_proj, self.memory_proj)):  # GPT-2's embedding scale
            nn.init.normal_(lin.weight, std=0.02)
            nn.init.zeros_(lin.bias)

    @property
    def writes_slots(self) -> bool:
        return self.mode != "memory"

    @property
    def modulates_prefix(self) -> bool:
        """z reaches the positions before its slots too."""
        return self.ln_proj is not None or self.memory_proj is not None

    def decoder_inputs(self, backbone, ids: torch.Tensor, slot_pos: torch.Tensor, z: torch.Tensor,
                       slot_ids: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """ids (N, L) with placeholder slots, slot_pos (N, M), z (N, F) features, slot_ids (N,) or None
        -> (ids, keyword arguments of GPT.forward)."""
        N, M = slot_pos.shape
        z = z.to(backbone.wte.weight.dtype)
        kwargs = {}
        if self.writes_slots and slot_ids is not None:
            ids = ids.scatter(1, slot_pos, slot_ids[:, None].expand(N, M))
        elif self.writes_slots:
            emb = backbone.embed(ids)  # (N, L, d)
            slot_emb = self.slot_proj(z).view(N, M, self.d_model)
            kwargs["tok_emb"] = emb.scatter(1, slot_pos[..., None].expand(N, M, self.d_model), slot_emb)
        if self.ln_proj is not None:
            kwargs["ln_cond"] = self.ln_proj(z).view(N, self.n_layernorms, 2, self.d_model)
        if self.memory_proj is not None:
            layers, heads, head_dim = self.memory_shape
            kwargs["memory"] = self.memory_proj(z).view(N, layers, 2, heads, head_dim)
        return ids, kwargs
