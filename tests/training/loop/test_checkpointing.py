"""Gradient checkpointing changes memory, not numbers: one CVAE training step with and without it gives the
same per-token NLLs, objective and every parameter gradient (to 1e-5 of each tensor's largest entry), on
the built-in GPT (the shared prefix kept) and on Hugging Face GPT-2 and Llama (which then run the K + 1
passes whole: compared with the plain step's whole passes, so that dropout draws the same masks)."""

import pytest
import torch

from tests.training.cvae.test_shared_prefix import SAMPLES, VOCAB, assert_same, backbone, step
from tokweight.training.config.components import CVAEConfig
from tokweight.training.cvae.model import build_cvae
from tokweight.training.loop.batches import collate_examples, encode


@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama"])
def test_a_checkpointed_step_equals_the_plain_one(kind):
    cfg = CVAEConfig(k=3, cond="prefix")  # 4 slots: the pathway whose K passes share the x prefix
    batch = collate_examples(list(encode([("shard.tar", s) for s in SAMPLES], VOCAB, cfg.slots, 40)))
    b = torch.rand(batch.zfree.mask.shape, generator=torch.Generator().manual_seed(1)) * batch.zfree.mask
    results, calls = [], []
    for checkpointed in (False, True):
        model = build_cvae(backbone(kind), VOCAB, cfg).train()  # the same weights both times (seeded)
        if checkpointed:
            model.backbone.enable_checkpointing()
        assert model.shares_prefix == (kind == "gpt" or not checkpointed)
        blocks = next(m for m in model.backbone.modules() if isinstance(m, torch.nn.ModuleList))
        if kind == "gpt":  # counted on the instance: a recompute runs forward, not the module's hooks
            forward = blocks[0].forward
            blocks[0].forward = lambda *a, _f=forward, _c=checkpointed, **k: calls.append(_c) or _f(*a, **k)
        else:  # transformers checkpoints each layer's class-level forward when the layer says so
            assert all(layer.gradient_checkpointing == checkpointed for layer in blocks)
        torch.manual_seed(3)  # dropout draws the same masks in both runs (a recompute replays its RNG state)
        results.append(step(model, batch, b, share=kind == "gpt"))
    if kind == "gpt":
        assert calls.count(True) == 2 * calls.count(False) > 0  # each block ran again in the backward
    plain, checkpointed = results
    for got, want, name in zip(checkpointed[:3], plain[:3], ("nll", "zfree_nll", "loss")):
        assert_same(got, want, name)
    assert checkpointed[3].keys() == plain[3].keys()
    for name, grad in plain[3].items():
        assert_same(checkpointed[3][name], grad, name)
