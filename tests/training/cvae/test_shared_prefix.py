"""The shared x prefix is the same computation as K + 1 full passes: per-token NLLs, the
objective and every parameter gradient agree to 1e-5 (float32, CPU), on padded batches of
mixed lengths, for both latents, every pathway, the built-in GPT and Hugging Face backbones.

"To 1e-5": every element within 1e-5 of the full passes' value, relative to that tensor's
largest entry (at least 1): float32 sums in another order differ by ~1e-7 relative, and
the continuous latent's position-embedding gradients here reach 47, so a per-element
relative test would fail on entries that are sums of large terms cancelling to ~0."""

import pytest
import torch

from tokweight.pipeline.models.hf import HFBackbone
from tokweight.pipeline.models.gpt import GPT, ModelConfig
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.tokens.vocab import Vocab
from tests.support.fixtures_hf import tiny_hf_model
from tokweight.training.cvae.model import CVAEConfig, build_cvae
from tokweight.training.objective.loss import plain_objective, reconstruction
from tokweight.training.loop.batches import collate_examples, encode
from tokweight.training.objective.terms import WeightingParams, reconstruction_weights

VOCAB = Vocab(("a", "b", "c", "d"), k_max=4)
SAMPLES = [Sample("k0", ("a", "b"), ("b", "a", "c")), Sample("k1", ("c",), ("d",)),
           Sample("k2", ("a", "b", "c", "d"), ("d", "c")), Sample("k3", ("d", "a", "b"), ("a", "b", "c", "d", "a"))]
CONFIGS = [CVAEConfig(k=4, cond="token"), CVAEConfig(k=3, cond="prefix", slots=4),
           CVAEConfig(k=2, cond="layernorm"), CVAEConfig(latent="continuous", z_dim=3, cond="token"),
           CVAEConfig(latent="continuous", z_dim=2, cond="prefix", slots=3),
           CVAEConfig(k=3, cond="prefix", posterior_pool="mean"), CVAEConfig(k=2, cond="prefix", posterior_pool="last"),
           CVAEConfig(k=3, cond="memory"), CVAEConfig(latent="continuous", z_dim=2, cond="memory"),
           CVAEConfig(k=3, cond="query")]
REACH_PREFIX = ("layernorm", "memory", "query")  # z pathways that reach the prefix: it is not shared


def assert_same(got: torch.Tensor, want: torch.Tensor, name: str = "") -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * max(1.0, want.abs().max().item()), msg=name)


def assert_steps_same(got: tuple, want: tuple) -> None:
    """Two ``step`` results alike: the NLLs, the z-free NLLs and the loss (same shapes), and every gradient."""
    for g, w, name in zip(got[:3], want[:3], ("nll", "zfree_nll", "loss")):
        assert g.shape == w.shape
        assert_same(g, w, name)
    assert got[3].keys() == want[3].keys()
    for name, grad in want[3].items():
        assert_same(got[3][name], grad, name)


def backbone(kind: str):
    torch.manual_seed(0)
    if kind == "gpt":
        return GPT(ModelConfig(vocab_size=len(VOCAB), block_size=40, n_layer=2, n_head=2, d_model=16))
    return HFBackbone(tiny_hf_model(kind, len(VOCAB), 40))


def step(model, batch, b, share: bool) -> tuple:
    """(per-token NLLs, zfree NLLs, loss, {parameter: gradient}) of one forward/backward."""
    model.share_prefix = share
    model.zero_grad()
    out = model(batch, generator=torch.Generator().manual_seed(7))
    pi, _ = reconstruction_weights("surprisal-share", b, batch.zfree.mask, WeightingParams())
    loss = plain_objective(model.latent, out, reconstruction(out, pi), beta=0.7).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.nll, out.zfree_nll, loss.detach(), grads


@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.latent}-{c.cond}{c.slots}-{c.posterior_pool}-"
                                                      f"init{c.latent_init_norm}")
def test_shared_prefix_equals_full_passes(kind, cfg):
    if kind != "gpt" and cfg.cond == "layernorm":
        pytest.skip("refused on a Hugging Face backbone (tests/training/loop/test_hf_training.py)")
    model = build_cvae(backbone(kind), VOCAB, cfg).eval()  # no dropout (GPT-2's default is 0.1); grads flow
    for p in model.parameters():  # larger random weights, so that z visibly matters
        p.data.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    batch = collate_examples(list(encode([("shard.tar", s) for s in SAMPLES], VOCAB, cfg.slots, 40)))
    b = torch.rand(batch.zfree.mask.shape, generator=torch.Generator().manual_seed(1)) * batch.zfree.mask
    assert len(set(batch.z_pos.tolist())) > 1  # mixed prefix lengths
    assert model.shares_prefix == (cfg.cond not in REACH_PREFIX)
    shared, full = step(model, batch, b, True), step(model, batch, b, False)
    for got, want, name in zip(shared[:3], full[:3], ("nll", "zfree_nll", "loss")):
        assert_same(got, want, name)
    assert shared[3].keys() == full[3].keys() and len(full[3]) == len(list(model.parameters()))
    for name, grad in full[3].items():
        assert_same(shared[3][name], grad, name)
    if cfg.latent == "discrete":  # z matters, so the equality is not that of two z-blind decoders
        assert (full[0][:, 0] - full[0][:, 1]).abs().max() > 1e-3
