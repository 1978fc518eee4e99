"""Decoding with a key/value cache gives the tokens of recomputing every position at every step.

The reference is ``decode_ids(..., cached=False)`` (``continue_until`` over the whole sequence each step). Every z
pathway (token, prefix, layernorm, memory, query), both latents (discrete; continuous at given centres), greedy and
seeded sampling, the built-in GPT and Hugging Face GPT-2 and Llama built from a config, and a chat-template
checkpoint (Qwen2). Each decode runs to the end of the context or to an end token that some rows reach before
others; z is made strong enough that the decodes under different latent values differ, so a pathway the cache
dropped would show. The cached decodes run under the device guard. Beneath the tokens: a cache grown token by
token gives the full forward's hidden states, and the base model's greedy decode (eval) is its reference's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.device_guard import HostTensors
from tests.support.fixtures_hf import text_samples, tiny_hf_model
from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.models.hf import HFBackbone
from tokweight.pipeline.models.gpt import GPT, ModelConfig
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.tokens.templates import Template
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.training.config.components import CVAEConfig
from tokweight.training.cvae.model import add_latent_tokens, build_cvae, latent_tokens_needed, spread_latent_embeddings
from tokweight.training.decoding.decode import decode_ids, latent_values, picker, prompt_maker
from tokweight.training.evaluation.evaluate import base_greedy_decode

VOCAB = Vocab(tuple("abcdefgh"), k_max=4)
XS = [("a", "b"), ("c",), ("d", "e", "f"), ("a", "c"), ("b", "b", "b")]  # 3 lengths: 3 groups
BLOCK = 20  # decodes run to the end of this context (max_new None) unless an end token stops them
PATHWAYS = {"token": dict(cond="token"), "prefix": dict(cond="prefix", slots=3),
            "layernorm": dict(cond="layernorm"), "memory": dict(cond="memory"), "query": dict(cond="query")}
LATENTS = {"discrete": dict(latent="discrete", k=4), "continuous": dict(latent="continuous", z_dim=2)}
CENTRES = np.array([[1.5, -1.0], [-2.0, 0.5], [0.0, 2.0]], np.float32)  # a continuous latent's 3 values
TEMPERATURES = (0.0, 1.0)  # greedy, sampling from a seed


def backbone(kind: str):
    torch.manual_seed(0)
    if kind == "gpt":
        model = GPT(ModelConfig(vocab_size=len(VOCAB), block_size=BLOCK, n_layer=2, n_head=2, d_model=16))
    else:
        model = HFBackbone(tiny_hf_model(kind, len(VOCAB), BLOCK))
    return lively(model.eval())


def lively(model):
    """Every weight matrix redrawn at 1 / sqrt(fan in): at GPT-2's 0.02 a random model's greedy decode repeats
    one token (the state stays near the last token's embedding, tied to the head); these decodes vary."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5)
    return model


def strong_z(model, seed: int = 0) -> None:
    """z's projections and latent token rows made large, so that decodes under different values differ."""
    generator = torch.Generator().manual_seed(seed)
    cond = model.conditioning
    with torch.no_grad():
        for lin in filter(None, (cond.slot_proj, cond.ln_proj, cond.memory_proj, cond.query_proj)):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=generator))
    if model.latent.kind == "discrete":
        spread_latent_embeddings(model.backbone, model.latent.latent_ids.tolist(), 3.0, generator)


def cvae(backbone, vocab, pathway: str, latent: str):
    cfg = CVAEConfig(**PATHWAYS[pathway], **LATENTS[latent])
    vocab = add_latent_tokens(backbone, vocab, latent_tokens_needed(cfg))
    model = build_cvae(backbone, vocab, cfg).eval()
    strong_z(model)
    return model, vocab


def decodes(model, prompts, end: int, temperature: float, max_new: int | None, cached: bool) -> list[list[int]]:
    centres = CENTRES if model.latent.kind == "continuous" else None
    z, slot_ids = latent_values(model, centres)
    return decode_ids(model, prompts, z, slot_ids, end, max_new, picker(temperature, seed=5), cached=cached)


def varied_end(rows: list[list[int]]) -> int:
    """The token that rows first emit at the most different steps (never: one more), as the end token: rows
    then stop at different steps, and some run on."""
    firsts = lambda t: {row.index(t) if t in row else -1 for row in rows}
    return max(sorted({t for row in rows for t in row}), key=lambda t: len(firsts(t)))


def assert_cached_is_the_reference(model, vocab, xs, temperature: float, max_new: int | None = None) -> None:
    """Cached decode == reference, with an end token that rows reach at different steps (``varied_end``); the
    rest run to ``max_new`` or the context's end."""
    prompts = [prompt_maker(vocab, model.conditioning.slots)(x) for x in xs]
    end = varied_end(decodes(model, prompts, -1, temperature, max_new, cached=False))
    want = decodes(model, prompts, end, temperature, max_new, cached=False)
    with HostTensors():
        got = decodes(model, prompts, end, temperature, max_new, cached=True)
    assert got == want
    assert len({len(row) for row in want}) > 2  # rows ended at different steps, and some ran on
    if temperature == 0:
        V = len(want) // len(prompts)
        assert any(len({tuple(r) for r in want[i * V:(i + 1) * V]}) > 1 for i in range(len(prompts)))  # z matters


@pytest.mark.parametrize("temperature", TEMPERATURES, ids=["greedy", "sampled"])
@pytest.mark.parametrize("latent", LATENTS)
@pytest.mark.parametrize("pathway", PATHWAYS)
@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama"])
def test_the_cached_decode_gives_the_reference_tokens(kind, pathway, latent, temperature):
    if kind != "gpt" and pathway == "layernorm":
        pytest.skip(f"a Hugging Face backbone has no {pathway} pathway")
    model, vocab = cvae(backbone(kind), VOCAB, pathway, latent)
    assert_cached_is_the_reference(model, vocab, XS, temperature)


@pytest.mark.parametrize("temperature", TEMPERATURES, ids=["greedy", "sampled"])
@pytest.mark.parametrize("pathway,latent", [("token", "discrete"), ("prefix", "continuous"), ("memory", "discrete")])
def test_the_cached_decode_of_a_chat_template_checkpoint(chat_checkpoint, pathway, latent, temperature):
    ckpt = load_backbone(chat_checkpoint, template=Template("chat"))  # a fresh copy: latent tokens are appended
    model, vocab = cvae(ckpt.model, ckpt.vocab, pathway, latent)
    assert_cached_is_the_reference(model, vocab, [s.x for s in text_samples(5)], temperature, max_new=12)


@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama"])
def test_the_base_models_greedy_decode_is_its_reference(kind):
    base = backbone(kind)
    head = base.wte if kind == "gpt" else base.model.get_output_embeddings()
    with torch.no_grad():  # </y>'s logit 0 among logits of about unit spread: rows run on (</y> is never an input)
        head.weight[VOCAB.id("</y>")] = 0
    samples = [Sample(f"k{i}", x, ("a",)) for i, x in enumerate(XS)]
    want = base_greedy_decode(base, VOCAB, samples, 30, cached=False)
    with HostTensors():
        got = base_greedy_decode(base, VOCAB, samples, 30)
    assert got == want and len({len(y) for y in want}) > 1  # prompts of each length: their own room


def test_the_base_greedy_decode_of_a_chat_template_checkpoint(chat_checkpoint):
    ckpt = load_backbone(chat_checkpoint, template=Template("chat"))
    samples = text_samples(5)
    assert base_greedy_decode(ckpt.model, ckpt.vocab, samples, 12) == \
        base_greedy_decode(ckpt.model, ckpt.vocab, samples, 12, cached=False)


@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama"])
@pytest.mark.parametrize("with_memory", [False, True], ids=["plain", "memory"])
def test_a_cache_grown_token_by_token_gives_the_full_forward(kind, with_memory):
    """extend(prompt) then extend(one token) per step: the hidden states of one full pass (to 1e-5), the
    layernorm's modulation on every position (GPT), the memory's position first in the cache and no token's;
    a cache continued twice gives the same state (a step leaves the cache it continued as it was)."""
    bb = backbone(kind)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, len(VOCAB), (3, 12), generator=generator)
    layers, heads, head_dim = bb.memory_shape
    memory = torch.randn(3, layers, 2, heads, head_dim, generator=generator) if with_memory else None
    ln = torch.randn(3, bb.cfg.n_layernorms, 2, 16, generator=generator) * 0.5 if kind == "gpt" else None
    want = bb.hidden(ids, ln_cond=ln, memory=memory)
    hidden, past = bb.extend(ids[:, :5], ln_cond=ln, memory=memory)
    states = [hidden]
    for t in range(5, 12):
        before = past
        hidden, past = bb.extend(ids[:, t:t + 1], ln_cond=ln, prefix=before)
        states.append(hidden)
    torch.testing.assert_close(torch.cat(states, 1), want, rtol=0, atol=1e-5)
    assert past.valid.shape == (3, 12 + with_memory) and past.start.tolist() == [12] * 3
    again, _ = bb.extend(ids[:, 11:], ln_cond=ln, prefix=before)
    assert torch.equal(again, hidden)
