"""CVAE training, evaluation and resume on Hugging Face backbones (tiny models built from a config)."""

import copy
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run as extract
from tokweight.pipeline.models.hf import HFBackbone
from tokweight.training.config.components import CVAEConfig
from tokweight.training.config.use import EvalConfig
from tokweight.training.evaluation.evaluate import run_eval
from tokweight.training.loop.run_dir import load_run, read_metrics
from tokweight.training.loop.train import run
from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig
from tests.support.fixtures_hf import tiny_hf_model

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_stores(tiny, hf_checkpoints, tmp_path_factory):
    """arch -> a store extracted through the HF path over every split of the tiny data."""
    root = tmp_path_factory.mktemp("hf_stores")
    for arch, ckpt in hf_checkpoints.items():
        extract(ExtractConfig(checkpoint=str(ckpt), data=str(tiny[0]), store=str(root / arch), progress=False,
                              reader_process=False))
    return {arch: root / arch for arch in hf_checkpoints}


def config(tiny, ckpt, store, out, *, policy="precomputed", steps=5, cvae=CVAEConfig()) -> TrainConfig:
    return TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(tiny[0]), store=str(store), out=str(out),
                                num_workers=0),
                       cvae=cvae, loss=LossConfig(policy=policy, beta=0.3),
                       optim=OptimConfig(steps=steps, batch_size=8, lr=3e-4),
                       log=LogConfig(log_every=1, grad_diag_every=0, ckpt_every=3))


def step_losses(out) -> list[float]:
    return [r["loss"] for r in read_metrics(out) if "loss" in r]


@pytest.mark.parametrize("cond", ["prefix", "query"])
def test_precomputed_and_frozen_give_the_same_loss_on_llama(tiny, hf_checkpoints, hf_stores, tmp_path, cond):
    """At every step through the prefix; through the query (the default) at the first, before any update: its
    first Adam steps (offsets that start at the keys' scale) carry the stored and recomputed b's float rounding
    (5e-7 in the step-0 loss) up to 1e-4 by step 1."""
    losses = {}
    for policy in ("precomputed", "frozen"):
        run(config(tiny, hf_checkpoints["llama"], hf_stores["llama"], tmp_path / policy, policy=policy,
                   cvae=CVAEConfig(cond=cond)))
        losses[policy] = step_losses(tmp_path / policy)
    assert len(losses["frozen"]) == 5 and len(set(losses["frozen"])) > 1
    steps = 5 if cond == "prefix" else 1
    np.testing.assert_allclose(losses["precomputed"][:steps], losses["frozen"][:steps], atol=1e-5, rtol=0)


@pytest.mark.parametrize("cvae", [CVAEConfig(cond="prefix", slots=2, k=2), CVAEConfig(latent="continuous")],
                         ids=["discrete-prefix", "continuous-token"])
def test_a_gpt2_run_trains_evaluates_and_resumes(tiny, hf_checkpoints, hf_stores, tmp_path, cvae):
    out = tmp_path / "run"
    result = run(config(tiny, hf_checkpoints["gpt2"], hf_stores["gpt2"], out, steps=3, cvae=cvae))
    assert np.isfinite(result["recon"]) and result["examples"] == 128
    evaluated = run_eval(EvalConfig(run=str(out), data=str(tiny[0]), split="test", decode_examples=8))
    assert evaluated["baseline"]["policy"] == "precomputed" and evaluated["metrics"]["examples"] == 128
    assert evaluated["decode"]["latent_values"] == (2 if cvae.latent == "discrete" else 4)
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["backbone"] == "huggingface"
    _, model, vocab, _ = load_run(out)
    assert vocab.tokens == load_run(out)[2].tokens and model.backbone.cfg.model_type == "gpt2"
    run(config(tiny, hf_checkpoints["gpt2"], hf_stores["gpt2"], out, steps=4, cvae=cvae))  # resumes at step 3
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [0, 1, 2, 3]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("cvae", [CVAEConfig(cond="memory", k=2), CVAEConfig(latent="continuous", cond="memory")],
                         ids=["discrete", "continuous"])
def test_the_memory_pathway_trains_through_the_cache(tiny, hf_checkpoints, hf_stores, tmp_path, arch, cvae):
    """Where layernorm modulation cannot reach (no LayerNorms to modulate), z reaches every layer as memory."""
    out = tmp_path / "run"
    run(config(tiny, hf_checkpoints[arch], hf_stores[arch], out, steps=2, cvae=cvae))
    losses = step_losses(out)
    assert len(losses) == 2 and np.isfinite(losses).all()
    _, model, _, _ = load_run(out)
    assert model.conditioning.memory_proj.out_features == 2 * 2 * (4 if arch == "gpt2" else 2) * 8  # GQA: 2 kv heads


def test_the_layernorm_pathway_is_refused_naming_the_architecture(tiny, hf_checkpoints, hf_stores, tmp_path):
    cfg = config(tiny, hf_checkpoints["llama"], hf_stores["llama"], tmp_path / "run", cvae=CVAEConfig(cond="layernorm"))
    with pytest.raises(ValueError, match="the 'llama' backbone has none: use --cond token, prefix or memory"):
        run(cfg)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_query_pathway_trains_through_a_hook_on_each_query_projection(tiny, hf_checkpoints, hf_stores, tmp_path,
                                                                          arch):
    """One offset per layer and query head (GQA: 4 query heads over 2 key/value heads), added by a hook that is
    inert outside the pass that gives it: without z the backbone is the base model again."""
    out = tmp_path / "run"
    run(config(tiny, hf_checkpoints[arch], hf_stores[arch], out, steps=2, cvae=CVAEConfig(cond="query", k=2)))
    losses = step_losses(out)
    assert len(losses) == 2 and np.isfinite(losses).all()
    _, model, _, _ = load_run(out)
    assert model.backbone.query_shape == (2, 4, 8) and model.conditioning.query_proj.out_features == 2 * 4 * 8
    backbone, ids = model.backbone.eval(), torch.tensor([[1, 2, 3, 4]])
    before, query = backbone.hidden(ids), torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(0))
    moved = backbone.hidden(ids, query=query)
    assert (moved - before).abs().max() > 1e-3
    torch.testing.assert_close(backbone.hidden(ids), before, rtol=0, atol=0)
    twin = copy.deepcopy(backbone)  # its hooks read its own modules' offsets
    torch.testing.assert_close(twin.hidden(ids, query=query), moved, rtol=0, atol=0)
    torch.testing.assert_close(backbone.hidden(ids), before, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_query_pathway_under_gradient_checkpointing_gives_the_gradients_without_it(arch):
    """The layers' recompute in the backward runs after the pass has cleared the offsets: it sees those its
    forward saw, so every gradient (the offsets' and the weights') is the one without checkpointing, and so does
    a second backward through the same graph (the posterior-gradient diagnostic's autograd.grad, then the step's)."""
    plain = HFBackbone(tiny_hf_model(arch, 12, 16)).train()
    ckpt = copy.deepcopy(plain)
    ckpt.enable_checkpointing()
    g = torch.Generator().manual_seed(0)
    ids, weights = torch.randint(3, 12, (3, 6), generator=g), torch.randn(3, 6, 32, generator=g)
    query = torch.randn(3, *plain.query_shape, generator=g)
    grads = []
    for backbone in (plain, ckpt):
        q = query.clone().requires_grad_()
        torch.manual_seed(1)  # GPT-2's dropout: the same masks in both (checkpointing replays its RNG state)
        loss = (backbone.hidden(ids, query=q) * weights).sum()
        first = torch.autograd.grad(loss, q, retain_graph=True)[0]  # a recompute, and below another
        loss.backward()
        torch.testing.assert_close(first, q.grad, rtol=0, atol=0)
        grads.append([q.grad] + [p.grad for p in backbone.parameters()])
    assert all(site.query_offset is None for site in ckpt._query_hooked)
    assert grads[0][0].abs().max() > 1e-3
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_the_query_pathway_trains_under_gradient_checkpointing_and_is_refused_where_no_query_projection_is_found(
        tiny, hf_checkpoints, hf_stores, tmp_path):
    """Under gradient checkpointing with the posterior-gradient diagnostic on every step (a second backward through
    the decoder where z is the posterior's: a continuous latent)."""
    for name, cvae in (("query", CVAEConfig(cond="query", k=2)), ("continuous", CVAEConfig(latent="continuous"))):
        out = tmp_path / name
        cfg = config(tiny, hf_checkpoints["llama"], hf_stores["llama"], out, steps=2, cvae=cvae)
        run(replace(cfg, io=replace(cfg.io, grad_checkpointing=True), log=replace(cfg.log, grad_diag_every=1)))
        assert np.isfinite(step_losses(out)).all() and len(step_losses(out)) == 2
    backbone = HFBackbone(tiny_hf_model("llama", 12, 16))
    for layer in backbone.model.model.layers:
        layer.self_attn.query = layer.self_attn.q_proj  # another architecture's name for it
        del layer.self_attn.q_proj
    with pytest.raises(ValueError, match="finds no query projection per layer in the 'llama' backbone"):
        backbone.query_sites()
