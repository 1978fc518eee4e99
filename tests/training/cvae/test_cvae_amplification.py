"""At initialisation the surprisal-share posterior gradient is T/(t0+1) times the uniform one."""

import math

import torch

from tokweight.pipeline.models.checkpoint import load_checkpoint
from tests.support.fixtures_train import AMP_T, AMP_T0, two_regime_samples
from tokweight.training.cvae.model import CVAEConfig, build_cvae
from tokweight.training.objective.loss import plain_objective, reconstruction
from tokweight.training.loop.batches import collate_examples, encode
from tokweight.training.objective.terms import WeightingParams, reconstruction_weights
from tokweight.training.evaluation.metrics import posterior_gradient_norms


def test_posterior_gradient_amplification(two_regime):
    """b is the two-regime profile itself (log 2 on positions 0..t0, 0 after): surprisal-share then
    weighs the t0+1 informative tokens equally, so the expected ratio is exactly T/(t0+1)
    wherever the decoder's z-sensitivity after t0 vanishes, as it does for a base model that
    is sure of the suffix. A learned b would make the expected ratio depend on its shape."""
    _, ckpt_dir = two_regime
    ckpt = load_checkpoint(ckpt_dir)
    torch.manual_seed(0)
    model = build_cvae(ckpt.model.train(), ckpt.vocab, CVAEConfig(k=4))
    samples = two_regime_samples(32, seed=3, max_x=4)  # z-conditioned positions seen in training
    batch = collate_examples(list(encode([("s.tar", s) for s in samples], ckpt.vocab, 1, ckpt.model.cfg.block_size)))
    assert (batch.zfree.mask.sum(1) == AMP_T).all()
    b = (torch.arange(batch.zfree.mask.shape[1]) <= AMP_T0).float().expand_as(batch.zfree.mask) * math.log(2)
    out = model(batch)
    norms = {}
    for name in ("surprisal-share", "uniform"):
        pi, degenerate = reconstruction_weights(name, b, batch.zfree.mask, WeightingParams())
        obj = plain_objective(model.latent, out, reconstruction(out, pi), beta=1.0)
        norms[name] = posterior_gradient_norms(obj.recon, obj.kl_term, model.posterior_parameters)["grad_recon"]
    ratio = norms["surprisal-share"] / norms["uniform"]
    expected = AMP_T / (AMP_T0 + 1)
    assert norms["uniform"] > 0
    print(f"ratio {ratio:.3f} expected {expected:.3f}")
    assert abs(ratio / expected - 1) < 0.3, (ratio, expected)
