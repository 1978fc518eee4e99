"""The engines' single-process guarantees (``training/loop/engine.py``); the multi-rank ones are in test_ddp.py.

DistributedDataParallel runs with ``find_unused_parameters`` off, which fails a step after one in which a
trainable parameter got no gradient: here every path a rank can take gives every trainable parameter one, in
the warm-up's first step (beta 0, anchor off) and after it, with the posterior-gradient diagnostic's
``autograd.grad`` before the backward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.ranks import Ranks
from tokweight.training.config.components import CVAEConfig, EStepConfig, LoRAConfig
from tokweight.training.loop.engine import numbered, transformer_blocks
from tokweight.training.loop.step import train_step
from tokweight.training.loop.stream import TrainStream
from tokweight.training.loop.setup import pooled_key_values, setup
from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

WARM = LossConfig(beta_warmup_steps=1)  # step 0 at beta 0 with the anchor off, step 1 at beta with the anchor on
PATHS = {  # name: (backbone, TrainConfig groups)
    "default": ("gpt", {}),  # the query pathway
    "likelihood-posterior": ("gpt", dict(cvae=CVAEConfig(posterior_likelihood=True), estep=EStepConfig(harden_from=1))),
    "prefix": ("gpt", dict(cvae=CVAEConfig(cond="prefix"))),
    "memory": ("gpt", dict(cvae=CVAEConfig(cond="memory"))),
    "layernorm": ("gpt", dict(cvae=CVAEConfig(cond="layernorm"))),
    "continuous-token": ("gpt", dict(cvae=CVAEConfig(latent="continuous", cond="token"))),
    "continuous-standard-prior": ("gpt", dict(cvae=CVAEConfig(latent="continuous", prior="standard"),
                                              estep=EStepConfig(mode="off"))),
    "estep-labels": ("gpt", dict(estep=EStepConfig(mode="label"))),
    "frozen-plain": ("gpt", dict(loss=LossConfig(beta_warmup_steps=1, policy="frozen"), estep=EStepConfig(mode="off"))),
    "dynamic": ("gpt", dict(loss=LossConfig(beta_warmup_steps=1, policy="dynamic"))),
    "lora": ("gpt", dict(lora=LoRAConfig(rank=4))),
    "checkpointing-bf16": ("gpt", dict(io=dict(grad_checkpointing=True, dtype="bfloat16"))),
    "llama": ("llama", {}),
    "gpt2-lora-memory": ("gpt2", dict(lora=LoRAConfig(rank=4), cvae=CVAEConfig(cond="memory"))),
    "llama-lora-query": ("llama", dict(lora=LoRAConfig(rank=4), cvae=CVAEConfig(cond="query"))),
}

pytestmark = pytest.mark.usefixtures("one_thread")


def path_config(tiny, store, ckpt, out: Path, groups: dict) -> TrainConfig:
    """A 2-step run; an HF backbone has no store (its b is the dynamic policy's)."""
    io = IOConfig(checkpoint=str(ckpt), data=str(tiny[0]), out=str(out), store=str(store) if store else None,
                  num_workers=0, device="cpu", **groups.pop("io", {}))
    loss = groups.pop("loss", WARM if store else LossConfig(beta_warmup_steps=1, policy="dynamic"))
    return TrainConfig(io, loss=loss, optim=OptimConfig(steps=2, batch_size=8, starts=1),
                       log=LogConfig(log_every=1, grad_diag_every=1, eval_every=0), **groups)


@pytest.mark.parametrize("name", list(PATHS))
def test_every_trainable_parameter_gets_a_gradient_in_every_step(tiny, tiny_store, hf_checkpoints, tmp_path, name):
    backbone, groups = PATHS[name]
    ckpt, store = (tiny[1], tiny_store) if backbone == "gpt" else (hf_checkpoints[backbone], None)
    cfg = path_config(tiny, store, ckpt, tmp_path / "run", dict(groups))
    state = setup(cfg, Ranks())
    batches = TrainStream(state.spec, 0, 1).batches(0)
    for step in range(2):
        record = train_step(state, next(batches), cfg, logged=True)
        without = [n for n, p in state.model.named_parameters() if p.requires_grad and p.grad is None]
        assert not without, f"step {step}: no gradient for {without[:4]} ({len(without)})"
        assert "grad_recon" in record and torch.isfinite(torch.tensor(record["loss"]))


def test_pooled_key_values_are_those_of_the_union():
    """Two ranks' measurements of the memory's scale pool into the one-process measurement."""
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, 3, 2, 2, 4, generator=g, dtype=torch.float64) * (1 + i) + i for i, n in enumerate((5, 9))]

    def measure(seen):  # token_key_values' statistics over (positions, layers, 2, heads, head dim)
        mean = seen.mean(0)
        return mean, (seen - mean).norm(dim=-1).pow(2).mean(0).sqrt()

    whole = measure(torch.cat(parts))
    means, spreads = zip(*map(measure, parts))
    pooled = pooled_key_values(torch.tensor([5.0, 9.0], dtype=torch.float64), torch.stack(means), torch.stack(spreads))
    for got, want in zip(pooled, whole):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_the_blocks_fsdp_shards_are_the_transformer_layers(tiny, hf_checkpoints):
    gpt = load_backbone(tiny[1]).model
    assert transformer_blocks(gpt) == list(gpt.h)
    for arch, layer in (("llama", "LlamaDecoderLayer"), ("gpt2", "GPT2Block")):
        model = load_backbone(hf_checkpoints[arch]).model
        blocks = transformer_blocks(model)
        assert len(blocks) == 2 and {type(b).__name__ for b in blocks} == {layer}
    model.model._no_split_modules = None
    with pytest.raises(ValueError, match="'gpt2' backbone names no decoder layer class.*shard 'ddp'"):
        transformer_blocks(model)


def test_a_named_optimizer_state_is_numbered_as_the_optimizer_numbers_it():
    """torch.distributed.checkpoint's state (keyed by name) -> ``Optimizer.state_dict``'s (by position)."""
    named = {"state": {"b": {"step": 2}, "a": {"step": 1}},
             "param_groups": [{"lr": 1.0, "params": ["a", "b"]}, {"lr": 2.0, "params": ["c"]}]}
    assert numbered(named) == {"state": {1: {"step": 2}, 0: {"step": 1}},
                               "param_groups": [{"lr": 1.0, "params": [0, 1]}, {"lr": 2.0, "params": [2]}]}


def test_the_shard_field_is_checked(tiny, tmp_path):
    with pytest.raises(ValueError, match="shard must be 'ddp' or 'fsdp', got 'zero3'"):
        IOConfig(checkpoint=str(tiny[1]), data=str(tiny[0]), out=str(tmp_path), shard="zero3")


BF16_PATHS = {  # every z pathway under both latents, full and LoRA, on the built-in GPT and a Llama
    f"{latent}-{cond}-{tuning}": ("gpt", dict(io=dict(dtype="bfloat16"), cvae=CVAEConfig(latent=latent, cond=cond),
                                              **(dict(lora=LoRAConfig(rank=4)) if tuning == "lora" else {})))
    for latent in ("discrete", "continuous") for cond in ("query", "token", "prefix", "layernorm", "memory")
    for tuning in ("full", "lora")
} | {
    f"llama-{latent}-{cond}": ("llama", dict(io=dict(dtype="bfloat16"), cvae=CVAEConfig(latent=latent, cond=cond)))
    for latent in ("discrete", "continuous") for cond in ("query", "token", "prefix", "memory")
}


@pytest.mark.parametrize("name", list(BF16_PATHS))
def test_a_bfloat16_step_runs_on_every_pathway(tiny, tiny_store, hf_checkpoints, tmp_path, name):
    """Under bfloat16 autocast every z pathway trains for two steps with finite losses, the trainable parameters staying
    float32 and every one of them getting a gradient; the weights that do not train (LoRA's backbone) held in
    bfloat16."""
    backbone, groups = BF16_PATHS[name]
    ckpt, store = (tiny[1], tiny_store) if backbone == "gpt" else (hf_checkpoints[backbone], None)
    cfg = path_config(tiny, store, ckpt, tmp_path / "run", dict(groups))
    state = setup(cfg, Ranks())
    frozen = [p for p in state.model.parameters() if not p.requires_grad]
    assert bool(frozen) == name.endswith("lora") and all(p.dtype == torch.bfloat16 for p in frozen)
    batches = TrainStream(state.spec, 0, 1).batches(0)
    for _ in range(2):
        record = train_step(state, next(batches), cfg, logged=True)
        assert torch.isfinite(torch.tensor(record["loss"]))
    trainable = [p for p in state.model.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 and p.grad is not None for p in trainable)


def test_a_bfloat16_runs_frozen_baseline_is_a_bfloat16_copy(tiny, tiny_store, tmp_path):
    """The frozen policy's copy of the baseline model is held in the forward's dtype, apart from the trained model."""
    cfg = path_config(tiny, tiny_store, tiny[1], tmp_path / "run",
                      dict(io=dict(dtype="bfloat16"), loss=LossConfig(policy="frozen", beta_warmup_steps=1)))
    state = setup(cfg, Ranks())
    copy = list(state.baseline.model.parameters())
    assert copy and all(p.dtype == torch.bfloat16 and not p.requires_grad for p in copy)
    trained = {p.data_ptr() for p in state.model.parameters()}
    assert not trained & {p.data_ptr() for p in copy}
    record = train_step(state, next(TrainStream(state.spec, 0, 1).batches(0)), cfg, logged=True)
    assert torch.isfinite(torch.tensor(record["loss"]))


@pytest.mark.parametrize("arch", ["gpt", "llama", "gpt2"])
def test_a_shape_only_checkpoint_reads_no_weights_and_a_frozen_copy_of_it_is_allocated(tiny, hf_checkpoints,
                                                                                        monkeypatch, arch):
    """What an FSDP rank other than 0 builds: the checkpoint's shape on the meta device, no weight file opened (it
    receives its shards from rank 0), and the frozen policy's copy of it allocated on the rank's device, in the
    forward's dtype, for rank 0's broadcast."""
    import safetensors.torch

    from tokweight.training.objective.baselines import Frozen

    path = tiny[1] if arch == "gpt" else hf_checkpoints[arch]
    whole = load_backbone(path)

    def refused(*args, **kwargs):
        raise AssertionError("a weight file was read")

    monkeypatch.setattr(safetensors.torch, "load_file", refused)
    monkeypatch.setattr("tokweight.pipeline.models.checkpoint.load_file", refused)
    monkeypatch.setattr(safetensors.torch, "safe_open", refused)
    shape = load_backbone(path, weights=False)
    params = dict(shape.model.named_parameters())
    assert params and all(p.is_meta for p in params.values())
    assert {n: p.shape for n, p in params.items()} == {n: p.shape for n, p in whole.model.named_parameters()}
    assert list(shape.vocab.tokens) == list(whole.vocab.tokens)
    frozen = Frozen(shape.model, "cpu", torch.bfloat16)
    assert all(p.device.type == "cpu" and p.dtype == torch.bfloat16 for p in frozen.model.parameters())
    assert all(not b.is_meta for b in frozen.model.buffers())
