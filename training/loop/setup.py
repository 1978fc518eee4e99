"""``train``'s set-up: the run's live objects (``setup`` -> ``state.State``) from its configuration: the checkpoints
(the backbone to train and the base whose b the store holds), the CVAE built on the backbone (latent rows, LoRA
adapters, frozen weights in the forward's dtype), the store and the training stream, the memory and query
pathways' projections at their start scale (``init_memory``), the wrapped engine (DDP or FSDP2), AdamW, and what a
resumed run restores (model, optimizer, every rank's RNG, the stop rule's state). The loop over these objects is
``train.py``.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from tokweight.pipeline.models.backbone import load_backbone, store_template
from tokweight.pipeline.data.labels import load_labels
from tokweight.pipeline.ranks import Ranks
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.training.objective.baselines import AdaptersOff, Frozen, make_baseline
from tokweight.training.objective.clusters import CLUSTER_LINES, Agreement, Clusters
from tokweight.training.objective.label_values import LabelValues
from tokweight.training.cvae.conditioning import token_key_values
from tokweight.training.config.components import POLICIES, WEIGHTINGS, CVAEConfig, WeightingParams
from tokweight.training.loop.convergence import Convergence
from tokweight.training.cvae.model import (CVAE, add_latent_tokens, build_cvae, latent_tokens_needed,
                                     spread_latent_embeddings, token_row_spread)
from tokweight.training.loop.batches import StreamSpec, TrainBatch
from tokweight.training.loop.join import StoreRef, extract_command, shards_without_rows
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.loop.engine import broadcast_module, build_device, is_sharded, load_optimizer_state, wrap
from tokweight.training.objective.global_batch import GlobalBatch
from tokweight.training.cvae.lora import attach as attach_lora, latent_row_ids, require_peft
from tokweight.training.loop.precision import autocast, forward_dtype, hold_frozen
from tokweight.training.loop.run_dir import resume
from tokweight.training.objective.schedules import Schedule
from tokweight.training.loop.state import Progress, State, set_rng_states
from tokweight.training.loop.step import build_optimizer
from tokweight.training.loop.stream import TrainStream, first_lines
from tokweight.training.loop.train_base import memorised_line
from tokweight.training.config.train import IOConfig, TrainConfig



def data_seed(seed: int) -> int:
    """The stream's seed, the same for a run and its resumes: a function of (seed, 0), the 0 a fixed part of the
    sequence that every run's data is drawn from."""
    return int(np.random.SeedSequence([seed, 0]).generate_state(1)[0])


def setup(cfg: TrainConfig, ranks: Ranks, continue_from: Path | None = None, announce: bool = True,
          fitted: Clusters | None = None) -> State:
    """The run's live objects, resumed from RUN's checkpoint where it has one, else (``continue_from``) from the
    checkpoint of the start it continues. ``announce``: rank 0 prints what trains and, where the store shows one, that
    the checkpoint has learnt the training lines (once per job: its first start, or its one run). ``fitted``: the
    centres an earlier start of the same run fitted (the same init checkpoint and lines give the same ones), used
    instead of fitting them again.

    Under FSDP only rank 0 reads the checkpoints' weights and builds the whole model (on the CPU); every other rank
    builds its shape on the meta device and receives its shard from rank 0 (``engine.fully_shard_cvae``), so no
    other host ever holds the model."""
    if cfg.lora.rank:
        require_peft()  # before any checkpoint is read
    torch.manual_seed(cfg.optim.seed)
    device = ranks.device(cfg.io.device)
    sharded = is_sharded(cfg.io.shard, ranks.world)
    whole = ranks.is_main or not sharded  # this rank holds the model's weights before it is sharded
    init, base = load_checkpoints(cfg.io, weights=whole)
    if sharded:  # a rank that read no weights has hashed none
        init.fingerprint, base.fingerprint = ranks.broadcast((init.fingerprint, base.fingerprint))
    lower = forward_dtype(cfg.io.dtype, device)
    home = build_device(cfg.io.shard, ranks.world, device)  # where the whole model is built (the CPU under FSDP)
    model, vocab, baseline = build_model(cfg, init, base, (home, device), lower, whole)
    store, dataset_mean_b, split_b = open_store(cfg, init.vocab, base.fingerprint)
    policy = POLICIES[cfg.loss.policy]
    spec = StreamSpec(urls=split_urls(cfg.io.data, "train"), vocab=vocab, slots=cfg.cvae.slots,
                      block_size=init.model.cfg.block_size, batch_size=cfg.optim.batch_size,
                      store=store if policy.needs_store else None,
                      seed=data_seed(cfg.optim.seed), shuffle_buffer=cfg.io.shuffle_buffer,
                      length_buckets=cfg.io.length_buckets, length_groups=cfg.io.groups_on(device.type, sharded),
                      lanes=cfg.io.lanes or ranks.world, root=cfg.io.data, on_bad_sample=cfg.io.on_bad_sample)
    global_batch = GlobalBatch(ranks.rank, ranks.world)
    with autocast(cfg.io.dtype, device):  # before resume too
        init_memory(model, spec, global_batch, device, cfg.optim.seed, sharded)
    if ranks.is_main and announce:
        for line in (trainable_line(model), split_b and memorised_line(split_b["train"], split_b["val"])):
            if line:
                print(line, file=sys.stderr, flush=True)
    meta = {"cvae": cfg.cvae.to_json(), "init_fingerprint": init.fingerprint, "baseline_fingerprint": base.fingerprint,
            "model_config": init.model.cfg.to_json(), "dataset_mean_b": dataset_mean_b,
            "backbone": init.meta.get("kind", "tokweight"), "template": init.vocab.template.to_json()}
    saved = resume(cfg, model, init.fingerprint, ranks.rank, ranks.world, continue_from, load=whole) or {}
    engine = wrap(model, cfg.io.shard, ranks, device, lower)  # DDP around the model, or the model sharded in place
    clusters = cluster_centres(cfg, model, spec, ranks, device, sharded, saved, fitted)
    if sharded and isinstance(baseline, Frozen):
        broadcast_module(baseline.model)
    opt = build_optimizer([p for p in model.parameters() if p.requires_grad], cfg.optim.lr)
    if saved:
        load_optimizer_state(model, opt, saved.get("optimizer", {}), sharded)
    seed_dropout(cfg.optim.seed, ranks.rank)
    set_rng_states(saved.get("rng", {}), device)  # a resumed run's, which replace those
    progress = Progress(saved.get("step", 0), Convergence(**saved.get("convergence", {})), saved.get("converged_at"))
    names = label_names(cfg)
    return State(model, engine, opt, baseline, WeightingParams(cfg.loss.eps, cfg.loss.eps_inv, dataset_mean_b), spec,
                 global_batch, ranks, device, meta, Schedule.of(cfg), names, progress, sharded,
                 clusters, agreement(cfg, device, saved), label_values(cfg, names, device, saved))


def build_model(cfg: TrainConfig, init, base, devices: tuple[torch.device, torch.device], lower: torch.dtype,
                whole: bool) -> tuple[CVAE, Vocab, object]:
    """(the CVAE to train, its vocabulary, the step's baseline) from the loaded checkpoints: with its latent rows
    spread, a LoRA run's frozen weights in the forward's dtype ``lower``, on ``devices``' first (home: where the whole
    model is built, the CPU under FSDP); ``whole`` False: its shape alone, on the meta device. A frozen baseline copy
    goes to ``devices``' second, the rank's own."""
    home, device = devices
    policy = POLICIES[cfg.loss.policy]
    base_vocab_size = base.model.cfg.vocab_size  # before the latent tokens a run appends (base may be init)
    adapters_on_base = cfg.lora.rank > 0 and base is init and policy.frozen_model
    # the frozen copy, taken before any re-init; with adapters on the baseline checkpoint, that checkpoint is
    # the trained backbone with its adapters off (AdaptersOff, below)
    baseline = None if adapters_on_base else make_baseline(cfg.loss.policy, base.model if policy.frozen_model
                                                           else None, device, lower)
    vocab = add_latent_tokens(init.model, init.vocab, latent_tokens_needed(cfg.cvae))  # the trainable copy's
    with nullcontext() if whole else torch.device("meta"):
        model = build_cvae(init.model.train(), vocab, cfg.cvae)
        adapters = (attach_lora(model.backbone, cfg.lora.rank, latent_row_ids(vocab, cfg.cvae), cfg.optim.seed)
                    if cfg.lora.rank else None)
    if adapters_on_base:
        baseline = AdaptersOff(model.backbone, adapters, base_vocab_size)
    if cfg.io.grad_checkpointing:
        model.backbone.enable_checkpointing()
    model.merge_passes = cfg.io.merges_on(device.type)
    if whole:
        spread_latents(model, vocab, cfg.cvae, cfg.optim.seed)  # before resume: a resumed run loads its trained rows
    hold_frozen(model, lower)  # a LoRA run's frozen backbone in the forward's dtype, before it reaches the device
    return (model.to(home) if whole else model), vocab, baseline


def seed_dropout(seed: int, rank: int) -> None:
    """Each rank its own dropout masks, as each row of one process's batch has its own: dropout is the one draw of
    a step from torch's global RNG, which every rank seeded alike to build the same model. Rank r > 0 reseeds it
    from (seed, r); rank 0 keeps the run's stream, so that a job of one draws what it drew before."""
    if rank:
        torch.manual_seed(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]))


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


def load_checkpoints(io: IOConfig, weights: bool = True):
    """(init checkpoint, baseline checkpoint): one object when they are the same directory; both read in the
    template the store was extracted with; ``weights`` False: their shapes alone, on the meta device."""
    template = store_template(io.store, io.baseline_source)
    init = load_backbone(io.checkpoint, template=template, weights=weights)
    if Path(io.baseline_source).resolve() == Path(io.checkpoint).resolve():
        return init, init
    base = load_backbone(io.baseline_source, template=template, weights=weights)
    if list(base.vocab.tokens) != list(init.vocab.tokens):
        raise ValueError(f"baseline checkpoint {base.path} and init checkpoint {init.path} have different vocabularies")
    return init, base


def spread_latents(model: CVAE, vocab: Vocab, cvae: CVAEConfig, seed: int) -> None:
    """The latent rows (discrete), or the slots a continuous z is projected into, spread from the checkpoint's
    mean latent row (``CVAEConfig.latent_init_norm``, in units of the checkpoint's token-row spread; a
    continuous z's: the mean of every latent token's row, the tokens its base saw in the slots)."""
    if not cvae.latent_init_norm > 0:
        return
    generator = torch.Generator().manual_seed(seed)
    weight = model.backbone.wte.weight.detach()
    ids = torch.tensor([vocab.latent_id(k) for k in range(vocab.k_max)], device=weight.device)
    norm = cvae.latent_init_norm * token_row_spread(weight, ids)
    if model.conditioning.slot_proj is not None:
        model.conditioning.init_slots(weight[ids].mean(0), norm, generator)
    elif model.latent.kind == "discrete":  # a continuous z through the memory writes no slot: nothing to spread
        spread_latent_embeddings(model.backbone, model.latent.latent_ids.tolist(), norm, generator,
                                 center=cvae.latent_init_center)


def init_memory(model: CVAE, spec: StreamSpec, ranks: GlobalBatch, device: torch.device, seed: int,
                sharded: bool) -> None:
    """The memory (or query) pathway's projection at the scale of the backbone's keys and values, measured on the z-free
    positions (the tokens before <z>) of the first global batch (``Conditioning.init_memory``): each rank measures
    its own rows where the model is, and the ranks pool their measurements (on ``device``, where their collectives
    run), so that every rank starts from the one-process measurement. Under FSDP (``sharded``) rank 0, which alone
    holds the weights, measures every rank's rows and pools them; the others receive the projection with its shard."""
    if model.conditioning.memory_proj is None and model.conditioning.query_proj is None:
        return
    if sharded and ranks.rank > 0:
        return
    streams = range(ranks.world) if sharded else (ranks.rank,)  # the streams this rank measures
    count, mean, spread = (torch.cat(t) for t in zip(*(measure_key_values(model, TrainStream(spec, rank, ranks.world))
                                                      for rank in streams)))
    if ranks.world > 1 and not sharded:
        count, mean, spread = (ranks.gather(t.to(device)) for t in (count, mean, spread))
    if len(count) > 1:
        home = next(model.parameters()).device
        mean, spread = (t.to(home) for t in pooled_key_values(count, mean, spread))
    else:
        mean, spread = mean[0], spread[0]
    model.conditioning.init_memory(mean, spread, torch.Generator().manual_seed(seed))


def cluster_centres(cfg: TrainConfig, model: CVAE, spec: StreamSpec, ranks: Ranks, device: torch.device,
                    sharded: bool, saved: dict, fitted: Clusters | None = None) -> Clusters | None:
    """The base's grouping of the lines that the E-step weighs in (``estep.cluster_weight``; None where it is 0), on
    ``device``: a resumed run's (or the start's it goes on from), as its checkpoint keeps them; else k-means of the
    model's z-free pooled states on the train split's first ``CLUSTER_LINES`` lines (``first_pooled``), after the
    model is wrapped and before any step, so from the init checkpoint. Rank 0 fits; every rank gets its centres."""
    if not cfg.estep.cluster_weight:
        return None
    if saved:
        if "clusters" not in saved:
            raise ValueError(f"{cfg.io.out}: the checkpoint holds no cluster centres (written before they were kept); "
                             "estep cluster_weight needs them to resume: train into a new --out")
        return Clusters.from_json(saved["clusters"]).to(device)
    if fitted is not None:
        return fitted
    pooled = first_pooled(model, spec, CLUSTER_LINES, ranks, device, cfg.io.dtype, sharded)
    return ranks.broadcast(Clusters.fit(pooled, cfg.cvae.k) if ranks.is_main else None).to(device)


def first_pooled(model: CVAE, spec: StreamSpec, lines: int, ranks: Ranks, device: torch.device, dtype: str,
                 sharded: bool) -> torch.Tensor | None:
    """(N, d) on the CPU, on rank 0 (None on the others): ``pooled_states`` of the first ``lines`` lines of
    ``spec``'s shards in order, their batches dealt out over the ranks (batch i to rank i mod world) and gathered
    back in order, so N ranks compute what one process does, each a world-th of it. Under FSDP every rank runs as
    many forwards (a collective each): a rank with a batch fewer repeats the first and drops it."""
    batches = list(first_lines(spec, lines))
    mine = batches[ranks.rank::ranks.world]
    rounds = -(-len(batches) // ranks.world) if sharded else len(mine)
    states = pooled_states(model, mine + batches[:1] * (rounds - len(mine)), device, dtype)[: len(mine)]
    if sharded:
        model.reshard()  # FSDP keeps the root's weights gathered after a forward without a backward
    parts = ranks.gather([s.cpu() for s in states])
    if not ranks.is_main:
        return None
    return torch.cat([parts[i % ranks.world][i // ranks.world] for i in range(len(batches))]) if batches else \
        torch.empty(0, 0)


def agreement(cfg: TrainConfig, device: torch.device, saved: dict) -> Agreement | None:
    """The running table of clusters against the decoders' choices (``estep.cluster_map`` "agreement" or
    "matched"; None under "identity"): independent for a fresh run, the checkpoint's for a resumed one."""
    if not cfg.estep.cluster_weight or cfg.estep.cluster_map == "identity":
        return None
    return Agreement.start(cfg.cvae.k, device, cfg.estep.cluster_map, saved.get("agreement"))


def label_values(cfg: TrainConfig, names: tuple[str, ...], device: torch.device, saved: dict) -> LabelValues | None:
    """The running table of labels against the decoders' choices (``estep.labelled`` with ``estep.label_map``
    "matched"; None otherwise, and in mode "label", whose every line is labelled from step 0): independent for a
    fresh run, the checkpoint's for a resumed one."""
    if not (cfg.estep.labelled and names) or cfg.estep.mode == "label" or cfg.estep.label_map != "matched":
        return None
    return LabelValues.start(len(names), cfg.cvae.k, device, saved.get("label_values"))


@torch.no_grad()
def pooled_states(model: CVAE, batches: list[TrainBatch], device: torch.device, dtype: str) -> list[torch.Tensor]:
    """The posterior head's input (``CVAE.posterior_input``), (B_i, d) for each of ``batches``, by the model's z-free
    forward on ``device`` in the run's ``dtype`` (under FSDP a collective); no dropout draw."""
    model.backbone.eval()
    with autocast(dtype, device):
        pooled = [model(batch.to(device), free_only=True).pooled for batch in batches]
    model.backbone.train()
    return pooled


def measure_key_values(model: CVAE, stream: TrainStream) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``token_key_values`` over the z-free positions of ``stream``'s first batch, on the model's device: (1,)
    positions, (1, layers, 2, H, dh) mean, (1, layers, 2, H) spread (one part of ``pooled_key_values``)."""
    home = next(model.parameters()).device
    batch = next(stream.batches(0)).to(home)
    model.backbone.eval()  # no dropout draw: the run's random stream stays as without the measurement
    with torch.no_grad():
        mean, spread = token_key_values(model.backbone, batch.zcond.input_ids[:, : batch.widths.prefix],
                                        batch.z_pos)
    model.backbone.train()
    return batch.z_pos.sum().to(mean.dtype)[None], mean[None], spread[None]


def pooled_key_values(counts: torch.Tensor, means: torch.Tensor, spreads: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Parts' ``token_key_values`` -> those of their union: ``counts`` (parts,) positions, ``means``
    (parts, layers, 2, H, dh), ``spreads`` (parts, layers, 2, H). The mean weighted by positions; the spread by the
    law of total variance, E||x - m||^2 = sum_r w_r (spread_r^2 + ||m_r - m||^2)."""
    w = counts / counts.sum()
    mean = torch.einsum("r,r...->...", w, means)
    variance = torch.einsum("r,r...->...", w, spreads.pow(2) + (means - mean).norm(dim=-1).pow(2))
    return mean, variance.sqrt()


def open_store(cfg: TrainConfig, vocab: Vocab, fingerprint: str
               ) -> tuple[StoreRef | None, float | None, dict[str, float] | None]:
    """(the store, the dataset's mean b for distribution-rescale, the mean b per token of the train and val
    splits where the store holds both); fails early on a wrong fingerprint, vocabulary, an incomplete store or
    one without rows for a shard the run reads."""
    if not cfg.io.store:
        return None, None, None
    store = StoreRef(cfg.io.store, fingerprint)
    view = store.open(vocab)
    urls, val_urls = split_urls(cfg.io.data, "train"), split_urls(cfg.io.data, "val")
    check_store_holds(cfg.io, cfg.loss.policy, view, urls + val_urls)
    split_b = None if shards_without_rows(view, urls + val_urls) else {
        "train": view.mean_example_mean_b(list(urls)), "val": view.mean_example_mean_b(list(val_urls))}
    dataset_mean_b = None
    if WEIGHTINGS[cfg.loss.weighting].needs_dataset_mean:  # the train split's mean, read once
        dataset_mean_b = split_b["train"] if split_b else float(view.mean_example_mean_b(list(urls)))
    return store, dataset_mean_b, split_b


def check_store_holds(io: IOConfig, policy: str, view, urls) -> None:
    """Before any step: every shard the run reads (train, and val for the validations) has stored rows."""
    missing = shards_without_rows(view, urls)
    if missing and POLICIES[policy].needs_store:
        command = extract_command(io.baseline_source, io.data, io.store)
        raise ValueError(f"{len(missing)} shards (first {missing[0]}) have no rows in store {io.store}; "
                         f"add them with: {command}")


def label_names(cfg: TrainConfig) -> tuple[str, ...]:
    """The dataset's strategies in its labels' order (an E-step that reads labels only; empty otherwise)."""
    estep = cfg.estep
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
