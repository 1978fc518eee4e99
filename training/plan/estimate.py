"""``tokweight plan``: will a configuration fit, before anything is downloaded or a GPU is at hand.

The CVAE of the configuration is built as a run builds it (``training/plan/build.py``) under torch's FakeTensorMode: every
tensor is a fake with a shape, a dtype and a device and no storage, so an 8B backbone plans on a laptop with nothing
allocated. Then, under torch's memory tracker (``MemTracker``; ``FSDPMemTracker`` and a fake process group of N
ranks under FSDP, as torchtitan's estimation script estimates its jobs), it runs what the run
runs: a training step (``step.train_step``) with AdamW's state made beforehand, as every step after a run's first
holds it; one validation forward; one decode step (the prompt's pass and one token against its key/value cache).
The tracker sees every tensor each op makes and frees, so its peak is the peak of live tensors on one rank, by
kind; torch's FlopCounterMode counts each phase's FLOPs (the training step's in a second step, untracked).

The batch's index tensors (positions, masks, ids) are fakes that hold their real values ("constants"), so the
forward reads lengths off them as a run reads them off its batch; everything computed from a parameter is a fake.

What it does not see: the CUDA caching allocator's rounding and fragmentation beyond its 512-byte blocks, the
CUDA context, and kernels' workspaces that live inside one op (cuBLAS, flash attention); the CPU's attention
kernel stands in for the GPU's. ``headroom`` is left for them when the largest batch is searched.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field

import torch

from tokweight.training.plan.build import build, model_spec, plan_batch
from tokweight.training.config.plan import PlanConfig
from tokweight.training.plan.fake import (as_constants, by_kind, fake_mode, fake_world, quiet, reset_peak,
                                          track_optimizer, tracker_for)
from tokweight.training.loop.precision import autocast

GIB = 1 << 30


@dataclass
class Phase:
    """One phase's peak on one rank, bytes by kind, and its FLOPs (per rank)."""

    peak: int
    kinds: dict[str, int]
    flops: int = 0


@dataclass
class Plan:
    config: PlanConfig
    parameters: int  # the model's parameter count (whole, not a rank's shard)
    trainable: int
    train: Phase
    validation: Phase
    decode: Phase
    fits: bool  # the training step and the validation fit memory_gib less the headroom
    largest_batch: int | None = None  # per rank; 0: not even one example; None: not searched
    largest_eval_batch: int | None = None  # examples of a validation forward that fit; None: not searched, or all do
    wall_s: float = 0.0
    searched: list = field(default_factory=list)  # (batch, peak bytes) the search measured

    def to_json(self) -> dict:
        return asdict(self)


def state_for(built, train_cfg):
    """The ``state.State`` a training step reads (no data stream, one rank's view)."""
    from tokweight.pipeline.ranks import Ranks
    from tokweight.training.objective.baselines import make_baseline
    from tokweight.training.objective.global_batch import LOCAL
    from tokweight.training.config.components import WeightingParams
    from tokweight.training.objective.schedules import Schedule
    from tokweight.training.loop.state import State

    return State(built.model, built.model, built.opt, make_baseline("precomputed", None),
                 WeightingParams(train_cfg.loss.eps, train_cfg.loss.eps_inv, 1.0), None, LOCAL,
                 Ranks.__new__(Ranks), torch.device("cpu"), {}, Schedule.of(train_cfg))


def validation_forward(model, batch, dtype: str) -> None:
    """The forward ``validation.evaluate_pass`` runs on a batch, without gradients."""
    model.eval()
    with torch.no_grad(), autocast(dtype, torch.device("cpu")):
        model(batch, generator=torch.Generator().manual_seed(0))
    model.train()


def decode_step(model, batch, dtype: str, k: int, between=lambda: None) -> None:
    """One decode step of every (example, latent value): the prompt x with z's slots through the backbone, its
    key/value cache kept, then one new token against it (``decode.continue_cached``'s first two calls). A discrete
    latent's K values, or a continuous one's ``k`` cluster centres (``decode.latent_values``)."""
    from tokweight.training.decoding.decode import greedy

    lat = model.latent
    discrete = lat.kind == "discrete"
    K = lat.k if discrete else k
    prompt = batch.zcond.input_ids[:, : int(batch.zcond.logit_pos[0, 0]) + 1].repeat_interleave(K, 0)
    z = (torch.eye(K) if discrete else torch.zeros(K, lat.features)).repeat(len(batch), 1)
    slot_ids = lat.latent_ids.repeat(len(batch)) if discrete else None
    slot_pos = batch.slot_pos.repeat_interleave(K, 0)
    model.eval()
    with torch.no_grad(), autocast(dtype, torch.device("cpu")):
        inputs, kwargs = model.conditioning.decoder_inputs(model.backbone, prompt, slot_pos, z, slot_ids)
        hidden, past = model.backbone.extend(inputs, **kwargs)
        nxt = greedy(model.backbone.head(hidden[:, -1]))
        between()  # the backbone is called again as a root module
        kwargs.pop("tok_emb", None)
        kwargs.pop("memory", None)
        model.backbone.extend(nxt[:, None], prefix=past, **kwargs)
    model.train()


def optimizer_state(built) -> None:
    """AdamW's state made as its first step makes it (zero gradients; the parameters do not move: lr 0), so that
    the one step measured holds it from its start, as every step after a run's first does. The gradients are
    clipped first, as a step clips them: under FSDP the first clip of sharded gradients has DTensor infer its
    shapes on tensors of the whole gradients' size, fakes the tracker would count (every gradient, unsharded) where
    a run's inference allocates nothing."""
    params = [p for group in built.opt.param_groups for p in group["params"]]
    lrs = [group["lr"] for group in built.opt.param_groups]
    for group in built.opt.param_groups:
        group["lr"] = 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    built.opt.step()
    built.opt.zero_grad(set_to_none=True)
    for group, lr in zip(built.opt.param_groups, lrs):
        group["lr"] = lr


@contextlib.contextmanager
def gpu_head_chunks(memory_gib: float):
    """The output head's chunks as large as on a GPU of ``memory_gib`` (``head.chunk_rows``), though the fakes are on
    the CPU, whose chunks are smaller."""
    from tokweight.pipeline.models import head

    cpu = head.LOGIT_CHUNK_BYTES["cpu"]
    head.LOGIT_CHUNK_BYTES["cpu"] = min(head.LOGIT_CHUNK_BYTES["cuda"], int(memory_gib * GIB) // 64)
    try:
        yield
    finally:
        head.LOGIT_CHUNK_BYTES["cpu"] = cpu


def eval_batch(cfg: PlanConfig, train_cfg, built, mode):
    """The batch a validation forward reads: ``log.eval_batch_size`` examples of the plan's length."""
    batch = plan_batch(train_cfg.log.eval_batch_size, cfg.seq_len, train_cfg.cvae.slots, built.vocab_size, seed=1)
    return batch if mode is None else as_constants(mode, batch)


def run_phases(cfg: PlanConfig, spec: dict, batch_size: int, mesh, fake: bool = True, every: bool = True
               ) -> tuple[object, dict[str, Phase]]:
    """(the built objects, {phase: Phase}): a training step at ``batch_size`` with AdamW's state made, and with
    ``every`` its FLOPs, the validation forward (at ``log.eval_batch_size`` examples) and the decode step. ``fake``
    False runs it for real (the CPU check)."""
    from torch.utils.flop_counter import FlopCounterMode

    from tokweight.training.loop.step import train_step

    train_cfg = cfg.train_config(batch_size)
    counting = lambda: FlopCounterMode(display=False) if every else contextlib.nullcontext()
    with quiet(), gpu_head_chunks(cfg.memory_gib) if fake else contextlib.nullcontext(), \
            fake_mode() if fake else contextlib.nullcontext() as mode:
        built = build(spec, train_cfg, mesh, fake)
        batch = plan_batch(batch_size, cfg.seq_len, train_cfg.cvae.slots, built.vocab_size)
        batch = as_constants(mode, batch) if fake else batch
        state = state_for(built, train_cfg)
        optimizer_state(built)
        phases = {}
        with tracker_for(built, cfg.sharded) as tracker:
            track_optimizer(tracker, built.opt)
            train_step(state, batch, train_cfg, logged=False)  # no FLOP counting here: see below
            phases["train"] = Phase(*by_kind(tracker.get_tracker_snapshot("peak")))
            if every:
                reset_peak(tracker)
                with counting() as flops:
                    validation_forward(built.model, eval_batch(cfg, train_cfg, built, mode), cfg.dtype)
                phases["validation"] = Phase(*by_kind(tracker.get_tracker_snapshot("peak")), flops.get_total_flops())
                reset_peak(tracker)
                with counting() as flops:
                    decode_step(built.model, batch, cfg.dtype, train_cfg.cvae.k, tracker.reset_mod_stats)
                phases["decode"] = Phase(*by_kind(tracker.get_tracker_snapshot("peak")), flops.get_total_flops())
        if every:  # the step's FLOPs in a step of their own: FlopCounterMode's module tracker hooks every module's
            with counting() as flops:  # outputs for the backward, which keeps what gradient checkpointing frees
                train_step(state, batch, train_cfg, logged=False)
            phases["train"].flops = flops.get_total_flops()
    return built, phases


def plan(cfg: PlanConfig, search: bool = True) -> Plan:
    """The plan of ``cfg``; with ``search``, the largest batch per rank that fits ``memory_gib`` less the headroom."""
    t0 = time.perf_counter()
    spec = model_spec(cfg.model)
    with fake_world(cfg.ranks, cfg.sharded) as mesh:
        built, phases = run_phases(cfg, spec, cfg.batch_size, mesh)
        params, trainable = built.parameters, built.trainable
        del built
        budget = cfg.budget
        need = max(phases["train"].peak, phases["validation"].peak)
        result = Plan(cfg, params, trainable, phases["train"], phases["validation"], phases["decode"], need <= budget)
        if search:
            result.largest_batch = largest_batch(cfg, spec, mesh, budget, (cfg.batch_size, phases["train"]),
                                                  result.searched)
            if phases["validation"].peak > budget:
                evals = cfg.train_config().log.eval_batch_size
                result.largest_eval_batch = largest_eval_batch(phases["validation"], evals, budget)
    result.wall_s = time.perf_counter() - t0
    return result


def train_peak(cfg: PlanConfig, spec: dict, mesh, batch_size: int, fake: bool = True) -> int:
    """The peak of a training step at ``batch_size`` per rank (``fake`` False: of the step run for real)."""
    _, phases = run_phases(cfg, spec, batch_size, mesh, fake=fake, every=False)
    return phases["train"].peak


def largest_batch(cfg: PlanConfig, spec: dict, mesh, budget: float, first: tuple[int, Phase], searched: list,
                  fake: bool = True) -> int:
    """The largest batch per rank whose training step peaks within ``budget`` bytes, near enough: the peak at the
    planned batch ``first`` is what the model holds (parameters, gradients, optimizer state) and what its examples
    add (activations, temporaries, taken to grow in proportion to the batch), which gives a guess; the guess is
    measured and lowered until it fits. Temporaries that do not grow with the batch (FSDP's gathered blocks) make
    the guess cautious: the batch one or two above it may fit too."""
    known = {first[0]: first[1].peak}
    searched.append((first[0], first[1].peak))

    def peak(b: int) -> int:
        if b not in known:
            known[b] = train_peak(cfg, spec, mesh, b, fake)
            searched.append((b, known[b]))
        return known[b]

    b0, phase = first
    held = sum(phase.kinds[k] for k in ("parameters", "gradients", "optimizer"))
    per_example = max((phase.peak - held) / b0, 1.0)
    guess = math.floor((budget - held) / per_example)
    while guess > 0 and peak(guess) > budget:
        guess = min(guess - 1, math.floor(guess * budget / peak(guess)))
    return max(guess, 0)


def largest_eval_batch(validation: Phase, evals: int, budget: float) -> int:
    """The examples a validation forward fits in ``budget`` bytes: what the model holds (parameters, gradients,
    optimizer state) and, per example, the rest of its peak at ``evals`` examples (a forward without a graph: its
    activations grow with the batch)."""
    held = sum(validation.kinds[k] for k in ("parameters", "gradients", "optimizer"))
    per_example = max((validation.peak - held) / evals, 1.0)
    return max(math.floor((budget - held) / per_example), 0)


def fits_line(plan: Plan) -> str:
    """One line: the largest batch that fits, per rank, and its memory; and, when the validation forward does not
    fit, the evaluation batch that does."""
    cfg = plan.config
    if plan.largest_batch is None:
        return ""
    memory = f"{cfg.memory_gib:g} GiB per rank (less {cfg.headroom:.0%} headroom)"
    if plan.largest_batch == 0:
        return (f"not even a batch of 1 fits {memory}: try --lora-rank, --dtype bfloat16, --grad-checkpointing, or "
                "--shard fsdp over more ranks")
    line = f"the largest batch that fits {memory} is --batch-size {plan.largest_batch}"
    if plan.largest_eval_batch is not None:
        evals = cfg.train_config().log.eval_batch_size
        line += (f"; a validation forward at log.eval_batch_size {evals} needs {plan.validation.peak / GIB:.1f} GiB: "
                 f"about {plan.largest_eval_batch} examples fit (train --set log.eval_batch_size="
                 f"{plan.largest_eval_batch})")
    return line


def plan_command(cfg: PlanConfig) -> str:
    """The `tokweight plan` command line of ``cfg`` (its z pathway and latent at their defaults)."""
    flags = [f"--model {cfg.model}", f"--k {cfg.k}", f"--batch-size {cfg.batch_size}", f"--seq-len {cfg.seq_len}",
             f"--dtype {cfg.dtype}", f"--lora-rank {cfg.lora_rank}", f"--shard {cfg.shard}", f"--ranks {cfg.ranks}",
             f"--memory {cfg.memory_gib:g}", *(["--grad-checkpointing"] if cfg.grad_checkpointing else []),
             *([f"--eval-batch-size {cfg.eval_batch_size}"] if cfg.eval_batch_size else []),
             *([f"--set merge_passes={str(cfg.merge_passes).lower()}"] if cfg.merge_passes is not None else [])]
    return "tokweight plan " + " ".join(flags)


def device_memory(device: torch.device) -> float | None:
    """A CUDA device's memory in GiB; None elsewhere."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory / GIB


def out_of_memory(train_cfg, ranks: int, seq_len: int, device: torch.device) -> RuntimeError:
    """The one-line error of a run (``config.train.TrainConfig``) that ran out of device memory at a batch of
    ``seq_len``-token sequences: the batch per rank that the plan of its configuration says fits the device."""
    from tokweight.pipeline.models.dtypes import resolve_dtype

    io, batch = train_cfg.io, train_cfg.optim.batch_size
    memory = device_memory(device)
    cfg = PlanConfig(model=io.checkpoint, k=train_cfg.cvae.k, batch_size=batch, seq_len=max(seq_len, 8),
                     dtype=resolve_dtype(io.dtype, device), lora_rank=train_cfg.lora.rank, grad_checkpointing=io.grad_checkpointing,
                     shard=io.shard, ranks=ranks, cvae=train_cfg.cvae, eval_batch_size=train_cfg.log.eval_batch_size,
                     merge_passes=io.merge_passes,
                     **({"memory_gib": memory} if memory else {}))
    where = f"out of device memory at --batch-size {batch} per rank ({seq_len}-token sequences)"
    try:
        line = fits_line(plan(cfg))
    except Exception as error:  # the run's own error matters more than the plan's (FSDP's: inside torchrun)
        return RuntimeError(f"{where}; tokweight plan could not say what fits here ({' '.join(str(error).split())}): "
                            f"run {plan_command(cfg)}")
    return RuntimeError(f"{where}; {line}")
