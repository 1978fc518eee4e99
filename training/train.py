"""Stage two: train a CVAE from the entangled checkpoint with a weighted reconstruction.

setup -> fit -> validate (``validation.py``). ``run(cfg)`` is the whole job (``train_config.TrainConfig``,
one group per component); the CLI only builds the config. Outputs in RUN/ (``run_dir.py``):
config.json (the resolved TrainConfig), metrics.jsonl (one line per logged step and per
validation, then the final validation and the stop line), checkpoint/ (safetensors model,
optimizer and RNG states, state.json, vocab.json; replaced atomically), and resume from it; with several
starts (``best_start``) also starts/seed-S/ (each start's run) and starts.json (the choice).

``--steps`` is a cap: once its periodic validations say the run converged (``convergence.py``) it ends
earlier, after the learning rate's fall to 0 that ends every run (``schedules.lr_decay_window``), and it
says why it stopped (``"stop"`` in its result and metrics.jsonl's last line). A resumed run ends bitwise
where the uninterrupted run ends (CPU, same threads): the checkpoint holds the model, the optimizer, every
rank's RNG, the stop rule's state and the step it said the run converged; the data
stream is fast-forwarded to the checkpoint's step (``stream.TrainStream.batches``); the
schedules, the E-step and the continuous latent's noise are functions of the step.

Data parallel (torchrun; gloo on CPU, NCCL on GPUs): the global batch of N * B examples
is drawn from ``lanes`` sample streams, each rank reading only its own lanes' shards
(``stream.TrainStream``); gradients are averaged with one all_reduce per parameter, and the
terms that couple a batch's examples are computed over the global batch
(``global_batch.py``), so N ranks with batch B step like one process with batch N * B
and the same lanes. Rank 0 writes everything.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from tokweight.pipeline.backbone import load_backbone, store_template
from tokweight.pipeline.errors import Skips
from tokweight.pipeline.labels import load_labels
from tokweight.pipeline.ranks import Ranks, resolve_device
from tokweight.pipeline.vocab import Vocab
from tokweight.training.baselines import AdaptersOff, Baseline, make_baseline
from tokweight.training.convergence import Convergence, converged, observe, val_mi, val_objective
from tokweight.training.conditioning import token_key_values
from tokweight.training.cvae import (CVAE, add_latent_tokens, build_cvae, latent_tokens_needed, objective,
                                     spread_latent_embeddings, token_row_spread)
from tokweight.training.data import StoreRef, StreamSpec, TrainBatch, extract_command, shards_without_rows, split_urls
from tokweight.training.estep import EStepConfig, em_objective, step_labels
from tokweight.training.faults import NO_HOOKS, Hooks
from tokweight.training.global_batch import GlobalBatch
from tokweight.training.lora import attach as attach_lora, latent_row_ids, require_peft
from tokweight.training.losses import (WeightingParams, anchor_penalty, example_kl, reconstruction_weights,
                             weighted_reconstruction)
from tokweight.training.metrics import entropy, informative_token_spread, posterior_gradient_norms
from tokweight.training.run_dir import (append_metrics, committed_checkpoint, metrics_size, resume, save_checkpoint,
                                        write_config)
from tokweight.training.schedules import lr_at, lr_decay_window
from tokweight.training.stream import TrainStream
from tokweight.training.train_config import IOConfig, LossConfig, OptimConfig, RemedyConfig, TrainConfig
from tokweight.training.validation import Scoring, validate

# ---------------------------------------------------------------- setup


@dataclass
class State:
    """The live objects of a run and its step; the configs stay with the caller (``fit``)."""

    model: CVAE
    opt: torch.optim.Optimizer
    baseline: Baseline
    params: WeightingParams
    spec: StreamSpec  # the training stream
    global_batch: GlobalBatch  # this rank's place in the data-parallel job
    ranks: Ranks
    device: torch.device
    meta: dict  # the run's part of the checkpoint's state.json (run_dir.save_checkpoint)
    step: int = 0
    strategy_names: tuple[str, ...] = ()  # an E-step that reads labels: latent value k is strategy_names[k]
    skips: Skips = field(default_factory=Skips)  # samples this rank's streams left out (train and val), per shard
    convergence: Convergence = field(default_factory=Convergence)  # the stop rule's state
    converged_at: int | None = None  # the step the stop rule said the run converged: the lr's fall starts there
    stop: str | None = None  # why the run stopped: "converged" or "step cap"; None while it trains
    pause_at: int | None = None  # a start (``best_start``) trains to here, checkpoints and returns
    hooks: Hooks = NO_HOOKS


def data_seed(seed: int) -> int:
    """The stream's seed, the same for a run and its resumes (the 0 in the seed sequence was once the step
    a run resumed from; kept, so that runs repeat the data they drew before)."""
    return int(np.random.SeedSequence([seed, 0]).generate_state(1)[0])


def setup(cfg: TrainConfig, ranks: Ranks, hooks: Hooks = NO_HOOKS) -> State:
    if cfg.lora.rank:
        require_peft()  # before any checkpoint is read
    torch.manual_seed(cfg.optim.seed)
    device = ranks.device(cfg.io.device)
    init, base = load_checkpoints(cfg.io)
    base_vocab_size = base.model.cfg.vocab_size
    adapters_on_base = cfg.lora.rank > 0 and base is init and cfg.loss.policy == "frozen"
    # the frozen copy, taken before any re-init; with adapters on the baseline checkpoint, that checkpoint is
    # the trained backbone with its adapters off (AdaptersOff, below)
    baseline = None if adapters_on_base else make_baseline(cfg.loss.policy, base.model.to(device))
    vocab = add_latent_tokens(init.model, init.vocab, latent_tokens_needed(cfg.cvae))  # the trainable copy's
    model = build_cvae(init.model.train(), vocab, cfg.cvae).to(device)
    adapters = (attach_lora(model.backbone, cfg.lora.rank, latent_row_ids(vocab, cfg.cvae), cfg.optim.seed)
                if cfg.lora.rank else None)
    if adapters_on_base:
        baseline = AdaptersOff(model.backbone, adapters, base_vocab_size)
    if cfg.io.grad_checkpointing:
        model.backbone.enable_checkpointing()
    spread_latents(model, vocab, cfg.remedies, cfg.optim.seed)  # before resume: a resumed run loads its trained rows
    store, dataset_mean_b = open_store(cfg, init.vocab, base.fingerprint)
    spec = StreamSpec(urls=split_urls(cfg.io.data, "train"), vocab=vocab, slots=cfg.cvae.slots,
                      block_size=init.model.cfg.block_size, batch_size=cfg.optim.batch_size,
                      store=store if cfg.loss.policy == "precomputed" else None,
                      seed=data_seed(cfg.optim.seed), shuffle_buffer=cfg.io.shuffle_buffer,
                      lanes=cfg.io.lanes or ranks.world, root=cfg.io.data, on_bad_sample=cfg.io.on_bad_sample)
    init_memory(model, TrainStream(spec, ranks.rank, ranks.world), device, cfg.optim.seed)  # before resume too
    trained = [p for p in model.parameters() if p.requires_grad]
    if ranks.is_main:
        print(trainable_line(model), file=sys.stderr, flush=True)
    opt = torch.optim.AdamW(trained, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, betas=(0.9, 0.95))
    meta = {"cvae": cfg.cvae.to_json(), "init_fingerprint": init.fingerprint, "baseline_fingerprint": base.fingerprint,
            "model_config": init.model.cfg.to_json(), "dataset_mean_b": dataset_mean_b,
            "backbone": init.meta.get("kind", "tokweight"), "template": init.vocab.template.to_json()}
    saved = resume(cfg, model, opt, init.fingerprint, ranks.rank, ranks.world) or {}
    ranks.broadcast_tensors(model.parameters())  # identical starting points, whatever the ranks computed alone
    set_rng_states(saved.get("rng", {}), device)
    return State(model, opt, baseline, WeightingParams(cfg.loss.eps, cfg.loss.eps_inv, dataset_mean_b), spec,
                 GlobalBatch(ranks.rank, ranks.world), ranks, device, meta, saved.get("step", 0), label_names(cfg),
                 convergence=Convergence(**saved.get("convergence", {})), converged_at=saved.get("converged_at"),
                 hooks=hooks)


def trainable_line(model: CVAE) -> str:
    """The line a run starts with: how many parameters train, of how many, and where they are."""
    groups: dict[str, int] = {}
    total = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if p.requires_grad:
            groups[parameter_group(name)] = groups.get(parameter_group(name), 0) + p.numel()
    trained = sum(groups.values())
    parts = ", ".join(f"{group} {n:,}" for group, n in groups.items())
    return f"training {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%): {parts}"


def parameter_group(name: str) -> str:
    """Which part of the CVAE a parameter belongs to, for ``trainable_line``."""
    if not name.startswith("backbone."):
        return "posterior, prior and z pathway"
    if ".lora_" in name:
        return "LoRA adapters"
    if ".parametrizations." in name:
        return "latent token rows"
    return "backbone"


def rng_states(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's global torch RNG states (dropout draws from them; every other draw of a run has its
    own seeded generator)."""
    states = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_states(states: dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore ``rng_states``' result (a resumed run's; nothing for a fresh one)."""
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


def load_checkpoints(io: IOConfig):
    """(init checkpoint, baseline checkpoint): one object when they are the same directory; both read in the
    template the store was extracted with."""
    template = store_template(io.store, io.baseline_source)
    init = load_backbone(io.checkpoint, template=template)
    if Path(io.baseline_source).resolve() == Path(io.checkpoint).resolve():
        return init, init
    base = load_backbone(io.baseline_source, template=template)
    if list(base.vocab.tokens) != list(init.vocab.tokens):
        raise ValueError(f"baseline checkpoint {base.path} and init checkpoint {init.path} have different vocabularies")
    return init, base


def spread_latents(model: CVAE, vocab: Vocab, remedies: RemedyConfig, seed: int) -> None:
    """The latent rows (discrete), or the slots a continuous z is projected into, spread from the checkpoint's
    mean latent row (``RemedyConfig.latent_embedding_norm``, in units of the checkpoint's token-row spread; a
    continuous z's: the mean of every latent token's row, the tokens its base saw in the slots)."""
    if not remedies.latent_embedding_norm > 0:
        return
    generator = torch.Generator().manual_seed(seed)
    weight = model.backbone.wte.weight.detach()
    ids = torch.tensor([vocab.latent_id(k) for k in range(vocab.k_max)], device=weight.device)
    norm = remedies.latent_embedding_norm * token_row_spread(weight, ids)
    if model.conditioning.slot_proj is not None:
        model.conditioning.init_slots(weight[ids].mean(0), norm, generator)
    elif model.latent.kind == "discrete":  # a continuous z through the memory writes no slot: nothing to spread
        spread_latent_embeddings(model.backbone, model.latent.latent_ids.tolist(), norm, generator,
                                 center=remedies.latent_embedding_center)


def init_memory(model: CVAE, stream: TrainStream, device: torch.device, seed: int) -> None:
    """The memory pathway's projection at the scale of the backbone's keys and values, measured on the z-free
    positions (the tokens before <z>) of the first training batch (``Conditioning.init_memory``). Ranks
    measure their own rows; the broadcast after resume makes the parameters rank 0's."""
    if model.conditioning.memory_proj is None:
        return
    batch = next(stream.batches(0)).to(device)
    model.backbone.eval()  # no dropout draw: the run's random stream stays as without the measurement
    with torch.no_grad():
        mean, spread = token_key_values(model.backbone, batch.zcond.input_ids[:, : int(batch.z_pos.max())],
                                        batch.z_pos)
    model.backbone.train()
    model.conditioning.init_memory(mean, spread, torch.Generator().manual_seed(seed))


def open_store(cfg: TrainConfig, vocab: Vocab, fingerprint: str) -> tuple[StoreRef | None, float | None]:
    """(the store, the dataset's mean b for distribution-rescale); fails early on a wrong fingerprint,
    vocabulary, an incomplete store or one without rows for a shard the run reads."""
    if not cfg.io.store:
        return None, None
    store = StoreRef(cfg.io.store, fingerprint)
    view = store.open(vocab)
    urls = split_urls(cfg.io.data, "train")
    check_store_holds(cfg.io, cfg.loss.policy, view, urls + split_urls(cfg.io.data, "val"))
    if cfg.loss.weighting != "distribution-rescale":
        return store, None
    return store, float(view.mean_example_mean_b(list(urls)))


def check_store_holds(io: IOConfig, policy: str, view, urls) -> None:
    """Before any step: every shard the run reads (train, and val for the validations) has stored rows."""
    missing = shards_without_rows(view, urls)
    if missing and policy == "precomputed":
        command = extract_command(io.baseline_source, io.data, io.store)
        raise ValueError(f"{len(missing)} shards (first {missing[0]}) have no rows in store {io.store}; "
                         f"add them with: {command}")


def label_names(cfg: TrainConfig) -> tuple[str, ...]:
    """The dataset's strategies in its labels' order (an E-step that reads labels only; empty otherwise)."""
    estep = cfg.remedies.estep
    if estep.mode != "label" and not estep.labelled:
        return ()
    what = 'estep mode "label"' if estep.mode == "label" else f"estep labelled {estep.labelled}"
    strategies = load_labels(cfg.io.data).strategies
    if not strategies:
        raise ValueError(f'{what} needs a dataset whose {Path(cfg.io.data) / "dataset.json"} '
                         "lists its strategies (tokweight synth, or tokweight convert of labelled lines)")
    if len(strategies) > cfg.cvae.k:
        raise ValueError(f"{what}: {len(strategies)} strategies {list(strategies)} "
                         f"need k >= {len(strategies)}, got k={cfg.cvae.k}")
    return strategies


# ---------------------------------------------------------------- one step


def sample_generator(seed: int, step: int) -> torch.Generator:
    """The continuous latent's noise for one step's global batch, the same on every rank: a function
    of (seed, step), so resumes repeat it. (The 0 in the seed sequence was once the rank; kept, so
    that runs repeat the noise they drew before.)"""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 0, step]).generate_state(1)[0]))


def step_objective(latent, out, *, pi: torch.Tensor, beta: float, free_bits: float, estep: EStepConfig | None,
                   labels: torch.Tensor | None, batch: GlobalBatch):
    """The E-step objective (``estep.em_objective``) while one is active (``estep`` given), else the plain one.
    Under the E-step ``recon`` is reported, not optimised, so the gradient diagnostic reads 0 there."""
    if estep is not None:
        return em_objective(latent, out, pi, beta, free_bits, estep, labels, batch)
    return objective(latent, out, pi, beta, free_bits, batch)


@dataclass
class StepTerms:
    """One step's objective and what its diagnostics read."""

    out: object  # the CVAE's outputs (CVAEOutput)
    b: torch.Tensor  # (B, T_max) nats over S, detached
    pi: torch.Tensor  # (B, T_max) the reconstruction's token weights
    degenerate: torch.Tensor  # (B,) bool: weights fell back to uniform
    obj: object  # the objective's terms (cvae.Objective)
    anchor: torch.Tensor  # () the anchor term, measured whatever its weight
    beta: float
    estep: bool  # whether the E-step objective was the one optimised

    def total(self, anchor_weight: float) -> torch.Tensor:
        """What the step backpropagates: the objective, plus the anchor term when its weight is on."""
        return self.obj.loss + anchor_weight * self.anchor if anchor_weight else self.obj.loss


def step_weights(state: State, batch: TrainBatch, out, loss: LossConfig):
    """(b, pi, degenerate): where b comes from (the policy) and the weighting's token weights."""
    b = state.baseline(batch, out)  # (B, T_max) nats over S, detached
    pi, degenerate = reconstruction_weights(loss.weighting, b, batch.zfree.mask, state.params,
                                            loss.token_weighted_reconstruction_weight, state.global_batch)
    return b, pi, degenerate


def step_terms(state: State, batch: TrainBatch, loss: LossConfig, remedies: RemedyConfig,
               optim: OptimConfig) -> StepTerms:
    """The forward pass and the step's objective: the E-step's while one is active, else the plain one."""
    model, step = state.model, state.step
    out = model(batch, generator=sample_generator(optim.seed, step), global_batch=state.global_batch)
    b, pi, degenerate = step_weights(state, batch, out, loss)
    beta, em = loss.beta.at(step), remedies.estep.active(step)
    labels = (step_labels(remedies.estep, batch.strategies, state.strategy_names, batch.keys)
              if em and state.strategy_names else None)
    obj = step_objective(model.latent, out, pi=pi, beta=beta, free_bits=loss.free_bits,
                         estep=remedies.estep if em else None, labels=labels, batch=state.global_batch)
    return StepTerms(out, b, pi, degenerate, obj, anchored(model, out, b, batch.zfree.mask, loss), beta, em)


def diagnostics(state: State, batch: TrainBatch, terms: StepTerms, lr: float, gradient_norms: bool) -> dict:
    """The step's metrics record; its ``.item()`` calls wait for the device, so only logged steps make one.
    The posterior-gradient norms need the graphs: before the backward."""
    obj, model = terms.obj, state.model
    record = {"step": state.step, "loss": obj.loss.item(), "recon": obj.recon.item(),
              "kl": example_kl(obj.kl).mean().item(), "kl_term": obj.kl_term.item(), "beta": terms.beta, "lr": lr,
              "anchor": terms.anchor.item(), "degenerate": int(terms.degenerate.sum()), "estep": terms.estep,
              **latent_summary(model, terms.out, batch, state.params, terms.pi, terms.b)}
    if gradient_norms:
        record |= posterior_gradient_norms(obj.recon, terms.beta * obj.kl_term, model.posterior_parameters)
    return record


def forward_backward(state: State, batch: TrainBatch, cfg: TrainConfig, lr: float, logged: bool) -> dict | None:
    """One step's objective and its gradients (not yet averaged across ranks); the step's metrics record on a
    logged step, else None."""
    with torch.autocast(state.device.type, dtype=torch.bfloat16, enabled=cfg.io.dtype == "bfloat16"):
        terms = step_terms(state, batch, cfg.loss, cfg.remedies, cfg.optim)
    every = cfg.log.grad_diag_every
    record = diagnostics(state, batch, terms, lr, bool(every and state.step % every == 0)) if logged else None
    state.opt.zero_grad(set_to_none=True)
    terms.total(cfg.loss.anchor_weight_at(state.step)).backward()
    return record


def logged_step(state: State, cfg: TrainConfig) -> bool:
    """Whether the step ``state.step`` (0-based) writes a metrics line: every log_every-th, the run's last, and
    the posterior-gradient diagnostic's steps."""
    step, every = state.step, cfg.log.grad_diag_every
    return ((step + 1) % cfg.log.log_every == 0 or step + 1 == decay_window(state, cfg)[1]
            or bool(every and step % every == 0))


def anchored(model: CVAE, out, b: torch.Tensor, mask: torch.Tensor, loss: LossConfig) -> torch.Tensor:
    """() the batch mean of E_q[anchor_penalty], q detached (the term keeps the decoder whole; it does not
    move the posterior); measured, and so logged, even when its weight is 0."""
    penalty = anchor_penalty(out.nll, b, mask, loss.anchor_margin)  # (B, copies)
    return model.latent.expectation(penalty, detach(out.post)).mean()


def detach(value):
    return value.detach() if isinstance(value, torch.Tensor) else tuple(v.detach() for v in value)


@torch.no_grad()
def latent_summary(model: CVAE, out, batch: TrainBatch, params: WeightingParams, pi: torch.Tensor,
                   b: torch.Tensor) -> dict:
    """Uniform reconstruction E_q[sum_t l_t / T]; discrete: mean H(q), the spreads
    mean_i (max_k R_ik - min_k R_ik) of the uniform R and of the trained (weighted, ``pi``) R
    across latent values, the same spread of l_t at the example's most surprising token
    (``l_t0_spread``: the decoder's response to z where z can help), usage mean_i q_i, and
    argmin_usage: the share of examples whose weighted R is lowest at k (where a hard E-step
    would send them)."""
    pi_u, _ = reconstruction_weights("uniform", out.zfree_nll, batch.zfree.mask, params)
    R = weighted_reconstruction(out.nll, pi_u)  # (B, copies)
    summary = {"recon_uniform": model.latent.expectation(R, out.post).mean().item()}
    if model.latent.kind == "discrete":
        q = out.post.exp()
        Rw = weighted_reconstruction(out.nll, pi.to(out.nll.dtype))  # (B, K)
        winners = torch.bincount(Rw.argmin(1), minlength=model.latent.k) / len(Rw)
        summary |= {"q_entropy": float(entropy(q.cpu().numpy()).mean()),
                    "R_spread": (R.max(1).values - R.min(1).values).mean().item(),
                    "R_spread_weighted": (Rw.max(1).values - Rw.min(1).values).mean().item(),
                    "l_t0_spread": informative_token_spread(out.nll, b, batch.zfree.mask).mean().item(),
                    "usage": q.mean(0).tolist(), "argmin_usage": winners.tolist()}
    return summary


def average_gradients(params, world: int) -> None:
    """The ranks' mean gradient on every rank: the gradient of the global batch's mean. One all_reduce per
    dtype over the gradients flattened into one bucket, not one per parameter."""
    if world == 1:
        return
    import torch.distributed as dist

    by_dtype: dict[torch.dtype, list] = {}
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        bucket = torch.cat([p.grad.reshape(-1) for p in group])
        dist.all_reduce(bucket, op=dist.ReduceOp.SUM)
        bucket.div_(world)
        for p, grad in zip(group, bucket.split([p.numel() for p in group])):
            p.grad.copy_(grad.view_as(p.grad))


def optimizer_step(state: State, grad_clip: float, lr: float) -> None:
    params = [p for p in state.model.parameters() if p.requires_grad]
    average_gradients(params, state.global_batch.world)
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    for group in state.opt.param_groups:
        group["lr"] = lr
    state.opt.step()


# ---------------------------------------------------------------- fit


def fit(state: State, cfg: TrainConfig) -> int:
    """Train from ``state.step`` until the stop rule or the step cap says stop (``state.stop``), or to
    ``state.pause_at``; the bytes of shards and store parts this rank's training stream read. The samples it
    left out are added to ``state.skips``."""
    state.stop = stop_reason(state, cfg)
    if state.stop:
        return 0
    ranks = state.global_batch
    stream = TrainStream(state.spec, ranks.rank, ranks.world)
    batches = stream.batches(cfg.io.num_workers, start=state.step)
    bar = tqdm(total=cfg.optim.steps, initial=state.step, desc="train", unit="step", disable=ranks.rank != 0,
               mininterval=1.0)
    try:
        while not state.stop and (state.pause_at is None or state.step < state.pause_at):
            lr = lr_at(cfg.optim.lr, state.step, decay_window(state, cfg))
            record = forward_backward(state, next(batches).to(state.device), cfg, lr, logged_step(state, cfg))
            optimizer_step(state, cfg.optim.grad_clip, lr)
            state.step += 1
            bar.update(1)
            state.hooks.after_step(state.step)
            after_step(state, cfg, record, bar)
    finally:
        bar.close()
        state.skips.merge(stream.skips)
    return stream.bytes_read


def decay_window(state: State, cfg: TrainConfig) -> tuple[int, int]:
    """[start, end) of the learning rate's fall to 0: the cap's last steps, or from where the run converged.
    The run ends at its end."""
    return lr_decay_window(cfg.optim.steps, cfg.optim.lr_decay, state.converged_at)


def stop_reason(state: State, cfg: TrainConfig) -> str | None:
    if state.step < decay_window(state, cfg)[1]:
        return None
    return "converged" if state.converged_at is not None else "step cap"


def after_step(state: State, cfg: TrainConfig, record: dict | None, bar) -> None:
    """The step's metrics line (``record``, made on logged steps only), validation (and the stop rule's reading
    of it) and checkpoint, each on ``cfg.log``'s schedule; the last step always writes a checkpoint; rank 0
    writes."""
    log, step, main = cfg.log, state.step, state.global_batch.rank == 0
    if main and record is not None:
        append_metrics(cfg.io.out, record)
        bar.set_postfix(loss=f"{record['loss']:.3f}", kl=f"{record['kl']:.3f}")
    if log.eval_every and step % log.eval_every == 0 and step < cfg.optim.steps:
        metrics = validate_run(state, cfg, examples=log.eval_examples)
        if cfg.objective_settles <= step < decay_window(state, cfg)[0]:  # once the lr falls, the run's end is set
            # rank 0's reading on every rank: the ranks stop together even if their float sums differed
            state.convergence = state.ranks.broadcast(observe(state.convergence, cfg.optim.stop, step,
                                                              val_objective(metrics, cfg.loss.beta.beta),
                                                              val_mi(metrics)))
            if converged(state.convergence, cfg.optim.stop):
                state.converged_at = step
    state.stop = stop_reason(state, cfg)
    if step % log.ckpt_every == 0 or state.stop or step == state.pause_at:
        checkpoint(state, cfg)


def checkpoint(state: State, cfg: TrainConfig) -> None:
    """RUN/checkpoint/ at ``state.step``: what a resumed run needs to go on as if never stopped."""
    rngs = state.ranks.gather(rng_states(state.device))  # a collective: every rank takes part
    if state.global_batch.rank != 0:
        return
    meta = {"step": state.step, **state.meta, "world": state.global_batch.world,
            "convergence": state.convergence.to_json(), "converged_at": state.converged_at,
            "metrics_bytes": metrics_size(cfg.io.out)}
    rng = {f"{name}.{rank}": t for rank, states in enumerate(rngs) for name, t in states.items()}
    save_checkpoint(cfg.io.out, state.model, state.opt, state.spec.vocab, meta, rng, state.hooks.before_write)
    state.hooks.after_checkpoint(state.step)


def validate_run(state: State, cfg: TrainConfig, examples: int | None = None) -> dict:
    """``validation.validate`` on the val split, scored as the run trains; rank 0 logs it."""
    scoring = Scoring(state.baseline, cfg.loss, state.params, cfg.cvae, cfg.optim.seed)
    spec = replace(state.spec, urls=split_urls(cfg.io.data, "val"), batch_size=cfg.log.eval_batch_size)
    ranks = state.global_batch
    metrics = validate(state.model, scoring, spec, split="val", step=state.step, world=ranks.world,
                       device=state.device, log=Path(cfg.io.out) if ranks.rank == 0 else None, examples=examples)
    state.skips.merge(metrics.get("skipped_shards", {}))
    return metrics


def stop_record(state: State, cfg: TrainConfig) -> dict:
    """Why the run stopped, where, its best validation's step (None if none was counted), the rule and the
    steps [start, end) over which the learning rate fell to 0."""
    rule = cfg.optim.stop.describe(cfg.log.eval_every, cfg.log.eval_examples, cfg.loss.beta.beta,
                                   cfg.objective_settles)
    return {"reason": state.stop, "step": state.step, "best_step": state.convergence.best_step, "rule": rule,
            "lr_decay": list(decay_window(state, cfg))}


def run(cfg: TrainConfig, hooks: Hooks = NO_HOOKS) -> dict:
    """The whole job; the result holds the final validation's metrics, ``stop`` (``stop_record``), the
    training wall time, ``input_bytes_read``: each rank's bytes of shards and store parts read by its
    training stream (a resumed run's fast-forward included), and, if any sample was left out, ``skipped``
    and ``skipped_shards``: every rank's train and val streams'. With ``optim.starts`` > 1 and a cap above
    ``optim.start_steps`` the run goes on from its best start (``best_start``), and ``start`` says which.
    ``hooks``: faults a test injects."""
    ranks = Ranks(timeout_s=120.0, backend="nccl" if resolve_device(cfg.io.device).startswith("cuda") else "gloo")
    try:
        several = cfg.optim.starts > 1 and cfg.optim.steps > cfg.optim.start_steps
        start = best_start(cfg, ranks, hooks) if several else None
        result = run_one(replace(cfg, optim=replace(cfg.optim, seed=start["seed"])) if start else cfg, ranks, hooks)
        return result | ({"start": start} if start else {})
    finally:
        ranks.close()


def run_one(cfg: TrainConfig, ranks: Ranks, hooks: Hooks, pause_at: int | None = None) -> dict:
    """One initialisation trained (or resumed) in ``cfg.io.out`` to its stop, or to step ``pause_at``:
    ``run``'s result."""
    state = setup(cfg, ranks, hooks)  # refuses a bad config, checkpoint or store before the run directory exists
    state.pause_at = pause_at
    Path(cfg.io.out).mkdir(parents=True, exist_ok=True)
    if ranks.is_main:
        write_config(cfg)
    t0 = time.perf_counter()
    bytes_read = fit(state, cfg)
    wall = time.perf_counter() - t0
    metrics = validate_run(state, cfg)
    stop = stop_record(state, cfg)
    if ranks.is_main:
        append_metrics(cfg.io.out, {"stop": stop})
    skips = Skips()
    for shards in ranks.gather(state.skips.shards):  # the ranks read disjoint train shards
        skips.merge(shards)
    return {**metrics, "stop": stop, "train_wall_s": wall, "input_bytes_read": ranks.gather(bytes_read),
            **skips.to_json()}


# ---------------------------------------------------------------- starts


def best_start(cfg: TrainConfig, ranks: Ranks, hooks: Hooks) -> dict:
    """Train each of ``cfg.optim.starts`` initialisations in RUN/starts/seed-S/ for ``start_steps`` (resuming
    any begun), pick the one with the least validation NLL under each example's own latent value, and seed
    RUN with its checkpoint and metrics, so that ``run_one`` goes on from it. RUN/starts.json records the
    choice; a run that has one (a resumed job) goes on from the start it names."""
    out = Path(cfg.io.out)
    seeds = [cfg.optim.seed * cfg.optim.starts + i for i in range(cfg.optim.starts)]
    made = json.loads((out / "starts.json").read_text()) if (out / "starts.json").is_file() else None
    seeded = (committed_checkpoint(out) / "state.json").is_file()  # RUN holds a checkpoint: the starts are behind it
    if made is None or made["seeds"] != seeds or made["start_steps"] != cfg.optim.start_steps:
        if seeded:
            raise ValueError(f"{out} holds a run trained without these starts ({cfg.optim.starts} of "
                             f"{cfg.optim.start_steps} steps from seed {cfg.optim.seed}); use a new --out")
        val_nll = []
        for seed in seeds:
            # the whole run's config, paused: its validations and stop rule go as in a run from this seed
            start = replace(cfg, io=replace(cfg.io, out=str(out / "starts" / f"seed-{seed}")),
                            optim=replace(cfg.optim, seed=seed))
            val_nll.append(run_one(start, ranks, hooks, pause_at=cfg.optim.start_steps)["nll_token_mean"])
        made = {"seeds": seeds, "start_steps": cfg.optim.start_steps, "val_nll_token_mean": val_nll,
                "seed": seeds[int(np.argmin(val_nll))]}
        if ranks.is_main:
            (out / "starts.json").write_text(json.dumps(made, indent=1) + "\n")
    if ranks.is_main and not seeded:
        chosen = out / "starts" / f"seed-{made['seed']}"
        write_config(replace(cfg, optim=replace(cfg.optim, seed=made["seed"])))  # the start's but for io.out
        shutil.copyfile(chosen / "metrics.jsonl", out / "metrics.jsonl")
        shutil.rmtree(out / "checkpoint.copy", ignore_errors=True)
        shutil.copytree(committed_checkpoint(chosen), out / "checkpoint.copy")
        (out / "checkpoint.copy").rename(out / "checkpoint")  # last: a copy cut short is made again
    return ranks.broadcast(made)  # the other ranks wait for the copy
