"""A batch run group by group (``batches.Groups``: rows of similar length, each group padded to its own longest) is
the batch run whole: per-token NLLs, the posterior, the prior, the objective and every gradient agree to 1e-5
(float32, CPU) for both latents and every pathway, in the batch's own row order; the groups pad less."""

import itertools
import random

import pytest
import torch

from tokweight.pipeline.data.samples import Sample
from tokweight.training.config.train import GPU_LENGTH_GROUPS, IOConfig
from tokweight.training.cvae.model import build_cvae
from tokweight.training.loop.batches import collate_examples, encode, length_groups
from tests.training.cvae.test_shared_prefix import CONFIGS, VOCAB, assert_same, assert_steps_same, backbone, step

# lengths that interleave, so that the groups' order is not the batch's
SAMPLES = [Sample("k0", ("a", "b", "c", "d", "a", "b"), ("b", "a", "c", "d", "a", "b", "c")),
           Sample("k1", ("c",), ("d",)),
           Sample("k2", ("a", "b", "c", "d"), ("d", "c", "a")),
           Sample("k3", ("d",), ("a", "b")),
           Sample("k4", ("d", "a", "b", "c", "d"), ("a", "b", "c", "d", "a", "b")),
           Sample("k5", ("b", "c"), ("c", "a"))]


def examples(slots: int):
    return list(encode([("shard.tar", s) for s in SAMPLES], VOCAB, slots, 40))


def fewest_padded(lengths: list[int], groups: int) -> int:
    """Every way to cut the sorted rows into at most ``groups`` runs, tried: the fewest tokens they pad to."""
    ordered, n = sorted(lengths), len(lengths)
    return min(sum((b - a) * ordered[b - 1] for a, b in zip((0, *cuts), (*cuts, n)))
               for k in range(min(groups, n)) for cuts in itertools.combinations(range(1, n), k))


def test_length_groups_pad_as_little_as_any_cut():
    rng = random.Random(0)
    for _ in range(300):
        lengths, groups = [rng.randint(1, 6) for _ in range(rng.randint(1, 9))], rng.randint(1, 5)
        rows = length_groups(lengths, groups)
        assert sorted(i for r in rows for i in r) == list(range(len(lengths))) and len(rows) <= groups
        assert sum(len(r) * max(lengths[i] for i in r) for r in rows) == fewest_padded(lengths, groups)


def test_length_groups_cut_where_padding_is_least():
    assert length_groups([5, 1, 5, 1, 9, 9], 3) == [[1, 3], [0, 2], [4, 5]]
    assert length_groups([6, 1, 6, 1, 9, 9], 2) == [[1, 3], [0, 2, 4, 5]]  # 2 * 1 + 4 * 9 < 4 * 6 + 2 * 9
    assert length_groups([3, 3, 3], 4) == [[0, 1, 2]]  # one length: one group, whatever is allowed
    assert length_groups([4, 2], 1) == [[1, 0]]
    rows = length_groups(list(range(20, 0, -1)), 4)
    assert sorted(i for r in rows for i in r) == list(range(20)) and len(rows) == 4


def test_grouped_batch_is_the_batch_with_less_padding():
    exs = examples(1)
    whole, grouped = collate_examples(exs), collate_examples(exs, groups=3)
    assert whole.groups is None and grouped.groups is not None
    for name in ("z_pos", "slot_pos", "last_pos", "t0"):  # the batch's own fields are unchanged
        assert torch.equal(getattr(grouped, name), getattr(whole, name))
    assert torch.equal(grouped.zcond.input_ids, whole.zcond.input_ids) and grouped.keys == whole.keys
    groups = grouped.groups
    assert torch.equal(groups.order[groups.place], torch.arange(len(exs)))
    assert [k for p in groups.parts for k in p.keys] == [whole.keys[i] for i in groups.order.tolist()]
    assert groups.order.tolist() != list(range(len(exs)))  # the groups reorder, and merge puts the rows back
    computed = sum(len(p) * p.zcond.input_ids.shape[1] for p in groups.parts)
    assert computed < len(whole) * whole.zcond.input_ids.shape[1]
    rows = torch.arange(len(exs) * 3.0).view(len(exs), 3)
    assert torch.equal(groups.merge(groups.split(rows)), rows)
    assert torch.equal(groups.merge([g.view(-1, 3) for g in groups.split(rows.flatten(), copies=3)]), rows)


@pytest.mark.parametrize("kind", ["gpt", "gpt2"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.latent}-{c.cond}{c.slots}-{c.posterior_pool}")
def test_grouped_forward_equals_whole_batch(cfg, kind):
    if kind != "gpt" and cfg.cond == "layernorm":
        pytest.skip("refused on a Hugging Face backbone (tests/training/loop/test_hf_training.py)")
    model = build_cvae(backbone(kind), VOCAB, cfg).eval()
    for p in model.parameters():  # larger random weights, so that z visibly matters
        p.data.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    exs = examples(cfg.slots)
    whole, grouped = collate_examples(exs), collate_examples(exs, groups=3)
    assert len(grouped.groups.parts) == 3
    b = torch.rand(whole.zfree.mask.shape, generator=torch.Generator().manual_seed(1)) * whole.zfree.mask
    share = model.shares_prefix
    got, want = step(model, grouped, b, share), step(model, whole, b, share)
    assert_steps_same(got, want)
    out_g = model(grouped, generator=torch.Generator().manual_seed(7))
    out_w = model(whole, generator=torch.Generator().manual_seed(7))
    for g, w in zip(*(o if isinstance(o, tuple) else (o,) for o in (out_g.post, out_w.post))):
        assert_same(g, w, "post")
    for g, w in zip(*(o if isinstance(o, tuple) else (o,) for o in (out_g.prior, out_w.prior))):
        assert_same(g, w, "prior")
    if cfg.latent == "continuous":  # eval's NLL at the posterior's mean
        at_mean = [model(b, at_posterior_mean=True) for b in (grouped, whole)]
        assert_same(at_mean[0].nll, at_mean[1].nll, "nll at the posterior mean")
    if cfg.latent == "discrete":  # z matters, so the equality is not that of two z-blind decoders
        assert (want[0][:, 0] - want[0][:, 1]).abs().max() > 1e-3


def test_groups_default_by_device():
    io = IOConfig(checkpoint="c", data="d", out="o")
    assert io.groups_on("cpu") == io.groups_on("mps") == io.groups_on("cuda", sharded=True) == 1
    assert io.groups_on("cuda") == GPU_LENGTH_GROUPS > 1
    assert IOConfig(checkpoint="c", data="d", out="o", length_groups=2).groups_on("cpu") == 2
    with pytest.raises(ValueError, match="length_groups must be >= 1"):
        IOConfig(checkpoint="c", data="d", out="o", length_groups=0)


@pytest.mark.parametrize("cfg", [CONFIGS[-1], CONFIGS[4]], ids=["discrete-query", "continuous-prefix"])
def test_grouped_forward_under_bfloat16_autocast(cfg):
    """Groups merge what autocast made (bfloat16 states, float32 NLLs) without a dtype clash, and agree with the
    whole batch to bfloat16's rounding."""
    model = build_cvae(backbone("gpt"), VOCAB, cfg).eval()
    exs = examples(cfg.slots)
    whole, grouped = collate_examples(exs), collate_examples(exs, groups=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(grouped, generator=torch.Generator().manual_seed(7))
        want = model(whole, generator=torch.Generator().manual_seed(7))
    assert got.pooled.dtype == want.pooled.dtype and got.nll.dtype == want.nll.dtype == torch.float32
    torch.testing.assert_close(got.nll, want.nll, rtol=0, atol=0.05 * want.nll.abs().max().item())
