"""A GPT-2 style decoder-only Transformer in plain PyTorch.

Learned absolute positions, pre-LayerNorm blocks, GELU MLP (4x), tied input/output
embeddings, biases everywhere: the GPT-2 architecture, so that `export_hf` can hand the
same weights to `transformers.GPT2LMHeadModel` and get the same logits.

The CVAE hooks are optional arguments of `forward`:
- `tok_emb` replaces the token embeddings (a continuous z written into latent slots);
- `ln_cond` modulates every LayerNorm's scale and shift (z-conditioned LayerNorm);
- `prefix` (from `GPT.prefix`) is a shared prefix's keys and values: the sequences given
  continue it, so several continuations of one prefix compute it once; `GPT.extend` returns
  one that holds its input too, so a decode runs each new token as one position against it;
- `memory` is one extra key/value position per layer that every position attends to (z as
  memory, Optimus-style): given directly as keys and values, it has no position of its own.
The model returns logits and the final hidden states, never a loss; ``hidden`` returns the
states alone, for callers that run the head on some positions only (``pipeline/models/head.py``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tokweight.pipeline.models.head import token_logits


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


class KVCache:
    """The built-in GPT's keys and values of a prefix: per layer (keys, values), each (N, n_head, P, d_head)."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]):
        self.layers = layers

    def key_values(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.layers

    def repeated(self, n: int) -> KVCache:
        return KVCache([tuple(t.repeat_interleave(n, 0) for t in kv) for kv in self.layers])

    def selected(self, rows: torch.Tensor) -> KVCache:
        return KVCache([tuple(t[rows] for t in kv) for kv in self.layers])


@dataclass(frozen=True)
class SharedPrefix:
    """A prefix that suffixes continue: its keys and values, and which of its P positions each
    row may attend to (rows' prefixes differ in length; a shorter one is followed by tokens that
    are not its own). Row r's suffix starts at position ``start[r]``.

    Decoding grows one (``GPT.extend``): the prompt's keys and values, then one position per new token
    (``continued``). A memory's one position leads such a cache; it is no token and takes no position
    (``unpositioned``), so the tokens' positions are as without it."""

    cache: Any  # a backbone's cache with ``repeated(n)``: KVCache for the GPT
    valid: torch.Tensor  # (N, P) bool
    unpositioned: int = 0  # leading cache positions that hold no token (a memory's one)

    @classmethod
    def of(cls, cache, lengths: torch.Tensor, width: int) -> SharedPrefix:
        """``cache`` of prefixes of ``width`` positions, row i's own being its first lengths[i]."""
        return cls(cache, torch.arange(width, device=lengths.device) < lengths[:, None])

    @property
    def start(self) -> torch.Tensor:
        return self.valid.sum(1) - self.unpositioned  # (N,) long: the position of the next token

    def repeated(self, n: int) -> SharedPrefix:
        """Each row ``n`` times, for as many suffixes: the prefix is still computed once, and the
        gradients of its copies sum into it."""
        if n == 1:
            return self
        return SharedPrefix(self.cache.repeated(n), self.valid.repeat_interleave(n, 0), self.unpositioned)

    def selected(self, rows: torch.Tensor) -> SharedPrefix:
        """The prefixes of ``rows`` (N',) indices, one suffix each (repeats allowed, as ``repeated``)."""
        return SharedPrefix(self.cache.selected(rows), self.valid[rows], self.unpositioned)

    def continued(self, cache, L: int) -> SharedPrefix:
        """This prefix followed by L tokens that every later token sees; ``cache`` holds all P + L positions."""
        own = torch.ones(len(self.valid), L, dtype=torch.bool, device=self.valid.device)
        return SharedPrefix(cache, torch.cat([self.valid, own], 1), self.unpositioned)


def nothing_before(N: int, device) -> SharedPrefix:
    """The prefix of sequences that start at position 0: no positions (its cache is never read)."""
    return SharedPrefix(None, torch.zeros(N, 0, dtype=torch.bool, device=device))


def memory_prefix(memory: torch.Tensor) -> SharedPrefix:
    """The prefix a memory (N, ...) makes: its one position, seen by every row, taking no position (its cache
    is the caller's)."""
    return SharedPrefix(None, torch.ones(len(memory), 1, dtype=torch.bool, device=memory.device), unpositioned=1)


def continues(prefix: SharedPrefix | None, memory: torch.Tensor | None, N: int, device) -> SharedPrefix:
    """What N sequences continue, as a prefix: ``prefix``, a memory's one position, or nothing (the latter two
    without a cache: the caller holds it)."""
    if memory is not None:
        memory_alone(memory, prefix)  # refuses both
        return memory_prefix(memory)
    return nothing_before(N, device) if prefix is None else prefix


def memory_layers(memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(N, n_layer, 2, kv_heads, head_dim) memory -> per layer (keys, values), each (N, kv_heads, 1, head_dim):
    one cached position, in the layout of a key/value cache."""
    return [(layer[:, 0, :, None], layer[:, 1, :, None]) for layer in memory.unbind(1)]


def memory_alone(memory: torch.Tensor, prefix: SharedPrefix | None) -> torch.Tensor:
    """(N, 1) bool: the memory's one position, which every row sees. Refuses a memory over a shared prefix,
    whose keys were computed without it."""
    if prefix is not None:
        raise ValueError("a memory and a shared prefix cannot be combined: the prefix's keys were computed "
                         "without the memory")
    return torch.ones(len(memory), 1, dtype=torch.bool, device=memory.device)


def suffix_positions(prefix: SharedPrefix | None, L: int, block_size: int, device) -> torch.Tensor:
    """(N, L) or (L,) positions of a suffix's tokens; padding past the context is clamped (it is never read)."""
    positions = torch.arange(L, device=device)
    if prefix is None:
        return positions
    return (prefix.start[:, None] + positions).clamp(max=block_size - 1)


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

    def forward(self, x: torch.Tensor, past: tuple | None = None, past_valid: torch.Tensor | None = None,
                query: torch.Tensor | None = None):
        """x (B, L, d) -> (B, L, d) and this call's (keys, values), each (B, n_head, L, d_head).
        ``past``: a prefix's (keys, values) that x continues, ``past_valid`` (B, P) its positions each row sees.
        ``query``: (B, n_head, d_head) added to every position's query (where it reads, not what it writes)."""
        B, L, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (t.view(B, L, self.n_head, d // self.n_head).transpose(1, 2) for t in (q, k, v))
        if query is not None:
            q = q + query[:, :, None, :].to(q.dtype)
        dropout = self.dropout if self.training else 0.0
        if past is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        else:
            causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            mask = torch.cat([past_valid[:, None, :].expand(B, L, -1), causal.expand(B, L, L)], -1)[:, None]
            y = F.scaled_dot_product_attention(q, torch.cat([past[0], k], 2), torch.cat([past[1], v], 2),
                                               attn_mask=mask, dropout_p=dropout)
        return self.c_proj(y.transpose(1, 2).reshape(B, L, d)), (k, v)


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

    def forward(self, x, cond_1=None, cond_2=None, past=None, past_valid=None, query=None):
        """-> (B, L, d) and the attention's (keys, values)."""
        a, kv = self.attn(_modulate(self.ln_1(x), cond_1), past, past_valid, query)
        x = x + self.drop(a)
        return x + self.mlp(_modulate(self.ln_2(x), cond_2)), kv


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.checkpointing = False  # recompute each block in the backward instead of keeping its activations
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

    def enable_checkpointing(self) -> None:
        """Gradient checkpointing: each block's activations are recomputed in the backward (memory for time);
        the shared x prefix's keys and values are outputs of the recomputed blocks, so sharing stays on."""
        self.checkpointing = True

    @property
    def prefix_shareable(self) -> bool:
        return True

    @property
    def memory_shape(self) -> tuple[int, int, int]:
        """(layers, key/value heads, head dim) of a ``memory``: one key and one value per layer and head."""
        return self.cfg.n_layer, self.cfg.n_head, self.cfg.d_model // self.cfg.n_head

    @property
    def query_shape(self) -> tuple[int, int, int]:
        """(layers, heads, head dim) of the query pathway's offsets: one per layer and head."""
        return self.memory_shape

    def _past(self, prefix: SharedPrefix | None, memory: torch.Tensor | None) -> tuple[list, torch.Tensor | None]:
        """Per layer the (keys, values) the sequences continue, and the (N, P) positions of them each row sees."""
        if memory is not None:
            return memory_layers(memory), memory_alone(memory, prefix)
        return ([None] * self.cfg.n_layer, None) if prefix is None else (prefix.cache.layers, prefix.valid)

    def _blocks(self, idx, tok_emb, ln_cond, prefix: SharedPrefix | None,
                memory: torch.Tensor | None = None, query: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        """(B, L, d) final hidden states and every layer's (keys, values)."""
        L = idx.shape[1]
        if L > self.cfg.block_size:
            raise ValueError(f"sequence length {L} exceeds block_size {self.cfg.block_size}")
        x = self.embed(idx) if tok_emb is None else tok_emb
        x = self.drop(x + self.wpe(suffix_positions(prefix, L, self.cfg.block_size, idx.device)))
        conds = [None] * self.cfg.n_layernorms if ln_cond is None else ln_cond.unbind(1)
        queries = [None] * self.cfg.n_layer if query is None else query.unbind(1)
        past, valid = self._past(prefix, memory)
        kvs = []
        recompute = self.checkpointing and torch.is_grad_enabled()
        for i, block in enumerate(self.h):
            args = (x, conds[2 * i], conds[2 * i + 1], past[i], valid, queries[i])
            x, kv = checkpoint(block, *args, use_reentrant=False) if recompute else block(*args)
            kvs.append(kv)
        return _modulate(self.ln_f(x), conds[-1]), kvs

    def hidden(self, idx: torch.Tensor, *, tok_emb: torch.Tensor | None = None,
               ln_cond: torch.Tensor | None = None, prefix: SharedPrefix | None = None,
               memory: torch.Tensor | None = None, query: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, L) -> final hidden states (B, L, d), after the last LayerNorm.

        tok_emb: (B, L, d) replaces `embed(idx)` when given.
        ln_cond: (B, n_layernorms, 2, d) scale/shift deltas, LayerNorms in forward order.
        prefix:  a ``SharedPrefix`` of B rows that idx continues (positions from ``prefix.start``).
        memory:  (B, layers, 2, heads, head_dim) (``memory_shape``): per layer one key and one value that
                 every position attends to; the tokens' positions still start at 0.
        query:   (B, layers, heads, head_dim) (``memory_shape`` less the 2): per layer and head an offset of every
                 position's query.
        """
        return self._blocks(idx, tok_emb, ln_cond, prefix, memory, query)[0]

    def extend(self, idx: torch.Tensor, *, tok_emb: torch.Tensor | None = None, ln_cond: torch.Tensor | None = None,
               prefix: SharedPrefix | None = None, memory: torch.Tensor | None = None,
               query: torch.Tensor | None = None) -> tuple[torch.Tensor, SharedPrefix]:
        """``hidden``'s (B, L, d) states, and the prefix a next token continues: the keys and values idx continued
        (``prefix``'s, a ``memory``'s one position, or none) followed by idx's own L. Decoding runs the prompt
        through it once, then each new token against what the last call returned (``training.decoding.decode``)."""
        hidden, own = self._blocks(idx, tok_emb, ln_cond, prefix, memory, query)
        past, _ = self._past(prefix, memory)
        layers = [kv if p is None else (torch.cat([p[0], kv[0]], 2), torch.cat([p[1], kv[1]], 2))
                  for p, kv in zip(past, own)]  # per layer (keys, values), each (B, n_head, P + L, d_head)
        return hidden, continues(prefix, memory, len(idx), idx.device).continued(KVCache(layers), idx.shape[1])

    def prefix(self, idx: torch.Tensor, lengths: torch.Tensor) -> SharedPrefix:
        """The keys and values of prefixes idx (B, P), row i's own being its first lengths[i] tokens."""
        return SharedPrefix.of(KVCache(self._blocks(idx, None, None, None)[1]), lengths, idx.shape[1])

    def head(self, hidden: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """(..., d) hidden states -> (..., V) logits, or (..., len(ids)) those of the tokens ``ids`` only
        (the output embedding is tied to wte)."""
        return token_logits(self.wte, hidden, ids, transpose=True)

    def forward(self, idx: torch.Tensor, *, tok_emb: torch.Tensor | None = None, ln_cond: torch.Tensor | None = None,
                prefix: SharedPrefix | None = None, memory: torch.Tensor | None = None,
                query: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """idx (B, L) -> logits (B, L, V) and final hidden states (B, L, d); see ``hidden``."""
        hidden = self.hidden(idx, tok_emb=tok_emb, ln_cond=ln_cond, prefix=prefix, memory=memory, query=query)
        return self.head(hidden), hidden
