"""LoRA's trainable latent rows (``lora.LatentRows``) without rebuilding the embedding: the lookups and the heads'
logits the step reads equal those of the rebuilt (V, d) weight (lookups bitwise; logits and the rows' gradients
to float32 rounding: the latent columns are their own small product), on the built-in GPT (tied head), GPT-2
(tied) and Llama (untied) built from a config."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.support.fixtures_hf import tiny_hf_model
from tokweight.pipeline.models.head import nll_over_s
from tokweight.pipeline.models.hf import HFBackbone
from tokweight.pipeline.models.gpt import GPT, ModelConfig
from tokweight.training.cvae.lora import token_row_modules, trainable_rows

V, L = 60, 10
LATENT = torch.tensor([55, 57, 58])


def backbone(kind: str):
    torch.manual_seed(0)
    if kind == "gpt":
        return GPT(ModelConfig(vocab_size=V, block_size=L, n_layer=1, n_head=2, d_model=16)).eval()
    return HFBackbone(tiny_hf_model(kind, V, L)).eval()


def with_rows(kind: str, rebuilt: bool):
    """The backbone with trainable rows at LATENT, moved off their checkpoint values; ``rebuilt``: every read goes
    through the parametrized (V, d) weight, as without the fast paths."""
    model = backbone(kind)
    model.requires_grad_(False)
    rows = trainable_rows(model, LATENT)
    for r in rows:
        with torch.no_grad():
            r.rows.add_(torch.randn(r.rows.shape, generator=torch.Generator().manual_seed(1)))
    if rebuilt:
        for module in token_row_modules(model):
            module.__dict__.pop("forward", None)  # the module's own forward: F.embedding of the rebuilt weight
        model.head = rebuilt_head(model)  # this instance only: logits of the rebuilt weight
    return model, rows


def rebuilt_head(model):
    def head(hidden, ids=None):
        out = model.wte if isinstance(model, GPT) else model.model.get_output_embeddings()
        weight = out.weight if ids is None else out.weight[ids]
        bias = getattr(out, "bias", None)
        return F.linear(hidden, weight, None if bias is None or ids is None else bias[ids]) if bias is not None \
            else hidden @ weight.T
    return head


@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama"])
def test_latent_rows_without_rebuilding_give_the_rebuilt_weights_values_and_gradients(kind):
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(3, V, (3, L), generator=g)
    idx[:, 4] = LATENT[torch.tensor([0, 1, 2])]  # latent tokens among the inputs
    results = []
    for rebuilt in (True, False):
        model, rows = with_rows(kind, rebuilt)
        emb = model.embed(idx)
        hidden = model.hidden(idx)
        mask = torch.ones(3, L - 1, dtype=torch.bool)
        targets = idx[:, 1:].clone()
        targets[:, 2] = LATENT[0]  # latent tokens among the targets
        nll = nll_over_s(model, hidden, torch.arange(L - 1).expand(3, -1), targets, mask)
        prior = model.head(hidden[:, 3], LATENT)
        (nll.sum() + prior.logsumexp(-1).sum() + emb.pow(2).sum()).backward()
        results.append((emb.detach(), nll.detach(), prior.detach(), [r.rows.grad.clone() for r in rows]))
    (emb_a, nll_a, prior_a, grads_a), (emb_b, nll_b, prior_b, grads_b) = results
    assert torch.equal(emb_a, emb_b)
    torch.testing.assert_close(nll_b, nll_a, rtol=0, atol=1e-5)
    torch.testing.assert_close(prior_b, prior_a, rtol=0, atol=1e-5)
    assert len(grads_a) == (2 if kind == "llama" else 1)  # untied: the input rows and the head's rows
    for a, b in zip(grads_a, grads_b):
        assert a.abs().sum() > 0
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_rows_off_read_the_frozen_weight():
    model, rows = with_rows("gpt", rebuilt=False)
    idx = LATENT[None]
    frozen = model.wte.parametrizations.weight.original[LATENT]
    rows[0].enabled = False
    assert torch.equal(model.embed(idx)[0], frozen)
    rows[0].enabled = True
    assert torch.equal(model.embed(idx)[0], rows[0].rows.detach())
