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
                 identity); the tokens' positions start at 0 as without the memory. Its projection starts
                 at the scale of the backbone's own keys and values (``Conditioning.init_memory``).

- ``query``:     z as an offset of every position's query, per layer and head: z moves where the decoder reads
                 and writes nothing of its own (the slot keeps its fixed placeholder). Its projection starts
                 at the scale of the backbone's keys (``Conditioning.init_memory``). On a Hugging Face
                 backbone through a forward hook on each layer's query projection (``HFBackbone.query_sites``),
                 before RoPE, which rotates the offset with the query.

``layernorm``, ``memory`` and ``query`` reach the positions before ``<z>`` too (``modulates_prefix``), so the
prior is then read from an unconditioned pass over the prefix, and the prefix is not shared.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from tokweight.training.config.components import COND_MODES


class Conditioning(nn.Module):
    def __init__(self, mode: str, slots: int, d_model: int, n_layernorms: int, features: int, continuous: bool,
                 memory_shape: tuple[int, int, int], query_shape: tuple[int, int, int] | None = None):
        """memory_shape: the backbone's (layers, key/value heads, head dim), which the memory pathway fills;
        query_shape: its (layers, query heads, head dim), which the query pathway offsets (None: memory_shape)."""
        super().__init__()
        if mode not in COND_MODES:
            raise ValueError(f"conditioning must be one of {COND_MODES}, got {mode!r}")
        if mode != "prefix" and slots != 1:
            raise ValueError(f"{mode!r} conditioning uses one slot, got slots={slots}")
        self.mode, self.slots, self.d_model, self.n_layernorms = mode, slots, d_model, n_layernorms
        self.continuous = continuous
        self.memory_shape = tuple(memory_shape)
        self.query_shape = tuple(query_shape or memory_shape)
        self.slot_proj = nn.Linear(features, slots * d_model) if continuous and self.writes_slots else None
        self.ln_proj = nn.Linear(features, n_layernorms * 2 * d_model) if mode == "layernorm" else None
        self.memory_proj = nn.Linear(features, 2 * math.prod(memory_shape)) if mode == "memory" else None
        self.query_proj = nn.Linear(features, math.prod(self.query_shape)) if mode == "query" else None
        for lin in filter(None, (self.slot_proj, self.ln_proj, self.memory_proj, self.query_proj)):  # GPT-2's scale
            nn.init.normal_(lin.weight, std=0.02)
            nn.init.zeros_(lin.bias)

    def init_memory(self, mean: torch.Tensor, spread: torch.Tensor, generator: torch.Generator) -> None:
        """Start each latent value's memory as one more token of the backbone's: at the mean of its keys and
        values (the bias), plus per head a random direction as long as their spread about that mean
        (``token_key_values``). A discrete z's one-hot picks one such column; a continuous z's F standard-normal
        features sum F of them, so its columns are 1/sqrt(F) as long.

        Why: started at GPT-2's std 0.02 the memory stays far below a token's keys and values for hundreds of
        steps (AdamW moves a weight by about lr a step), and z is not found.

        The query pathway's offsets start the same way from the keys' spread (a query's own scale; each query
        head that of the key head it reads), about a mean of 0: the base's own queries plus a random direction.
        """
        if self.memory_proj is not None:
            self._start_columns(self.memory_proj, spread, generator)
            with torch.no_grad():
                self.memory_proj.bias.copy_(mean.reshape(-1))
        else:  # each query head at the keys' spread of the key head it reads; the bias stays 0
            group = self.query_shape[1] // self.memory_shape[1]
            self._start_columns(self.query_proj, spread[:, :1].repeat_interleave(group, 2), generator)

    def _start_columns(self, proj: nn.Linear, spread: torch.Tensor, generator: torch.Generator) -> None:
        """proj's weight: per feature and per entry of ``spread`` (layers, parts, heads), a random direction over
        the head dim as long as that entry (a continuous z's F features 1/sqrt(F) as long)."""
        features, head_dim = proj.in_features, self.memory_shape[2]
        directions = torch.randn(*spread.shape, head_dim, features, generator=generator, dtype=torch.float64,
                                 device="cpu")
        directions = directions / directions.norm(dim=3, keepdim=True)
        column_norm = spread.double().cpu() / (math.sqrt(features) if self.continuous else 1.0)
        with torch.no_grad():
            proj.weight.copy_((directions * column_norm[..., None, None]).reshape(-1, features))

    def init_slots(self, mean_row: torch.Tensor, norm: float, generator: torch.Generator) -> None:
        """Start a continuous z's slots where the discrete latent's centred rows start: at the checkpoint's mean
        latent row (the bias), offset per slot by random directions orthogonal to it, each column 1/sqrt(F)
        long, so that a standard-normal z of F features moves a slot by about ``norm``.

        Why: at GPT-2's std 0.02 the projection gives the slots near-zero embeddings, inputs the base never read,
        which AdamW grows by about lr a step (the memory pathway's projection stays near its init scale for
        hundreds of steps)."""
        slots, d, features = self.slots, self.d_model, self.slot_proj.in_features
        if features >= d:
            raise ValueError(f"cannot make {features} directions orthogonal to the mean row in d_model={d}")
        mean = mean_row.double().cpu()
        directions = torch.randn(slots, d, features, generator=generator, dtype=torch.float64, device="cpu")
        directions = directions - mean[None, :, None] * (mean @ directions)[:, None] / mean.dot(mean)  # off the mean
        directions = torch.linalg.qr(directions)[0]  # (slots, d, F) orthonormal columns
        with torch.no_grad():
            self.slot_proj.weight.copy_((directions * norm / math.sqrt(features)).reshape(slots * d, features))
            self.slot_proj.bias.copy_(mean.repeat(slots))

    @property
    def writes_slots(self) -> bool:
        return self.mode not in ("memory", "query")

    @property
    def modulates_prefix(self) -> bool:
        """z reaches the positions before its slots too."""
        return self.ln_proj is not None or self.memory_proj is not None or self.query_proj is not None

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
            slot_emb = self.slot_proj(z).view(N, M, self.d_model).to(emb.dtype)  # an autocast's output: emb's dtype
            kwargs["tok_emb"] = emb.scatter(1, slot_pos[..., None].expand(N, M, self.d_model), slot_emb)
        if self.ln_proj is not None:
            kwargs["ln_cond"] = self.ln_proj(z).view(N, self.n_layernorms, 2, self.d_model)
        if self.memory_proj is not None:
            layers, heads, head_dim = self.memory_shape
            kwargs["memory"] = self.memory_proj(z).view(N, layers, 2, heads, head_dim)
        if self.query_proj is not None:
            kwargs["query"] = self.query_proj(z).view(N, *self.query_shape)
        return ids, kwargs

    @property
    def passes_merge(self) -> bool:
        """Rows without z can run in the copies' forward (``with_z_free_rows``): every pathway but memory, whose
        key/value position a z-free row would attend to."""
        return self.memory_proj is None

    def with_z_free_rows(self, ids: torch.Tensor, kwargs: dict, free_ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """``decoder_inputs``' ids (N, L) and keyword arguments followed by the z-free rows ``free_ids`` (B, L): N + B
        rows. A z-free row reads its own tokens, and zero LayerNorm and query offsets, which leave its states as the
        z-free pass computes them (a discrete z writes its slots as tokens, so no embeddings come in ``kwargs``)."""
        others = set(kwargs) - {"ln_cond", "query"}  # offsets whose zero leaves a row as it is (memory is not one)
        if others:
            raise ValueError(f"the {self.mode} z pathway cannot run z-free rows beside its copies ({sorted(others)})")
        zeros = lambda t: t.new_zeros(len(free_ids), *t.shape[1:])
        return torch.cat([ids, free_ids]), {name: torch.cat([t, zeros(t)]) for name, t in kwargs.items()}


def token_key_values(backbone, prefix_ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's keys and values at z-free positions, prefix_ids (N, P), row i's own its first lengths[i]:
    their mean (layers, 2, kv heads, head dim) and per head their RMS distance from it (layers, 2, kv heads)."""
    prefix = backbone.prefix(prefix_ids, lengths)
    kv = torch.stack([torch.stack(pair, 1) for pair in prefix.cache.key_values()], 1)  # (N, layers, 2, H, P, dh)
    seen = kv.permute(0, 4, 1, 2, 3, 5)[prefix.valid]  # (positions, layers, 2, H, dh)
    mean = seen.mean(0)
    return mean, (seen - mean).norm(dim=-1).pow(2).mean(0).sqrt()
