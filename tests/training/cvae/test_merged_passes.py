"""The z-free pass and a discrete latent's copies as one forward (``io.merge_passes``, ``CVAE.merges_passes``) are the
two passes: per-token NLLs, the posterior, the prior, the objective and every gradient agree to 1e-5 (float32, CPU)
on every pathway that allows it, with the x prefix shared or not, whole or in length groups; where it is not
allowed (a continuous latent, the memory pathway) the flag changes nothing."""

import pytest
import torch

from tokweight.training.config.train import IOConfig
from tokweight.training.cvae.model import build_cvae
from tokweight.training.loop.batches import collate_examples
from tests.training.cvae.test_length_groups import examples
from tests.training.cvae.test_shared_prefix import CONFIGS, VOCAB, assert_same, assert_steps_same, backbone, step

MERGING = [c for c in CONFIGS if c.latent == "discrete" and c.cond != "memory"]
NOT_MERGING = [c for c in CONFIGS if c not in MERGING]


def model_for(cfg, kind: str = "gpt"):
    model = build_cvae(backbone(kind), VOCAB, cfg).eval()
    for p in model.parameters():  # larger random weights, so that z visibly matters
        p.data.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model


def merged_and_separate(model, batch, b, share: bool) -> tuple:
    model.merge_passes = True
    merged = step(model, batch, b, share)
    model.merge_passes = False
    return merged, step(model, batch, b, share)


def backbone_passes(model, batch) -> int:
    """Forwards through the backbone's blocks (``hidden``, ``prefix``) in one CVAE forward."""
    calls, bb = [], model.backbone
    originals = {name: getattr(bb, name) for name in ("hidden", "prefix")}
    for name, fn in originals.items():
        setattr(bb, name, lambda *a, _fn=fn, _name=name, **k: calls.append(_name) or _fn(*a, **k))
    try:
        model(batch)
    finally:
        for name in originals:
            delattr(bb, name)
    return len(calls)


@pytest.mark.parametrize("share,groups", [(True, 3), (True, 1), (False, 1)], ids=["shared-groups", "shared", "whole"])
@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama"])
@pytest.mark.parametrize("cfg", MERGING, ids=lambda c: f"{c.cond}{c.slots}-{c.posterior_pool}")
def test_one_forward_equals_the_two_passes(cfg, kind, share, groups):
    if kind != "gpt" and cfg.cond == "layernorm":
        pytest.skip("refused on a Hugging Face backbone (tests/training/loop/test_hf_training.py)")
    model = model_for(cfg, kind)
    batch = collate_examples(examples(cfg.slots), groups=groups)
    b = torch.rand(batch.zfree.mask.shape, generator=torch.Generator().manual_seed(1)) * batch.zfree.mask
    merged, separate = merged_and_separate(model, batch, b, share)
    assert_steps_same(merged, separate)
    model.merge_passes = True
    assert model.merges_passes
    with torch.no_grad():  # validation and eval: the passes stay two, the lower peak
        assert not model.merges_passes
    out_m = model(batch)
    model.merge_passes = False
    out_s = model(batch)
    for name in ("post", "prior", "pooled"):
        assert_same(getattr(out_m, name), getattr(out_s, name), name)
    assert (separate[0][:, 0] - separate[0][:, 1]).abs().max() > 1e-3  # z matters: not two z-blind decoders


@pytest.mark.parametrize("cfg", MERGING, ids=lambda c: f"{c.cond}{c.slots}-{c.posterior_pool}")
def test_one_forward_is_one_pass_fewer(cfg):
    model = model_for(cfg)
    batch = collate_examples(examples(cfg.slots))
    model.merge_passes = False
    separate = backbone_passes(model, batch)
    model.merge_passes = True
    assert backbone_passes(model, batch) == separate - 1
    grouped = collate_examples(examples(cfg.slots), groups=3)
    model.merge_passes = False
    separate = backbone_passes(model, grouped)
    model.merge_passes = True
    assert backbone_passes(model, grouped) == separate - 3  # one fewer per group


@pytest.mark.parametrize("cfg", NOT_MERGING, ids=lambda c: f"{c.latent}-{c.cond}{c.slots}")
def test_merge_changes_nothing_where_not_allowed(cfg):
    model = model_for(cfg)
    batch = collate_examples(examples(cfg.slots))
    b = torch.rand(batch.zfree.mask.shape, generator=torch.Generator().manual_seed(1)) * batch.zfree.mask
    merged, separate = merged_and_separate(model, batch, b, model.shares_prefix)
    model.merge_passes = True
    assert not model.merges_passes
    for got, want in zip(merged[:3], separate[:3]):
        assert torch.equal(got, want)
    for name, grad in separate[3].items():
        assert torch.equal(merged[3][name], grad), name


def test_merge_default_by_device():
    io = IOConfig(checkpoint="c", data="d", out="o")
    assert io.merges_on("cuda") and not io.merges_on("cpu") and not io.merges_on("mps")
    assert not IOConfig(checkpoint="c", data="d", out="o", grad_checkpointing=True).merges_on("cuda")
    assert not IOConfig(checkpoint="c", data="d", out="o", merge_passes=False).merges_on("cuda")
    assert IOConfig(checkpoint="c", data="d", out="o", merge_passes=True).merges_on("cpu")


def test_one_forward_under_bfloat16_autocast():
    """Under bfloat16 autocast the merged pass runs (the z-free rows' zero query offsets beside the copies' bfloat16
    ones), its NLLs in float32, and agrees with the two passes to bfloat16's rounding."""
    cfg = CONFIGS[-1]  # the query pathway, the default
    model = model_for(cfg)
    batch = collate_examples(examples(cfg.slots), groups=2)
    outs = []
    for merge in (True, False):
        model.merge_passes = merge
        assert model.merges_passes == merge
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(model(batch))
    got, want = outs
    assert got.nll.dtype == want.nll.dtype == got.zfree_nll.dtype == torch.float32
    torch.testing.assert_close(got.nll, want.nll, rtol=0, atol=0.05 * want.nll.abs().max().item())
    torch.testing.assert_close(got.zfree_nll, want.zfree_nll, rtol=0, atol=0.05 * want.zfree_nll.abs().max().item())
