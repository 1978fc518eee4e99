"""Decoding a CVAE under chosen latent values: greedily (eval, generate) or by sampling at a temperature (generate).

A decode continues the z-conditioned template up to where y starts (built-in template: ``<bos> <x> x </x>
<z> slots </z> <y>``; a chat template: the generation prompt, then the slots) one token at a time until
every row has emitted the template's end token (``vocab.end_id``: ``</y>``, or the end of the turn). Each step runs the backbone's head on the
last position only: (N, V) logits, never (N, L, V).

The prompt, with what the z pathway puts in it, runs once and fills a key/value cache; each new token then
runs as one position against it (``continue_cached``): a new token costs one position's work plus attention
over the cache, not the whole sequence's. ``continue_until`` recomputes every position at every step: the
reference.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.tokens.templates import Text, template_ids
from tokweight.training.cvae.model import CVAE

Pick = Callable[[torch.Tensor], torch.Tensor]
"""(N, V) logits of each row's next token -> (N,) the ids chosen."""


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)


class Sampler:
    """Draws each next token from softmax(logits / temperature). The draws are made on the CPU from
    ``torch.Generator().manual_seed(seed)``, so a seed gives the same draws on any device."""

    def __init__(self, temperature: float, seed: int):
        if not temperature > 0:
            raise ValueError(f"a sampling temperature must be > 0, got {temperature}")
        self.temperature, self.generator = temperature, torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.float() / self.temperature, -1).cpu()  # (N, V) float32
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0].to(logits.device)


def picker(temperature: float, seed: int) -> Pick:
    """Greedy at temperature 0, else sampling at that temperature from ``seed``."""
    return greedy if temperature == 0 else Sampler(temperature, seed)


@torch.no_grad()
def continue_until(next_logits, prefix: torch.Tensor, end: int, max_new: int, pick: Pick = greedy) -> torch.Tensor:
    """(N, L + n) the rows of ``prefix`` (N, L) continued by ``pick``, n <= max_new tokens, until every row has
    emitted ``end``; next_logits(ids (N, L')) -> (N, V) the logits of each row's next token."""
    ids, done = prefix, torch.zeros(len(prefix), dtype=torch.bool, device=prefix.device)
    for _ in range(max_new):
        nxt = pick(next_logits(ids))
        ids = torch.cat([ids, nxt[:, None]], 1)
        done |= nxt == end
        if done.all():
            break
    return ids


@torch.no_grad()
def continue_cached(backbone, prefix: torch.Tensor, end: int, max_new: int, pick: Pick = greedy, *,
                    tok_emb: torch.Tensor | None = None, ln_cond: torch.Tensor | None = None,
                    memory: torch.Tensor | None = None, query: torch.Tensor | None = None) -> torch.Tensor:
    """``continue_until`` over ``backbone.hidden(ids, tok_emb=, ln_cond=, memory=)`` with a key/value cache: the
    prompt ``prefix`` (N, L) runs once (``tok_emb`` (N, L, d) its embeddings, a ``memory`` the cache's first
    position), then each new token one position against the cache, which grows by it (``backbone.extend``);
    ``ln_cond`` and ``query`` modulate every position. The same tokens as recomputing every position at every step."""
    if max_new < 1:
        return prefix
    hidden, past = backbone.extend(prefix, tok_emb=tok_emb, ln_cond=ln_cond, memory=memory, query=query)
    out, done = [prefix], torch.zeros(len(prefix), dtype=torch.bool, device=prefix.device)
    for step in range(max_new):
        nxt = pick(backbone.head(hidden[:, -1]))  # (N,)
        out.append(nxt[:, None])
        done |= nxt == end
        if step == max_new - 1 or done.all():
            break
        hidden, past = backbone.extend(nxt[:, None], ln_cond=ln_cond, prefix=past, query=query)  # (N, 1, d)
    return torch.cat(out, 1)


def until_end(row: list[int], end: int) -> list[int]:
    return row[: row.index(end)] if end in row else row


@dataclass(frozen=True)
class Prompt:
    """What a decode continues: the z-conditioned template up to ``<y>`` (latent slots hold a placeholder that
    the pathway replaces) and the positions of its latent slots."""

    ids: tuple[int, ...]
    slot_positions: tuple[int, ...]


def stand_in_y(vocab) -> Text:
    """A one-token y for ``template_ids``: a prompt ends where y starts, and its ids are the same for any y the
    template renders (a chat or text template tokenizes the prompt and y apart: ``pipeline.tokens.templates``). A
    vocabulary with a tokenizer gets a string (a chat template takes no list), a symbol vocabulary a symbol."""
    if not vocab.template.builtin:
        return "a"
    for token in vocab.tokens:
        try:
            vocab.encode_symbols([token])
            return [token]
        except ValueError:  # a template or latent token: not data
            continue
    raise ValueError("the vocabulary holds no data token")


def prompt_maker(vocab, slots: int) -> Callable[[Text, str | None], Prompt]:
    """(x, key) -> x's prompt with ``slots`` latent slots: the start of the ids every sample of x trains on, up to
    y's first token; a bad x raises SampleError naming the key."""
    y, latent = stand_in_y(vocab), [vocab.latent_id(0)] * slots

    def make(x: Text, key: str | None = None) -> Prompt:
        ids, lay = template_ids(vocab, x, y, latent, key=key)
        return Prompt(tuple(ids[: lay.s_start]), tuple(lay.slot_positions))

    return make


def latent_values(model: CVAE, centres: np.ndarray | None):
    """(z features (V, F), slot ids (V,) or None): every k, or the continuous cluster centres."""
    lat = model.latent
    if lat.kind == "discrete":
        return torch.eye(lat.k), lat.latent_ids.clone()
    return torch.as_tensor(centres, dtype=torch.float32), None


def z_next_logits(model: CVAE, slot_pos: torch.Tensor, z: torch.Tensor, slot_ids: torch.Tensor | None):
    """ids (N, L) -> (N, V) next-token logits of the decoder under z: the head on the last position only."""
    def next_logits(ids):
        inp, kwargs = model.conditioning.decoder_inputs(model.backbone, ids, slot_pos, z, slot_ids)
        return model.backbone.head(model.backbone.hidden(inp, **kwargs)[:, -1])

    return next_logits


@torch.no_grad()
def decode_ids(model: CVAE, prompts: list[Prompt], z: torch.Tensor, slot_ids: torch.Tensor | None, end: int,
               max_new: int | None, pick: Pick = greedy, *, cached: bool = True) -> list[list[int]]:
    """The ids of y (up to ``end``, excluded) for every (prompt, latent value): z (V, F) features, slot_ids (V,)
    or None. Returns len(prompts) * V id lists, prompt-major. Prompts are batched by length; max_new None: as
    many tokens as the backbone's context leaves. ``cached`` False: every step recomputes every position (the
    reference the cached decode is tested against, and the benchmark's baseline)."""
    V, device = z.shape[0], next(model.parameters()).device
    groups, outputs = defaultdict(list), {}
    for i, p in enumerate(prompts):
        groups[(len(p.ids), p.slot_positions)].append(i)
    for (length, slots), idx in groups.items():
        prefix = torch.tensor([prompts[i].ids for i in idx], device=device).repeat_interleave(V, 0)  # (n*V, L)
        sid = None if slot_ids is None else slot_ids.to(device).repeat(len(idx))
        slot_pos = torch.tensor([slots], device=device).expand(len(prefix), len(slots))
        zs, room = z.to(device).repeat(len(idx), 1), model.backbone.cfg.block_size - length
        n = room if max_new is None else min(max_new, room)
        if cached:
            inputs, kwargs = model.conditioning.decoder_inputs(model.backbone, prefix, slot_pos, zs, sid)
            rows = continue_cached(model.backbone, inputs, end, n, pick, **kwargs)
        else:
            rows = continue_until(z_next_logits(model, slot_pos, zs, sid), prefix, end, n, pick)
        for row, ids in enumerate(rows[:, length:].tolist()):
            outputs[idx[row // V] * V + row % V] = until_end(ids, end)
    return [outputs[j] for j in range(len(prompts) * V)]


@torch.no_grad()
def greedy_decode(model: CVAE, vocab, samples: list[Sample], z: torch.Tensor, slot_ids: torch.Tensor | None,
                  max_new: int) -> list[tuple[str, ...]]:
    """Greedy y, as token strings, for every (example, latent value): len(samples) * V outputs, example-major."""
    make = prompt_maker(vocab, model.conditioning.slots)
    inputs = [make(s.x, s.key) for s in samples]
    return [tuple(vocab.decode(ids)) for ids in decode_ids(model, inputs, z, slot_ids, vocab.end_id, max_new)]
