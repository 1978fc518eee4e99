import importlib.util

import pytest
import torch

from tokweight.pipeline.models.checkpoint import load_checkpoint, model_fingerprint, save_checkpoint
from tokweight.pipeline.models.gpt import GPT, ModelConfig
from tokweight.pipeline.tokens.templates import TEMPLATE_VERSION
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.store.fingerprint import fingerprint
from tokweight.training.export.checkpoint import export_hf

VOCAB = Vocab(("a", "b", "c"), k_max=2)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPT(ModelConfig(vocab_size=len(VOCAB), block_size=16, n_layer=2, n_head=2, d_model=16))


def test_forward_shapes_and_causality():
    model = tiny_model().eval()
    idx = torch.randint(len(VOCAB), (2, 10))
    logits, hidden = model(idx)
    assert logits.shape == (2, 10, len(VOCAB)) and hidden.shape == (2, 10, 16)
    idx2 = idx.clone()
    idx2[:, 7:] = 0
    logits2, _ = model(idx2)
    torch.testing.assert_close(logits[:, :7], logits2[:, :7])  # the future does not leak
    assert not torch.allclose(logits[:, 7:], logits2[:, 7:])


def test_conditioning_hooks():
    model = tiny_model().eval()
    idx = torch.randint(len(VOCAB), (2, 6))
    base, _ = model(idx)
    same, _ = model(idx, tok_emb=model.embed(idx), ln_cond=torch.zeros(2, model.cfg.n_layernorms, 2, 16))
    torch.testing.assert_close(base, same)
    cond = torch.zeros(2, model.cfg.n_layernorms, 2, 16)
    cond[1, 0, 1] = 0.5
    moved, _ = model(idx, ln_cond=cond)
    torch.testing.assert_close(moved[0], base[0])
    assert not torch.allclose(moved[1], base[1])


def test_fingerprint_stable_and_sensitive(tmp_path):
    model = tiny_model()
    fp = model_fingerprint(model, VOCAB)
    assert fp == model_fingerprint(tiny_model(), VOCAB)  # same weights, fresh objects
    assert save_checkpoint(tmp_path / "c", model, VOCAB) == fp
    assert load_checkpoint(tmp_path / "c").fingerprint == fp
    changed = tiny_model()
    with torch.no_grad():
        changed.h[1].mlp.c_fc.bias[3] += 1e-6
    assert model_fingerprint(changed, VOCAB) != fp
    assert model_fingerprint(model, Vocab(("a", "b", "d"), k_max=2)) != fp
    args = dict(model_config=model.cfg.to_json(), tokens=list(VOCAB.tokens), tensors=model.state_dict())
    assert fingerprint(template_version=TEMPLATE_VERSION, **args) == fp
    assert fingerprint(template_version=TEMPLATE_VERSION + "x", **args) != fp


def test_tampered_checkpoint_is_refused(tmp_path):
    save_checkpoint(tmp_path / "c", tiny_model(), VOCAB)
    vocab_json = tmp_path / "c" / "vocab.json"
    vocab_json.write_text(vocab_json.read_text().replace('"c"', '"q"'))
    with pytest.raises(ValueError, match="fingerprint"):
        load_checkpoint(tmp_path / "c")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_hf_gpt2_parity(tmp_path):
    from transformers import GPT2LMHeadModel

    model = tiny_model(seed=3)
    with torch.no_grad():  # non-trivial LayerNorm parameters and biases
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_checkpoint(tmp_path / "c", model, VOCAB)
    export_hf(tmp_path / "c", tmp_path / "hf")
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(len(VOCAB), (3, 16))
    with torch.no_grad():
        ours, _ = load_checkpoint(tmp_path / "c").model(idx)
        theirs = hf(idx).logits
    assert (ours - theirs).abs().max().item() <= 1e-5
