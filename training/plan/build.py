"""What ``tokweight plan`` runs: the CVAE of a configuration built as ``setup.setup`` builds it, and a batch of
its shape, under torch's FakeTensorMode (``training/plan/estimate.py``), so that nothing is allocated.

The model: a backbone from a config (a Hugging Face ``config.json`` through transformers' AutoConfig, or the
built-in GPT's ``ModelConfig``), the latent tokens' rows appended (``cvae.model.add_latent_tokens``), the CVAE around it
(``cvae.model.build_cvae``), LoRA adapters (``lora.attach``), gradient checkpointing, then under FSDP the blocks and the
root sharded (``engine.shard_blocks``) and AdamW over the trainable parameters. With ``--dtype
bfloat16`` the frozen weights are held in bfloat16 (``precision.hold_frozen``) and FSDP all-gathers in bfloat16
(``engine.shard_blocks``); trainable parameters, their gradients and AdamW's state stay float32.

The batch: ``batch_size`` examples whose z-free sequence holds ``seq_len`` tokens, half of them y (S), in the
built-in template (``templates.Layout``), with a stored b (the default policy reads the store: no extra pass).
"""

from __future__ import annotations

import contextlib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

import torch

from tokweight.pipeline.tokens.templates import Layout, collate
from tokweight.training.loop.batches import TrainBatch, Widths
from tokweight.training.plan.models import MODELS


def model_names() -> list[str]:
    """The built-in model configs (``plan_models.MODELS``)."""
    return sorted(MODELS)


def model_spec(source: str) -> dict:
    """The config ``source`` names: a built-in name, a config.json (or .toml) file, or a checkpoint directory
    holding config.json (a Hugging Face one, or a tokweight one whose "model" holds the built-in GPT's)."""
    if source in MODELS:
        return json.loads(json.dumps(MODELS[source]))  # a copy
    path = Path(source)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"{source}: no such model config (a config.json, a checkpoint directory holding one, or "
                         f"one of {', '.join(model_names())})")
    try:
        spec = tomllib.loads(file.read_text()) if file.suffix == ".toml" else json.loads(file.read_text())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{file}: not valid {file.suffix.lstrip('.') or 'JSON'} ({e}); give a Hugging Face "
                         "config.json") from None
    spec = spec.get("model", spec) if isinstance(spec, dict) else spec
    if not isinstance(spec, dict) or not ("model_type" in spec or "d_model" in spec):
        raise ValueError(f"{file}: neither a Hugging Face config (no model_type) nor a tokweight checkpoint's "
                         "config (no model.d_model)")
    return spec


def build_backbone(spec: dict):
    """The backbone of ``spec`` with its initial (random) weights: drawn as fakes under FakeTensorMode."""
    if "model_type" not in spec:
        from tokweight.pipeline.models.gpt import GPT, ModelConfig

        return GPT(ModelConfig(**spec))
    from tokweight.pipeline.models.hf import HFBackbone, _transformers

    tf = _transformers()
    fields = {k: v for k, v in spec.items() if k not in ("architectures", "torch_dtype", "dtype", "transformers_version")}
    config = tf.AutoConfig.for_model(**fields)
    return HFBackbone(tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32))


class PlanVocab:
    """The vocabulary a plan's model needs: its size and no latent tokens of its own (``add_latent_tokens``
    appends K rows, as a run on a checkpoint without latent tokens does)."""

    k_max = 0

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def latent_id(self, k: int) -> int:
        raise ValueError(f"latent index {k}: the plan's base vocabulary has none")


def shard(model, mesh, dtype: str) -> None:
    """FSDP2 as ``engine.fully_shard_cvae`` shards a run's CVAE (``engine.shard_blocks``), without the broadcast of
    rank 0's weights that follows there: fakes have none."""
    from tokweight.training.loop.engine import shard_blocks

    shard_blocks(model, mesh, torch.bfloat16 if dtype == "bfloat16" else torch.float32)


@dataclass
class Built:
    """A plan's live objects."""

    model: torch.nn.Module  # the CVAE (sharded in place under FSDP)
    opt: torch.optim.Optimizer
    vocab_size: int  # the backbone's rows, latent tokens included
    parameters: int  # the whole model's, before any sharding
    trainable: int


def build(spec: dict, train_cfg, mesh=None, fake: bool = True) -> Built:
    """The CVAE ``setup.setup`` builds for ``train_cfg`` (a TrainConfig) and its AdamW (fused, as on CUDA), on the
    CPU. ``fake``: built on the meta device, sharded there, then given fake storage (``to_empty`` under the active
    FakeTensorMode, as torchtitan builds what it estimates); else real tensors (the CPU check of
    ``tests/training/plan/test_plan.py``)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from tokweight.training.loop.step import build_optimizer

    torch.manual_seed(train_cfg.optim.seed)
    with unset_fake_temporarily() if fake else contextlib.nullcontext(), \
            torch.device("meta") if fake else contextlib.nullcontext():
        model, vocab_size = cvae_of(spec, train_cfg)  # meta tensors made under a FakeTensorMode could not be swapped
        counts = [sum(p.numel() for p in model.parameters() if p.requires_grad or not trained) for trained in (0, 1)]
        if mesh is not None:
            shard(model, mesh, train_cfg.io.dtype)
    if fake:
        shared = tied(model)
        model.to_empty(device="cpu")  # a new parameter per module: tied weights (one tensor, two names) are untied
        for (owner, name), *others in shared:
            for module, other in others:
                module._parameters[other] = owner._parameters[name]
    opt = build_optimizer([p for p in model.parameters() if p.requires_grad], train_cfg.optim.lr, fused=True)  # CUDA's
    return Built(model, opt, vocab_size, *counts)


def tied(model: torch.nn.Module) -> list[list[tuple[torch.nn.Module, str]]]:
    """Every parameter held under more than one (module, name), as those lists."""
    holders: dict[int, list] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                holders.setdefault(id(p), []).append((module, name))
    return [where for where in holders.values() if len(where) > 1]


def cvae_of(spec: dict, train_cfg) -> tuple[torch.nn.Module, int]:
    """(the CVAE, its backbone's rows): backbone, latent rows, CVAE, adapters, checkpointing, frozen dtype."""
    from tokweight.training.cvae.model import add_latent_tokens, build_cvae, latent_tokens_needed
    from tokweight.training.cvae.lora import attach, latent_row_ids
    from tokweight.training.loop.precision import forward_dtype, hold_frozen

    backbone = build_backbone(spec)
    vocab = add_latent_tokens(backbone, PlanVocab(backbone.cfg.vocab_size), latent_tokens_needed(train_cfg.cvae))
    model = build_cvae(backbone.train(), vocab, train_cfg.cvae)
    if train_cfg.lora.rank:
        attach(model.backbone, train_cfg.lora.rank, latent_row_ids(vocab, train_cfg.cvae), train_cfg.optim.seed)
    if train_cfg.io.grad_checkpointing:
        model.backbone.enable_checkpointing()
    model.merge_passes = train_cfg.io.merges_on("cuda")  # the passes as a GPU runs them
    hold_frozen(model, forward_dtype(train_cfg.io.dtype, torch.device("cpu")))  # a LoRA run's frozen weights
    return model, model.backbone.cfg.vocab_size


def layout(seq_len: int, slots: int = 0) -> Layout:
    """A sequence whose z-free template holds ``seq_len`` tokens, half of them y."""
    overhead = Layout(0, 0).length  # the template's own tokens
    n = max(1, (seq_len - overhead) // 2)
    m = seq_len - overhead - n
    if m < 1:
        raise ValueError(f"--seq-len {seq_len} leaves no room for x: the template alone holds {overhead + 1} tokens")
    return Layout(m, n, slots)


def plan_batch(batch_size: int, seq_len: int, slots: int, vocab_size: int, seed: int = 0) -> TrainBatch:
    """A TrainBatch of ``batch_size`` examples of ``seq_len`` z-free tokens (random ids; real tensors, made outside any
    FakeTensorMode)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _plan_batch(batch_size, seq_len, slots, vocab_size, seed)


def _plan_batch(batch_size: int, seq_len: int, slots: int, vocab_size: int, seed: int) -> TrainBatch:
    free, cond = layout(seq_len), layout(seq_len, slots)
    g = torch.Generator().manual_seed(seed)
    ids = lambda lay: torch.randint(vocab_size, (batch_size, lay.length), generator=g).tolist()
    zfree = collate(ids(free), [free] * batch_size)
    zcond = collate(ids(cond), [cond] * batch_size)
    return TrainBatch(zfree=zfree, zcond=zcond, z_pos=torch.full((batch_size,), cond.z_pos),
                      slot_pos=torch.tensor([list(cond.slot_positions)] * batch_size),
                      last_pos=torch.full((batch_size,), free.length - 1),
                      b=torch.rand(zfree.mask.shape, generator=g) * zfree.mask,
                      t0=torch.full((batch_size,), -1), keys=tuple(f"plan{i}" for i in range(batch_size)),
                      urls=("plan",) * batch_size, strategies=(None,) * batch_size,
                      widths=Widths(cond.z_pos, free.length - cond.z_pos, cond.length - cond.z_pos))
