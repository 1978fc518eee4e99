"""TrainConfig: a CVAE train run's configuration, one frozen group per component.

``io`` (paths, loading, device), ``cvae`` (the model and its latent), ``loss`` (weighting,
where b comes from, beta, free bits), ``remedies`` (what makes a discrete latent learnable:
what a recipe sets), ``optim`` (steps, batch, AdamW, seed) and ``log`` (metrics lines,
validations, checkpoints). Each group checks its own fields; TrainConfig checks what spans
two. Field names are unique across groups and equal the keys of the flat config.json that
runs wrote before the grouping: ``from_json`` reads both shapes, and ``flat_json`` gives the
flat one, which the experiment cells' keys hash (so cells trained before are found again).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from tokweight.training.baselines import POLICIES
from tokweight.training.cvae import CVAEConfig
from tokweight.training.estep import EStepConfig
from tokweight.training.losses import WEIGHTINGS, WeightingParams, check_free_bits
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
    device: str = "cpu"
    """torch device of the model; "cuda" under torchrun is cuda:LOCAL_RANK on each rank."""
    on_bad_sample: str = "error"
    """A bad sample the store does not already record as skipped: "error" (named by key and shard) or
    "skip" (counted by reason). What extraction skipped is skipped whatever this says."""

    def __post_init__(self):
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
    anchor_weight: float = 0.0
    """Weight of the anchor term E_q[mean_t relu(l_t(z) - b_t - anchor_margin)] (losses.anchor_penalty),
    q detached: keeps the tokens a weighting does not see from rising above the base model; 0: off."""
    anchor_margin: float = 0.0
    """Nats a token may rise above the base model's b_t before the anchor term acts."""
    anchor_start_step: int = 0
    """Steps before the anchor term acts (0: from the first). From scratch, start it once z is found: from
    step 0 its pull back to the base also removes the asymmetry at t0 that the E-step amplifies (h0-n16,
    beta 1: 2 of 3 seeds lost z, docs/results/from-scratch)."""

    def __post_init__(self):
        if min(self.anchor_weight, self.anchor_margin, self.anchor_start_step) < 0:
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

    def anchor_weight_at(self, step: int) -> float:
        """The anchor term's weight at ``step`` (0-based): 0 before anchor_start_step."""
        return self.anchor_weight if step >= self.anchor_start_step else 0.0


@dataclass(frozen=True)
class RemedyConfig:
    """Remedies against a discrete latent's collapse (``estep.py``, docs/latent-learnability.md);
    the fields a recipe sets (``recipes.py``), besides the posterior's CVAE fields."""

    estep: EStepConfig = field(default_factory=EStepConfig)
    """EM-style E-step from the decoder's own K passes (discrete latent; ``estep.py``); off by default."""
    latent_embedding_norm: float = 0.0
    """> 0: re-initialise the K latent token embeddings as orthogonal vectors of this norm before
    training (``cvae.spread_latent_embeddings``); 0 keeps the checkpoint's (nearly parallel) rows."""
    latent_embedding_center: bool = False
    """With latent_embedding_norm: offset the orthogonal rows from the checkpoint's mean latent row
    (kept out of their span) instead of replacing the rows. The base model has learnt to read that
    mean row as "a z, ignore it": the decoder starts intact (docs/latent-learnability.md)."""
    aggressive_steps: int = 0
    """Aggressive posterior updates (He et al. 2019): up to this many posterior-only steps on each
    batch, decoder fixed, until the posterior's objective stops improving; 0: off."""
    aggressive_until: int = 0
    """Training steps during which aggressive updates run (He et al. stop them once MI plateaus)."""

    def __post_init__(self):
        if isinstance(self.estep, dict):
            object.__setattr__(self, "estep", EStepConfig(**self.estep))
        if self.latent_embedding_norm < 0 or self.aggressive_steps < 0 or self.aggressive_until < 0:
            raise ValueError("latent_embedding_norm, aggressive_steps and aggressive_until must be >= 0")
        if self.latent_embedding_center and not self.latent_embedding_norm > 0:
            raise ValueError("latent_embedding_center needs latent_embedding_norm > 0 (the offset from the mean row)")

    @property
    def discrete_only(self) -> list[str]:
        """The remedies switched on that only a discrete latent has."""
        on = {"estep": self.estep.mode != "off", "latent_embedding_norm": self.latent_embedding_norm > 0}
        return [name for name, used in on.items() if used]


@dataclass(frozen=True)
class OptimConfig:
    """How long and how the run optimises, and its seed."""

    steps: int = 300
    """Optimizer steps (global: every rank takes them all)."""
    batch_size: int = 32
    """Examples per step per rank."""
    lr: float = 1e-3
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0: off)."""
    seed: int = 0
    """Seeds the heads, the data order and the continuous latent's noise."""

    def __post_init__(self):
        if min(self.steps, self.batch_size) < 1:
            raise ValueError("steps and batch_size must be >= 1")


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
    eval_every: int = 0
    """Steps between validations on the first ``eval_examples`` val examples, logged to metrics.jsonl (0: off)."""
    eval_examples: int = 256
    """Val examples of each periodic validation (rounded up to whole eval batches); the final one reads all."""

    def __post_init__(self):
        for name in ("log_every", "ckpt_every", "eval_batch_size", "eval_examples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if min(self.grad_diag_every, self.eval_every) < 0:
            raise ValueError("grad_diag_every and eval_every must be >= 0")


GROUPS = {"io": IOConfig, "cvae": CVAEConfig, "loss": LossConfig, "remedies": RemedyConfig, "optim": OptimConfig,
          "log": LogConfig}
"""TrainConfig's groups by field name; in the flat form every group's fields sit at the top, but cvae's."""


@dataclass(frozen=True)
class TrainConfig:
    io: IOConfig
    """Paths, loading and device."""
    cvae: CVAEConfig = field(default_factory=CVAEConfig)
    """Latent, z pathway and slots, posterior encoder."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Weighting, b's policy, beta schedule and free bits."""
    remedies: RemedyConfig = field(default_factory=RemedyConfig)
    """E-step, latent embedding init, aggressive posterior updates (off by default)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Steps, batch size, AdamW, seed."""
    log: LogConfig = field(default_factory=LogConfig)
    """Metrics lines, diagnostics, validations and checkpoints."""

    def __post_init__(self):
        for name, group in GROUPS.items():  # from_json hands the groups over as dicts
            if isinstance(getattr(self, name), dict):
                object.__setattr__(self, name, group(**getattr(self, name)))
        if self.cvae.latent != "discrete" and self.remedies.discrete_only:
            raise ValueError(f"{self.remedies.discrete_only} need a discrete latent")
        if self.io.store is None and self.loss.needs_store:
            raise ValueError(f"policy {self.loss.policy!r} with weighting {self.loss.weighting!r} needs --store")
        check_free_bits(self.loss.free_bits, self.cvae.latent, self.cvae.k)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> TrainConfig:
        """A config.json in either shape: grouped (``to_json``) or the flat one of earlier runs;
        fields added since a run started take their defaults."""
        return cls(**(obj if "io" in obj else grouped(obj)))

    def flat_json(self) -> dict:
        """The flat form of the runs before the grouping (cvae, beta and estep nested): what cell keys hash."""
        groups = self.to_json()
        cvae = groups.pop("cvae")
        return {**{k: v for group in groups.values() for k, v in group.items()}, "cvae": cvae}


def grouped(flat: dict) -> dict:
    """A flat config.json's fields sorted into their groups; a key no group has is refused."""
    names = {name: {f.name for f in fields(group)} for name, group in GROUPS.items() if name != "cvae"}
    unknown = set(flat) - {"cvae"} - set().union(*names.values())
    if unknown:
        raise ValueError(f"config fields {sorted(unknown)} belong to no TrainConfig group")
    return {"cvae": flat.get("cvae", {}), **{name: {k: v for k, v in flat.items() if k in own}
                                             for name, own in names.items()}}
