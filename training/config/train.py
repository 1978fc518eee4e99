"""TrainConfig: a CVAE train run's configuration, one frozen group per component.

``io`` (paths, loading, device), ``cvae`` (the model, its latent and how its latent rows start), ``loss``
(weighting, where b comes from, beta, the anchor term), ``estep`` (which examples each decoder copy learns
from), ``optim`` (steps, batch, AdamW, seed, starts), ``log`` (metrics lines, validations, checkpoints) and
``lora`` (adapters on a frozen backbone). Each group checks its own fields; TrainConfig checks what spans two
and resolves the defaults that depend on the latent, so a run's config.json holds what it ran with.

The dataclass defaults are the method as `tokweight train` runs it (``training/objective/loss.py``);
docs/results.md says what each was chosen from. Every command builds these dataclasses; none repeats a default.
What the objective does at each step is resolved from a TrainConfig by ``schedules.Schedule``; a run's
config.json, of this version or an older one, is read by ``config_migrations.train_config_from``. Plain data and
the standard library only (``tests/training/config/test_config_modules.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from tokweight.pipeline.models.dtypes import TRAIN_DTYPES
from tokweight.training.config.components import (POLICIES, WEIGHTINGS, CVAEConfig, EStepConfig, LoRAConfig, StopRule,
                                        WeightingParams, check_free_bits, check_report_to, parse_report_to)


GPU_LENGTH_GROUPS = 4
"""``IOConfig.length_groups`` on CUDA when unset (without FSDP)."""


def default_length_groups(device_type: str, sharded: bool = False) -> int:
    """``IOConfig.length_groups`` when unset, on a device of ``device_type`` ("cpu", "cuda", ...), the model
    ``sharded`` over ranks by FSDP or not."""
    return GPU_LENGTH_GROUPS if device_type == "cuda" and not sharded else 1


def default_merge_passes(device_type: str, grad_checkpointing: bool = False) -> bool:
    """``IOConfig.merge_passes`` when unset, on a device of ``device_type``: on CUDA without gradient checkpointing."""
    return device_type == "cuda" and not grad_checkpointing


SHARDS = ("ddp", "fsdp")
"""How several ranks share the model (``IOConfig.shard``, ``engine.py``)."""


@dataclass(frozen=True)
class IOConfig:
    """Where the run reads and writes, and how it loads its data."""

    checkpoint: str
    """The entangled checkpoint the CVAE is initialised from."""
    data: str
    """Dataset directory with train/ and val/ shards."""
    out: str
    """Run directory (config.json, metrics.jsonl, checkpoint/)."""
    store: str | None = None
    """Baseline store root; needed by policy 'precomputed' and weighting 'distribution-rescale'."""
    baseline_checkpoint: str | None = None
    """The checkpoint b was (or is) computed with; None: the init checkpoint."""
    lanes: int | None = None
    """Sample streams the global batch is drawn from, each over its own shards (shard i in lane
    i % lanes), seeded and shuffled on its own; rank r reads only its lanes. The data order depends
    on lanes, not on ranks or workers: N ranks equal one process with the same global batch and
    lanes. None: one lane per rank."""
    num_workers: int = 1
    """Loader worker processes (forkserver); 0 reads in the main process."""
    shuffle_buffer: int = 256
    """Examples in the seeded shuffle buffer (after the store join)."""
    length_buckets: int = 0
    """Length-bucketed training batches: each lane takes this many batches' examples at a time from its shuffle
    buffer, sorts them by length and hands them out a batch of similar lengths at a time, the batches in a seeded
    order, so that a step pads its passes less (``batches.bucketed``). 0: off, the default: where strategies write
    lines of different lengths, batches of one length are batches of few strategies, and the objective's
    batch-coupled terms (the E-step's balance, free bits' mean) read a batch as a sample of the task
    (``scripts/bench_padding.py``). For tasks whose strategies write lines of one length."""
    length_groups: int | None = None
    """A training batch's rows run through the model in up to this many groups of similar length, each padded to
    its own longest row (``batches.Groups``), the batch, its order and every term of the objective as they are:
    1 runs the batch whole, None is 4 on CUDA without FSDP and 1 elsewhere. The passes compute less padding, in
    more, smaller kernels. Not the default on the CPU, where a group's shorter padding would move float32 results
    by rounding (its numbers stay those of the batch run whole), nor under ``shard`` "fsdp", where every group's
    pass all-gathers each block's parameters again."""
    merge_passes: bool | None = None
    """The z-free pass and a discrete latent's K copies run as one forward of B (K + 1) rows, each z-free row padded
    to its copies' length (``CVAE.merge_passes``): one pass of larger kernels, and under ``shard`` "fsdp" fewer
    all-gathers of each block. Not with a continuous latent, whose copies are drawn from the posterior the
    z-free pass feeds, nor with the memory pathway, whose position a z-free row would see (there it changes
    nothing), nor in a forward without gradients (validation, eval). None: on CUDA without
    ``grad_checkpointing``. Not on the CPU, where the padded z-free rows would move float32 results by rounding (its
    numbers stay those of the separate passes), nor with checkpointing, whose backward recomputes a layer over all
    of the one pass's rows at once: a higher peak where memory is what checkpointing is for."""
    device: str = "auto"
    """torch device of the model: "auto" (CUDA when present, else CPU), "cpu", "cuda", "cuda:N"; "cuda"
    under torchrun is cuda:LOCAL_RANK on each rank."""
    dtype: str = "auto"
    """The forward's precision: "bfloat16" (autocast; the trained parameters, their gradients and AdamW's state stay
    float32, the frozen weights are held in bfloat16, the log-softmax and every loss run in float32), "float32", or
    "auto": bfloat16 on CUDA, float32 elsewhere (``training/loop/precision.py``)."""
    grad_checkpointing: bool = False
    """Recompute the backbone's activations in the backward instead of keeping them: less memory, about one
    more forward of time (a Hugging Face backbone then runs the K + 1 passes whole, without the shared prefix)."""
    on_bad_sample: str = "error"
    """A bad sample the store does not already record as skipped: "error" (named by key and shard) or
    "skip" (counted by reason). What extraction skipped is skipped whatever this says."""
    shard: str = "ddp"
    """How several ranks (torchrun) share the model (``engine.py``): "ddp", each rank holds all of it and the
    gradients are averaged (DistributedDataParallel); "fsdp", parameters, gradients and AdamW's state are
    sharded over the ranks per transformer block (FSDP2), for a backbone whose full fine-tune does not fit one
    GPU. A job of one process runs the model itself either way."""
    collective_timeout_s: float = 1800.0
    """Seconds a rank waits in a collective before the job is aborted. Rank 0 writes every checkpoint while the
    others wait at a barrier: the timeout must cover the longest write (a multi-GB model on a slow disk)."""

    def __post_init__(self):
        if self.dtype not in TRAIN_DTYPES:
            raise ValueError(f"dtype must be one of {TRAIN_DTYPES}, got {self.dtype!r}")
        if self.shard not in SHARDS:
            raise ValueError(f"shard must be 'ddp' or 'fsdp', got {self.shard!r}")
        if self.on_bad_sample not in ("error", "skip"):
            raise ValueError(f"on_bad_sample must be 'error' or 'skip', got {self.on_bad_sample!r}")
        if not self.collective_timeout_s > 0:
            raise ValueError(f"collective_timeout_s must be > 0, got {self.collective_timeout_s}")
        if self.lanes is not None and self.lanes < 1:
            raise ValueError(f"lanes must be >= 1 (or None: one per rank), got {self.lanes}")
        if min(self.num_workers, self.shuffle_buffer, self.length_buckets) < 0:
            raise ValueError("num_workers, shuffle_buffer and length_buckets must be >= 0")
        if self.length_groups is not None and self.length_groups < 1:
            raise ValueError(f"length_groups must be >= 1 (or None: the device's default), got {self.length_groups}")

    def groups_on(self, device_type: str, sharded: bool = False) -> int:
        """``length_groups`` with None resolved (``default_length_groups``)."""
        if self.length_groups is not None:
            return self.length_groups
        return default_length_groups(device_type, sharded)

    def merges_on(self, device_type: str) -> bool:
        """``merge_passes`` with None resolved (``default_merge_passes``)."""
        if self.merge_passes is not None:
            return self.merge_passes
        return default_merge_passes(device_type, self.grad_checkpointing)

    @property
    def baseline_source(self) -> str:
        """The checkpoint b comes from (and the store was extracted with)."""
        return self.baseline_checkpoint or self.checkpoint


@dataclass(frozen=True)
class LossConfig:
    """The objective: how tokens are weighted, where b comes from, the KL's weight and floor."""

    weighting: str = "surprisal-share"
    """Reconstruction weighting, one of components.WEIGHTINGS."""
    token_weighted_reconstruction_weight: float = 1.0
    """lambda: (1 - lambda) * uniform + lambda * weighting."""
    eps: float = 1e-6
    """Weight-sum epsilon and degenerate threshold on sum_t b_t (nats)."""
    eps_inv: float = 1e-2
    """inverse-surprisal's floor under b (nats)."""
    policy: str = "precomputed"
    """Where b comes from: precomputed (store), frozen (extra pass), dynamic (current backbone)."""
    beta: float = 0.3
    """The KL weight after the warm-up."""
    beta_warmup_steps: int = 100
    """Steps of beta's linear rise from 0 (0: beta from the first step). Under the E-step beta is its temperature
    too: at the full beta from step 0 it drowns the small differences z makes at first."""
    free_bits: float = 0.0
    """KL floor lambda in nats (0: off); refused at >= log K for a discrete latent."""
    anchor_weight: float = 1.0
    """Weight of the anchor term E_q[mean_t relu(l_t(z) - b_t - anchor_margin)] (losses.anchor_penalty),
    q detached: keeps the tokens surprisal-share hardly weighs (b_t near 0) from rising above the base
    model, which they do without it; 0: off."""
    anchor_margin: float = 0.05
    """Nats a token may rise above the base model's b_t before the anchor term acts."""
    anchor_start_step: int | None = None
    """Steps before the anchor term acts; None: the beta warm-up's. From scratch it must wait until z is
    found: from step 0 its pull back to the base also removes the asymmetry at t0 that the E-step
    amplifies."""

    def __post_init__(self):
        if min(self.anchor_weight, self.anchor_margin, self.anchor_start_step or 0) < 0:
            raise ValueError("anchor_weight, anchor_margin and anchor_start_step must be >= 0")
        if self.beta < 0 or self.beta_warmup_steps < 0:
            raise ValueError(f"need beta >= 0 and beta_warmup_steps >= 0, got {self.beta} and {self.beta_warmup_steps}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {sorted(WEIGHTINGS)}, got {self.weighting!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {self.policy!r}")
        if not 0 <= self.token_weighted_reconstruction_weight <= 1:
            raise ValueError("token_weighted_reconstruction_weight must be in [0, 1]")
        WeightingParams(self.eps, self.eps_inv)  # validates both

    @property
    def needs_store(self) -> bool:
        """Whether b or the weighting's constant comes from a store."""
        return POLICIES[self.policy].needs_store or WEIGHTINGS[self.weighting].needs_dataset_mean


@dataclass(frozen=True)
class OptimConfig:
    """How long and how the run optimises, and its seed."""

    steps: int = 6000
    """The cap on optimizer steps (global: every rank takes them all); the run stops earlier once ``stop``
    says it converged."""
    batch_size: int = 32
    """Examples per step per rank."""
    lr: float = 3e-4
    """AdamW learning rate until ``lr_decay``'s fall."""
    lr_decay: float = 0.2
    """Fraction of the run over which the learning rate falls linearly to 0 at its end
    (``schedules.lr_decay_window``): the cap's last steps, or, once the stop rule says the run converged, as
    many steps more (0: a constant rate, and a run stops where it converges). At a constant rate the posterior
    stays soft to the end."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0: off)."""
    seed: int = 0
    """Seeds the heads, the data order and the continuous latent's noise."""
    stop: StopRule = field(default_factory=StopRule)
    """When validation says the run converged (``convergence.py``); read at each periodic validation."""
    starts: int | None = None
    """Initialisations trained ``start_steps`` each (start i of seed s has seed s * starts + i), of which the one
    of least validation objective (E_q[R] + beta KL, ``starts.py``) goes on to ``steps`` (``train.run``); None: 3
    for a discrete latent, whose values settle on a code early and keep it (a code that merges strategies
    reconstructs worse); 1 for a continuous one, whose merged code reconstructs better, so the comparison would
    choose it."""
    start_steps: int = 200
    """Steps each start trains before they are compared; a run capped at no more has one start."""
    start_steps_max: int = 800
    """Where no start's code has formed after ``start_steps`` (exact MI below half of log K on the val split) but the
    best is rising (by the stop rule's min_delta_mi a round), every start trains ``start_steps`` more, until one has
    or they reach this (and below the cap): a comparison of codes not yet formed chooses at random. At
    ``start_steps``: one comparison, whatever the codes."""

    def __post_init__(self):
        if min(self.steps, self.batch_size, self.start_steps) < 1 or (self.starts is not None and self.starts < 1):
            raise ValueError("steps, batch_size, starts and start_steps must be >= 1")
        if self.start_steps_max < self.start_steps:
            raise ValueError(f"start_steps_max ({self.start_steps_max}) must be >= start_steps ({self.start_steps})")
        if not 0 <= self.lr_decay < 1:
            raise ValueError(f"lr_decay is a fraction of the run in [0, 1), got {self.lr_decay}")


@dataclass(frozen=True)
class LogConfig:
    """What the run reports and when: metrics lines, gradient diagnostics, validations, checkpoints."""

    log_every: int = 10
    """Steps between metrics.jsonl lines."""
    grad_diag_every: int = 50
    """Steps between posterior-gradient diagnostics (0: off)."""
    ckpt_every: int = 100
    """Steps between checkpoints (the last step always writes one)."""
    eval_batch_size: int = 128
    """Examples per validation batch."""
    eval_every: int = 50
    """Steps between validations on the first ``eval_examples`` val examples, logged to metrics.jsonl; the stop
    rule (``OptimConfig.stop``) reads them (0: off, and the run trains to its step cap)."""
    eval_examples: int = 256
    """Val examples of each periodic validation (rounded up to whole eval batches); the final one reads all."""
    report_to: tuple[str, ...] = ()
    """Trackers that rank 0 reports to besides metrics.jsonl, any of "tensorboard", "mlflow", "wandb" (a list, or one
    comma-separated text); each an optional extra, offline in the run directory (``training/loop/trackers.py``)."""

    def __post_init__(self):
        if not isinstance(self.report_to, tuple):  # from a file or a flag: a list, or comma-separated text
            object.__setattr__(self, "report_to", parse_report_to(self.report_to) if isinstance(self.report_to, str)
                               else tuple(self.report_to))
        check_report_to(self.report_to)
        for name in ("log_every", "ckpt_every", "eval_batch_size", "eval_examples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if min(self.grad_diag_every, self.eval_every) < 0:
            raise ValueError("grad_diag_every and eval_every must be >= 0")


GROUPS = {"io": IOConfig, "cvae": CVAEConfig, "loss": LossConfig, "estep": EStepConfig, "optim": OptimConfig,
          "log": LogConfig, "lora": LoRAConfig}


def harden_from(estep: EStepConfig, optim: OptimConfig, compared_at: int | None = None) -> int | None:
    """The first step at which the E-step's hardening acts (``EStepConfig.harden_from``), resolved here alone: the
    config's own; else where the run's code is chosen: the step its starts were compared at (``compared_at``: the
    run that goes on from the kept start, ``starts.continued``), or, in a run of one start, ``optim.start_steps_max``;
    None in a start of several, not yet compared (it never hardens)."""
    if estep.harden_from is not None:
        return estep.harden_from
    if compared_at is not None:
        return compared_at
    return optim.start_steps_max if optim.starts == 1 else None


def default_starts(latent: str) -> int:
    """Starts a run gets unless it names its own (``OptimConfig.starts``)."""
    return 3 if latent == "discrete" else 1


@dataclass(frozen=True)
class TrainConfig:
    io: IOConfig
    """Paths, loading and device."""
    cvae: CVAEConfig = field(default_factory=CVAEConfig)
    """Latent, z pathway and slots, posterior read, latent rows' start."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Weighting, b's policy, beta schedule, free bits, anchor term."""
    estep: EStepConfig = field(default_factory=EStepConfig)
    """The E-step over the decoder's copies (None fields: the latent's defaults)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Steps, batch size, AdamW, seed, starts."""
    log: LogConfig = field(default_factory=LogConfig)
    """Metrics lines, diagnostics, validations and checkpoints."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters on a frozen backbone; rank 0 (the default): every parameter trains."""

    def __post_init__(self):
        if self.optim.starts is None:
            object.__setattr__(self, "optim", replace(self.optim, starts=default_starts(self.cvae.latent)))
        estep = self.estep.resolved(self.cvae.latent, self.cvae.k, self.cvae.samples)
        object.__setattr__(self, "estep", replace(estep, harden_from=harden_from(estep, self.optim)))
        if self.io.store is None and self.loss.needs_store:
            raise ValueError(f"policy {self.loss.policy!r} with weighting {self.loss.weighting!r} needs --store")
        check_free_bits(self.loss.free_bits, self.cvae.latent, self.cvae.k)

    def to_json(self) -> dict:
        return asdict(self)


RESOLVED_FROM = {"cvae.cond": ("cvae.latent",), "cvae.slots": ("cvae.cond",), "cvae.samples": ("cvae.latent",),
                 "cvae.latent_init_norm": ("cvae.latent",),
                 "cvae.posterior_likelihood": ("cvae.latent",), "optim.starts": ("cvae.latent",),
                 "estep.mode": ("cvae.latent",), "estep.prior": ("cvae.latent",),
                 "estep.harden": ("estep.mode", "cvae.k"), "estep.cluster_weight": ("estep.mode", "cvae.latent"),
                 "estep.harden_from": ("optim.starts", "optim.seed", "optim.start_steps", "optim.start_steps_max")}
"""Fields whose default is resolved from other fields' values (None in the dataclass, filled in from them)."""


def with_resolved_anew(values: dict, config: dict) -> dict:
    """Dotted overrides ``values`` of the nested ``config``, plus None for every field resolved from one whose value
    they change (and from those, in turn) that they do not set themselves: a resolved config.json given ``--cond
    prefix`` gets the prefix's 4 slots, not the 1 the query's resolution wrote there."""
    def value(dotted: str):
        node = config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    out, changed = dict(values), {field for field, v in values.items() if v != value(field)}
    while True:
        anew = {f for f, sources in RESOLVED_FROM.items() if changed.intersection(sources) and f not in changed}
        if not anew:
            return out
        out |= {f: None for f in anew}
        changed |= anew
