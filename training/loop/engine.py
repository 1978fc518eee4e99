"""How the ranks of a job share a training step: the module the step's forward runs through (``State.engine``),
and the whole tensors a checkpoint holds when the model is sharded.

- One process: the CVAE itself.
- ``IOConfig.shard`` "ddp" (the default): torch's DistributedDataParallel around the CVAE. Every rank holds the
  whole model and AdamW's state; the gradients are averaged in buckets, overlapped with the backward. Every
  trainable parameter receives a gradient in every step, whatever the latent, z pathway, policy, E-step, adapters
  or diagnostics (tests/training/loop/test_engine.py), so ``find_unused_parameters`` stays off (it would search the autograd
  graph after every forward for parameters that take no part).
- "fsdp": FSDP2 (``torch.distributed.fsdp.fully_shard``) on every transformer block and at the root, for backbones
  whose full fine-tune does not fit one GPU. Parameters, gradients and AdamW's state are sharded over the ranks on
  dim 0 (DTensors). A block's parameters are all-gathered for each of its calls and freed after it: a step calls
  each block 3 times in the forward (the shared x prefix, the z-free pass, the K copies; 4 with the layernorm or
  memory pathway's prior pass, 2 without a shared prefix; one fewer where ``io.merge_passes`` runs the z-free pass
  and the copies as one) and gathers it again for each in the backward. Its
  gradient is reduce-scattered once, after the last of its calls' backwards (autograd accumulates a parameter's
  gradient once every use has contributed). The root group (embeddings, the tied or untied output head, the final
  norm, the posterior, the prior and the z pathway) stays whole from the CVAE's forward to the end of its backward,
  so the output head, which ``pipeline/models/head.py`` calls outside a module's forward and recomputes in the backward,
  and the posterior-gradient diagnostic read whole tensors. The clip reads the sharded gradients (DTensors, whose
  norm is the global one).
  FSDP gathers a block again for a call's backward when the gradient reaches one of that call's outputs. The
  built-in GPT's blocks return the shared prefix's keys and values; a Hugging Face decoder layer puts them in
  transformers' cache, where the gradient reaches them after the layer was freed, without passing its outputs. So
  a Hugging Face backbone runs its passes whole under FSDP (``CVAE.share_prefix`` off: the x prefix computed K + 1
  times instead of once), as it does with gradient checkpointing.
  Rank 0 alone reads the checkpoint's weights and builds the whole model on the CPU (its latent rows spread, its
  memory measured over every rank's first rows, a checkpoint loaded); the other ranks build its shape on the meta
  device. Once sharded, rank 0 broadcasts the tensors one at a time and each rank keeps its shard on its device: no
  host but rank 0's holds the model, and no device more than its shard. Under a bfloat16 forward the blocks are
  all-gathered in bfloat16 (``MixedPrecisionPolicy``), the gradients reduce-scattered in float32.

Checkpoints are the same files either way (``run_dir.py``): under FSDP every rank takes part in gathering the whole
trained tensors and optimizer state onto rank 0's CPU (``torch.distributed.checkpoint.state_dict``), which writes
them; a resumed FSDP run loads the model before sharding and gives each rank its shard of the optimizer state.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from tokweight.pipeline.models.gpt import GPT
from tokweight.pipeline.ranks import Ranks
from tokweight.training.loop.run_dir import frozen_parameter_names, trained_state


def is_sharded(shard: str, world: int) -> bool:
    return shard == "fsdp" and world > 1


def build_device(shard: str, world: int, device: torch.device) -> torch.device:
    """Where the whole model is built, spread and resumed: the rank's device, or under FSDP the CPU (``wrap``
    then moves each rank's shard to its device)."""
    return torch.device("cpu") if is_sharded(shard, world) else device


def wrap(model: nn.Module, shard: str, ranks: Ranks, device: torch.device,
         param_dtype: torch.dtype = torch.float32) -> nn.Module:
    """What the step calls: the model itself in a job of one; DistributedDataParallel around it (which starts every
    rank from rank 0's parameters); or, under FSDP, the model itself, sharded in place (``fully_shard_cvae``), its
    blocks all-gathered in ``param_dtype``."""
    if ranks.world == 1:
        return model
    if shard == "fsdp":
        return fully_shard_cvae(model, device, ranks, param_dtype)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   broadcast_buffers=False)


def transformer_blocks(backbone: nn.Module) -> list[nn.Module]:
    """The backbone's transformer blocks: the built-in GPT's ``h``; a Hugging Face model's decoder layers, the
    module classes its ``_no_split_modules`` names (those transformers keeps whole when it places a model over
    several devices)."""
    if isinstance(backbone, GPT):
        return list(backbone.h)
    names = set(getattr(backbone.model, "_no_split_modules", None) or ())
    blocks = [m for m in backbone.model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"shard 'fsdp': the {backbone.cfg.model_type!r} backbone names no decoder layer class "
                         f"(its _no_split_modules is {sorted(names)}); train it with shard 'ddp'")
    return blocks


def fully_shard_cvae(model: nn.Module, device: torch.device, ranks: Ranks,
                     param_dtype: torch.dtype = torch.float32) -> nn.Module:
    """FSDP2 on each transformer block, then the root: the CVAE, sharded in place over a 1-D mesh of the ranks on
    ``device``'s type. Rank 0 holds the whole model (on the CPU); every other rank its shape on the meta device, which
    is allocated on ``device`` once sharded. Then rank 0's tensors are broadcast one at a time into every rank's shard
    (``set_model_state_dict``'s ``broadcast_from_rank0``) and its buffers into every rank's. Under a bfloat16 forward
    the blocks are all-gathered in bfloat16 and the gradients reduce-scattered in float32 (``MixedPrecisionPolicy``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    whole = model.state_dict() if ranks.is_main else {}  # rank 0's CPU tensors, the source of every shard
    shard_blocks(model, init_device_mesh(device.type, (ranks.world,)), param_dtype)
    if not ranks.is_main:
        model.to_empty(device=device)
    set_model_state_dict(model, whole, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    broadcast_buffers(model)
    return model


def shard_blocks(model: nn.Module, mesh, param_dtype: torch.dtype = torch.float32) -> None:
    """FSDP2 (``fully_shard``) on each of the CVAE's transformer blocks, then at the root, over ``mesh``; blocks
    all-gathered in ``param_dtype`` (bfloat16: gradients reduce-scattered in float32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not isinstance(model.backbone, GPT):
        model.share_prefix = False  # why: the module docstring
    # FSDP warns of every module output that is a view (the blocks' keys and values, the CVAE's NLLs): an in-place
    # op on one would skip its pre-backward gather. Nothing here changes a module's output in place (two FSDP ranks
    # train as one process does, tests/training/loop/test_ddp.py).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")
    policy = (MixedPrecisionPolicy() if param_dtype == torch.float32
              else MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32))
    for block in transformer_blocks(model.backbone):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def broadcast_buffers(module: nn.Module) -> None:
    """Rank 0's buffers (the non-persistent ones too, which no state dict holds) into every rank's, in place."""
    import torch.distributed as dist

    for buffer in module.buffers():
        dist.broadcast(buffer, src=0)


def broadcast_module(module: nn.Module) -> None:
    """Rank 0's parameters and buffers of a module every rank holds whole (the frozen policy's baseline copy) into
    every rank's, in place."""
    import torch.distributed as dist

    with torch.no_grad():
        for param in module.parameters():
            dist.broadcast(param.data, src=0)
    broadcast_buffers(module)


# ---------------------------------------------------------------- checkpoints


def checkpoint_state(model: nn.Module, opt: torch.optim.Optimizer, sharded: bool
                     ) -> tuple[dict[str, torch.Tensor], dict]:
    """(the trained tensors, ``run_dir.trained_state``'s names, on the CPU; AdamW's state dict, its parameters
    numbered as ``Optimizer.state_dict`` numbers them): what ``run_dir.save_checkpoint`` writes. Under FSDP a
    collective every rank takes part in: rank 0 receives the whole tensors, the others empty dicts."""
    if not sharded:
        # cloned: a backbone with tied input and output embeddings holds one tensor under two names,
        # which safetensors refuses to write twice
        return {k: v.detach().cpu().contiguous().clone() for k, v in trained_state(model).items()}, opt.state_dict()
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    tensors = get_model_state_dict(model, options=options)
    named = get_optimizer_state_dict(model, opt, options=options)
    frozen = frozen_parameter_names(model)  # a tied frozen weight's second name too
    return ({k: v.contiguous().clone() for k, v in tensors.items() if k not in frozen},
            numbered(named) if named.get("param_groups") else {})


def numbered(named: dict) -> dict:
    """An optimizer state dict keyed by parameter name (``torch.distributed.checkpoint``'s) -> keyed by position in
    the param groups, as ``Optimizer.state_dict`` has it."""
    names = [name for group in named["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(names)}
    groups, start = [], 0
    for group in named["param_groups"]:
        groups.append({**group, "params": list(range(start, start + len(group["params"])))})
        start += len(group["params"])
    return {"state": {index[name]: state for name, state in named["state"].items()}, "param_groups": groups}


def load_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, state: dict, sharded: bool) -> None:
    """``state`` (numbered, as ``checkpoint_state`` returns it, read back by ``run_dir.read_optimizer``) into
    ``opt``; under FSDP rank 0 alone has read it (the others pass {}) and broadcasts each tensor, of which every
    rank keeps its shard."""
    if not sharded:
        opt.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    named = {}
    if state:
        names = [name for name, p in model.named_parameters() if p.requires_grad]  # the optimizer's order
        named = {"state": {names[i]: s for i, s in state["state"].items()},
                 "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                                  for group in state["param_groups"]]}
    set_optimizer_state_dict(model, opt, named,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
