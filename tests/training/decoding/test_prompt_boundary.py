"""A decode starts from a prefix of the training ids, whatever y is.

Under a string template whose y follows a space ("Q: {x} A: {y}"), a byte-level BPE merges that space
into y's first word when the whole row is tokenized at once (" 3"), or leaves it a token of its own
when y starts with a space or a word it does not merge. The decode prompt (``prompt_maker``) must be
the training ids up to where y's tokens begin for every y, and greedy decoding's first step must score
the logits teacher forcing scores there. Checked on a tiny GPT-2 built from a config with a BPE
tokenizer trained here, and on a ChatML Qwen2 (a chat template) whose BPE merges "\n\n", for rows
whose y starts with newlines or spaces.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.fixtures_hf import text_corpus, text_samples
from tokweight.experiments.chat_model import bpe_tokenizer, save_chat_model
from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.tokens.templates import Template, template_ids
from tokweight.training.config.components import CVAEConfig
from tokweight.training.cvae.model import add_latent_tokens, build_cvae, latent_tokens_needed
from tokweight.training.decoding.decode import decode_ids, latent_values, prompt_maker

pytest.importorskip("transformers")
TEXT = Template("text", "Q: {x} A: {y}", "<|endoftext|>")
ROWS = [("what is 1 plus 2?", "3 is the sum"), ("what is 3 plus 4?", "the sum is 7"),
        ("what is 2 plus 2?", " 4, with a space"), ("what is 5 plus 1?", "a six"),
        ("what is 6 plus 3?", "\n9 on a line"), ("what is 1 plus 1?", "Answer: 2")]


@pytest.fixture(scope="module")
def text_ckpt(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    out = tmp_path_factory.mktemp("qa") / "gpt2"
    corpus = [f"Q: {s.x} A: {s.y}" for s in text_samples(64)] * 4
    tokenizer = bpe_tokenizer(out, corpus, ["<|endoftext|>"])
    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=4,
                               bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)).save_pretrained(out)
    return out


def cvae_of(path, template: Template, seed: int = 0):
    ckpt = load_backbone(path, template=template)
    cfg = CVAEConfig(cond="token", latent="discrete", k=2)
    vocab = add_latent_tokens(ckpt.model, ckpt.vocab, latent_tokens_needed(cfg))
    torch.manual_seed(seed)
    return build_cvae(ckpt.model, vocab, cfg).eval(), vocab


def teacher_forced(model, ids: list[int], slot_pos, z, slot_ids, position: int) -> torch.Tensor:
    """(V, vocab) the decoder's logits at ``position`` of the full training ids, under each latent value."""
    full = torch.tensor([ids]).repeat(len(z), 1)
    inp, kwargs = model.conditioning.decoder_inputs(model.backbone, full, slot_pos.expand(len(z), -1), z, slot_ids)
    return model.backbone.head(model.backbone.hidden(inp, **kwargs)[:, position])


def assert_prompts_are_training_prefixes(model, vocab, rows) -> None:
    slots = model.conditioning.slots
    make = prompt_maker(vocab, slots)
    z, slot_ids = latent_values(model, None)
    latent = [vocab.latent_id(0)] * slots
    for x, y in rows:
        prompt = make(x)
        ids, lay = template_ids(vocab, x, y, latent)
        assert list(prompt.ids) == ids[: lay.s_start], (x, y, vocab.decode(prompt.ids), vocab.decode(ids))
        assert prompt.slot_positions == tuple(lay.slot_positions)
        slot_pos = torch.tensor([prompt.slot_positions])
        with torch.no_grad():
            want = teacher_forced(model, ids, slot_pos, z, slot_ids, lay.s_start - 1)
            inp, kwargs = decoder_inputs(model, prompt, z, slot_ids)
            got = model.backbone.head(model.backbone.hidden(inp, **kwargs)[:, -1])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        first = decode_ids(model, [prompt], z, slot_ids, vocab.end_id, 1)
        assert [row[:1] for row in first] == [[t] if t != vocab.end_id else [] for t in want.argmax(-1).tolist()]


def decoder_inputs(model, prompt, z, slot_ids):
    """The decode's first step: the prompt under each latent value (``decode_ids``'s inputs)."""
    prefix = torch.tensor([prompt.ids]).repeat(len(z), 1)
    slot_pos = torch.tensor([prompt.slot_positions]).expand(len(z), -1)
    inp, kwargs = model.conditioning.decoder_inputs(model.backbone, prefix, slot_pos, z, slot_ids)
    return inp, kwargs


def test_a_string_templates_decode_prompt_is_every_rows_training_prefix(text_ckpt):
    model, vocab = cvae_of(text_ckpt, TEXT)
    assert_prompts_are_training_prefixes(model, vocab, ROWS)


def test_the_prompt_and_y_meet_at_a_token_boundary_in_a_string_template(text_ckpt):
    """The text before y tokenized on its own: a trailing space stays the prompt's, y's tokens are y's own."""
    vocab = load_backbone(text_ckpt, template=TEXT).vocab
    tok = vocab.tokenizer
    for x, y in ROWS:
        r = vocab.render(x, y)
        assert list(r.prompt) == tok(f"Q: {x} A: ", add_special_tokens=False)["input_ids"]
        assert list(r.y) == tok(y, add_special_tokens=False)["input_ids"]
        assert vocab.text(r.prompt) + vocab.text(r.y) == f"Q: {x} A: {y}"


@pytest.fixture(scope="module")
def paragraph_chat_ckpt(tmp_path_factory):
    """A ChatML Qwen2 whose BPE merges "\n\n" (as stock chat tokenizers do): tokenized at once, the generation
    prompt's last "\n" would join a y that starts with "\n\n"."""
    corpus = text_corpus() + ["para one\n\npara two\n\n\nthree  spaced  words"] * 50
    return save_chat_model(tmp_path_factory.mktemp("chat") / "qwen", corpus)


def test_a_chat_templates_decode_prompt_is_every_rows_training_prefix(paragraph_chat_ckpt):
    model, vocab = cvae_of(paragraph_chat_ckpt, Template("chat"))
    assert "ĊĊ" in vocab.tokens
    rows = [(s.x, s.y) for s in text_samples(3)] + [("what is 2 plus 2?", "\n\n4"), ("what?", "  4"),
                                                     ("why?", " \nfour")]
    assert_prompts_are_training_prefixes(model, vocab, rows)


def test_the_rendering_is_in_a_rendered_templates_fingerprint_only(text_ckpt, monkeypatch):
    """A store extracted under another rendering of a chat or text template has another fingerprint (train
    refuses it); the built-in template's fingerprint does not hold it."""
    from tokweight.pipeline.models import hf

    before = {t.kind: hf.hf_fingerprint(text_ckpt, {}, t) for t in (TEXT, Template())}
    monkeypatch.setattr(hf, "RENDERING_VERSION", hf.RENDERING_VERSION + "-other")
    after = {t.kind: hf.hf_fingerprint(text_ckpt, {}, t) for t in (TEXT, Template())}
    assert after["text"] != before["text"] and after["tokweight"] == before["tokweight"]
