"""TrainConfig: a CVAE train run's configuration, one frozen group per component.

``io`` (paths, loading, device), ``cvae`` (the model and its latent), ``loss`` (weighting,
where b comes from, beta, the anchor term), ``remedies`` (what makes a discrete latent
learnable from scratch), ``optim`` (steps, batch, AdamW, seed), ``log`` (metrics lines,
validations, checkpoints) and ``lora`` (adapters on a frozen backbone). Each group checks its own fields; TrainConfig checks what spans two.

The defaults are the recipe that keeps z from scratch with the decoder whole
(docs/results/from-scratch/): a 4-slot prefix (``CVAEConfig``), surprisal-share with beta 0.3
warmed up over 100 steps and the anchor term from the end of the warm-up (``LossConfig``), the
exact E-step of J with centred latent rows (``default_remedies``, discrete latent), lr 3e-4 falling
linearly to 0 over the run's last fifth (``OptimConfig.lr_decay``).
`tokweight train`, `demo` and `experiment` all build these dataclasses; none repeats a default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from tokweight.training.configs import (POLICIES, WEIGHTINGS, CVAEConfig, EStepConfig, LoRAConfig, WeightingParams,
                                       check_free_bits)
from tokweight.training.convergence import StopRule
from tokweight.training.schedules import BetaSchedule


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
    device: str = "auto"
    """torch device of the model: "auto" (CUDA when present, else CPU), "cpu", "cuda", "cuda:N"; "cuda"
    under torchrun is cuda:LOCAL_RANK on each rank."""
    dtype: str = "float32"
    """The training forward's precision: "float32", or "bfloat16" autocast (parameters, optimizer state and
    the head's log-softmax stay float32; for large backbones on a GPU)."""
    grad_checkpointing: bool = False
    """Recompute the backbone's activations in the backward instead of keeping them: less memory, about one
    more forward of time (a Hugging Face backbone then runs the K + 1 passes whole, without the shared prefix)."""
    on_bad_sample: str = "error"
    """A bad sample the store does not already record as skipped: "error" (named by key and shard) or
    "skip" (counted by reason). What extraction skipped is skipped whatever this says."""

    def __post_init__(self):
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        if self.on_bad_sample not in ("error", "skip"):
            raise ValueError(f"on_bad_sample must be 'error' or 'skip', got {self.on_bad_sample!r}")
        if self.lanes is not None and self.lanes < 1:
            raise ValueError(f"lanes must be >= 1 (or None: one per rank), got {self.lanes}")
        if min(self.num_workers, self.shuffle_buffer) < 0:
            raise ValueError("num_workers and shuffle_buffer must be >= 0")

    @property
    def baseline_source(self) -> str:
        """The checkpoint b comes from (and the store was extracted with)."""
        return self.baseline_checkpoint or self.checkpoint


@dataclass(frozen=True)
class LossConfig:
    """The objective: how tokens are weighted, where b comes from, the KL's weight and floor."""

    weighting: str = "surprisal-share"
    """Reconstruction weighting, one of losses.WEIGHTINGS."""
    token_weighted_reconstruction_weight: float = 1.0
    """lambda: (1 - lambda) * uniform + lambda * weighting."""
    eps: float = 1e-6
    """Weight-sum epsilon and degenerate threshold on sum_t b_t (nats)."""
    eps_inv: float = 1e-2
    """inverse-surprisal's floor under b (nats)."""
    policy: str = "precomputed"
    """Where b comes from: precomputed (store), frozen (extra pass), dynamic (current backbone)."""
    beta: BetaSchedule = field(default_factory=BetaSchedule)
    """The KL weight over training."""
    free_bits: float = 0.0
    """KL floor lambda in nats (0: off); refused at >= log K for a discrete latent."""
    anchor_weight: float = 1.0
    """Weight of the anchor term E_q[mean_t relu(l_t(z) - b_t - anchor_margin)] (losses.anchor_penalty),
    q detached: keeps the tokens surprisal-share hardly weighs (b_t near 0) from rising above the base
    model, which they did without it (decoder 0.86 nats per token against the base's 0.19 on one seed of
    h3-n5); 0: off."""
    anchor_margin: float = 0.05
    """Nats a token may rise above the base model's b_t before the anchor term acts."""
    anchor_start_step: int | None = None
    """Steps before the anchor term acts; None: the beta warm-up's. From scratch it must wait until z is
    found: from step 0 its pull back to the base also removes the asymmetry at t0 that the E-step
    amplifies (h0-n16, beta 1: 2 of 3 seeds lost z)."""

    def __post_init__(self):
        if min(self.anchor_weight, self.anchor_margin, self.anchor_start_step or 0) < 0:
            raise ValueError("anchor_weight, anchor_margin and anchor_start_step must be >= 0")
        if isinstance(self.beta, dict):
            object.__setattr__(self, "beta", BetaSchedule(**self.beta))
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {sorted(WEIGHTINGS)}, got {self.weighting!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not 0 <= self.token_weighted_reconstruction_weight <= 1:
            raise ValueError("token_weighted_reconstruction_weight must be in [0, 1]")
        WeightingParams(self.eps, self.eps_inv)  # validates both

    @property
    def needs_store(self) -> bool:
        return self.policy == "precomputed" or self.weighting == "distribution-rescale"

    @property
    def anchor_start(self) -> int:
        """The first step (0-based) at which the anchor term acts."""
        return self.beta.warmup_steps if self.anchor_start_step is None else self.anchor_start_step

    def anchor_weight_at(self, step: int) -> float:
        """The anchor term's weight at ``step`` (0-based): 0 before its start step."""
        return self.anchor_weight if step >= self.anchor_start else 0.0


@dataclass(frozen=True)
class RemedyConfig:
    """Remedies against a discrete latent's collapse (``estep.py``, docs/latent-learnability.md). The
    dataclass's own defaults are "no remedy"; a run's default is ``default_remedies(latent)``."""

    estep: EStepConfig = field(default_factory=EStepConfig)
    """EM-style E-step from the decoder's own passes: a discrete latent's K values, a continuous one's draws
    (``estep.py``)."""
    latent_embedding_norm: float = 0.0
    """> 0: re-initialise the K latent token embeddings as orthogonal vectors of this norm before
    training (``cvae.spread_latent_embeddings``); 0 keeps the checkpoint's (nearly parallel) rows. A
    continuous z's slot projection starts at the mean latent row, offset by about this norm
    (``Conditioning.init_slots``); 0 keeps GPT-2's 0.02 init, near-zero slots. In units of the
    checkpoint's token-row spread (``cvae.token_row_spread``: the RMS distance of its rows from their
    mean), so that one value means the same input perturbation on any backbone."""
    latent_embedding_center: bool = False
    """With latent_embedding_norm: offset the orthogonal rows from the checkpoint's mean latent row
    (kept out of their span) instead of replacing the rows. The base model has learnt to read that
    mean row as "a z, ignore it": the decoder starts intact (docs/latent-learnability.md)."""

    def __post_init__(self):
        if isinstance(self.estep, dict):
            object.__setattr__(self, "estep", EStepConfig(**self.estep))
        if self.latent_embedding_norm < 0:
            raise ValueError("latent_embedding_norm must be >= 0")
        if self.latent_embedding_center and not self.latent_embedding_norm > 0:
            raise ValueError("latent_embedding_center needs latent_embedding_norm > 0 (the offset from the mean row)")

    def check_latent(self, latent: str, samples: int) -> None:
        """Refuse what a continuous latent's E-step cannot do: it weighs draws of z, not values that mean
        strategies (no label mode, no labelled examples), nor values a batch can be balanced over (no Sinkhorn), and its
        importance weights need the prior the model has, and more than one draw to choose among."""
        estep = self.estep
        if latent == "discrete" or estep.mode == "off":
            return
        if estep.mode == "label" or estep.labelled or estep.balance_iters or estep.prior != "learned":
            raise ValueError("a continuous latent's E-step weighs its draws of z: it takes mode soft or hard with "
                             f"prior 'learned', balance_iters 0 and labelled 0, not mode {estep.mode!r}, prior "
                             f"{estep.prior!r}, balance_iters {estep.balance_iters}, labelled {estep.labelled}")
        if samples < 2:
            raise ValueError(f"a continuous latent's E-step chooses among its draws: set samples >= 2, not {samples}")


@dataclass(frozen=True)
class OptimConfig:
    """How long and how the run optimises, and its seed."""

    steps: int = 6000
    """The cap on optimizer steps (global: every rank takes them all); the run stops earlier once ``stop``
    says it converged. On the small synthetic preset (K = 4, batch 32) the default rule stopped seeds 0
    and 1 at steps 4100 and 3950: the cap leaves half as much again."""
    batch_size: int = 32
    """Examples per step per rank."""
    lr: float = 3e-4
    """AdamW learning rate until ``lr_decay``'s fall. At 1e-3 the first steps under surprisal-share took a
    decoder from 0.07 to 1.3 nats per token; at 1e-4 z was only partly found in 200 steps."""
    lr_decay: float = 0.2
    """Fraction of the run over which the learning rate falls linearly to 0 at its end
    (``schedules.lr_decay_window``): the cap's last steps, or, once the stop rule says the run converged, as
    many steps more (0: a constant rate, and a run stops where it converges). At a constant rate the posterior
    stays soft: over 12 K = 4 runs of 600 steps the last 120 falling raised I(z; strategy) on 11 (+0.015 to
    +0.093; near-perfect codes 1.182-1.273 -> 1.259-1.291 of log 4 = 1.386) and brought every decoder's NLL to
    0.40-0.67 of its constant-rate twin's (docs/results.md, "A learning rate that settles at the end")."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0: off)."""
    seed: int = 0
    """Seeds the heads, the data order and the continuous latent's noise."""
    stop: StopRule = field(default_factory=StopRule)
    """When validation says the run converged (``convergence.py``); read at each periodic validation."""
    starts: int | None = None
    """Initialisations trained ``start_steps`` each (start i of seed s has seed s * starts + i), of which the one
    whose decoder reconstructs validation best goes on to ``steps`` (``train.best_start``); None:
    ``default_starts`` of the latent."""
    start_steps: int = 400
    """Steps each start trains before they are compared; a run capped at no more has one start."""

    def __post_init__(self):
        if isinstance(self.stop, dict):
            object.__setattr__(self, "stop", StopRule(**self.stop))
        if min(self.steps, self.batch_size, self.start_steps) < 1 or (self.starts is not None and self.starts < 1):
            raise ValueError("steps, batch_size, starts and start_steps must be >= 1")
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

    def __post_init__(self):
        for name in ("log_every", "ckpt_every", "eval_batch_size", "eval_examples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if min(self.grad_diag_every, self.eval_every) < 0:
            raise ValueError("grad_diag_every and eval_every must be >= 0")


GROUPS = {"io": IOConfig, "cvae": CVAEConfig, "loss": LossConfig, "remedies": RemedyConfig, "optim": OptimConfig,
          "log": LogConfig, "lora": LoRAConfig}


def default_remedies(latent: str) -> RemedyConfig:
    """The remedies a run gets unless it names its own: for a discrete latent, the soft E-step at the step's
    beta with a uniform prior inside it (q* = softmax(-R(k) / beta); the learned p(k|x) there feeds a value's
    falling usage back into its share of the examples: at K = 8, values whose decoder copies still had the
    least R on 2.5-8.4% of the examples fell to usage 0.001-0.014, and without it every value stays in use and
    I(z; strategy) is 0.816 against 0.744, at K = 4 0.884 against 0.793 over 6 cells, at K = 2 the same;
    docs/results.md, "The learned prior inside the E-step"), not balanced over the batch (a balance gives each
    value 1/K of every batch, which a strategy code has only when the strategies are equally frequent; with
    copy 0.8 and rotate-left 0.2 it left I(z; strategy) at 0.10 of 0.50 nats, and 0.49 without it, 3 of 3
    seeds; docs/results.md, "Strategies of unequal frequency"), and latent rows
    centred on the checkpoint's mean latent row, offset by half the token-row spread (distinct, yet read by
    the base as "a z": 4 slots of them cost the h0-n16 decoder 0.33-0.41 nats at step 0, where offsets of 0.92
    of the spread cost 4.3-4.5, and z was kept alike on 3 of 3 seeds; scripts/demo_variants.py --norms). The
    continuous latent: its slots spread from the mean latent row by one token-row spread (Conditioning.init_slots),
    and the hard E-step over its draws (each example's draw of least R / beta - log p / q; no balancing): with 4
    draws of a 2-dimensional z the soft one left the decoder ignoring z (h0-n16, 300 steps: MI estimate 0.22),
    the hard one kept it (0.68; soft needed 8 draws)."""
    if latent != "discrete":
        return RemedyConfig(estep=EStepConfig(mode="hard", follow_beta=True, prior="learned"),
                            latent_embedding_norm=1.0, latent_embedding_center=True)
    return RemedyConfig(estep=EStepConfig(mode="soft", follow_beta=True, prior="uniform"),
                        latent_embedding_norm=0.5, latent_embedding_center=True)


def default_starts(latent: str) -> int:
    """Starts a run gets unless it names its own. Three for a discrete latent: its values settle on a code
    within a few hundred steps and keep it, and a code that merges strategies reconstructs worse (K = 4, 12
    starts in 4 runs: the chosen start was the best strategy code of its three on 3 and within 0.02 nats of
    it on the fourth, I(z; strategy) 1.004 against 0.834 for one start). One for a continuous latent, whose
    merged code reconstructs better: a 2-dimensional z that gives sort and sort-desc one region, the decoder
    choosing between them per input, has a narrower posterior (sigma along its first dimension 0.13-0.16
    against a code's 0.38-0.46), and at K = 4 the least validation NLL at step 400 chose such a start in the 2
    of 3 runs that had one (0.148 and 0.157 against 0.169-0.229; k-means NMI 0.74 at the end, against 0.97
    for single starts of seeds 0-2; docs/results.md, "The continuous latent under the settling learning
    rate")."""
    return 3 if latent == "discrete" else 1


@dataclass(frozen=True)
class TrainConfig:
    io: IOConfig
    """Paths, loading and device."""
    cvae: CVAEConfig = field(default_factory=CVAEConfig)
    """Latent, z pathway and slots, posterior encoder."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Weighting, b's policy, beta schedule and free bits."""
    remedies: RemedyConfig | None = None
    """E-step and latent embedding init; None: ``default_remedies`` of the latent."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Steps, batch size, AdamW, seed."""
    log: LogConfig = field(default_factory=LogConfig)
    """Metrics lines, diagnostics, validations and checkpoints."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters on a frozen backbone; rank 0 (the default): every parameter trains."""

    def __post_init__(self):
        for name, group in GROUPS.items():  # from_json hands the groups over as dicts
            if isinstance(getattr(self, name), dict):
                object.__setattr__(self, name, group(**getattr(self, name)))
        if self.remedies is None:
            object.__setattr__(self, "remedies", default_remedies(self.cvae.latent))
        if self.optim.starts is None:
            object.__setattr__(self, "optim", replace(self.optim, starts=default_starts(self.cvae.latent)))
        self.remedies.check_latent(self.cvae.latent, self.cvae.samples)
        if self.io.store is None and self.loss.needs_store:
            raise ValueError(f"policy {self.loss.policy!r} with weighting {self.loss.weighting!r} needs --store")
        check_free_bits(self.loss.free_bits, self.cvae.latent, self.cvae.k)

    @property
    def objective_settles(self) -> int:
        """The step count from which the objective stops changing: beta's warm-up over, the anchor term on
        (when it ever is), an E-step warm start (``until_step``) over. The stop rule counts validations
        from there."""
        anchor = self.loss.anchor_start if self.loss.anchor_weight > 0 else 0
        estep = self.remedies.estep.until_step if self.remedies.estep.mode != "off" else 0
        return max(self.loss.beta.warmup_steps, anchor, estep)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> TrainConfig:
        """A config.json (``to_json``); a group or field this version does not have is refused by name."""
        unknown = set(obj) - {f.name for f in fields(cls)}
        for name, group in GROUPS.items():
            unknown |= {f"{name}.{k}" for k in set(obj.get(name) or {}) - {f.name for f in fields(group)}}
        if unknown:
            raise ValueError(f"config fields {sorted(unknown)} belong to no TrainConfig group")
        return cls(**obj)
