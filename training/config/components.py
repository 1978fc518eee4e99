"""The training components' configs and the names they validate against: frozen dataclasses, each
field documented, checked in ``__post_init__``. Plain data and the standard library only: a command's --help
imports this, and no tensor library (``tests/training/config/test_config_modules.py``).

Implementation modules import their config from here (``training/cvae/model.py`` builds a CVAE from a
``CVAEConfig``, ``training/objective/estep.py`` runs an ``EStepConfig``, ``training/objective/terms.py`` computes
the ``WEIGHTINGS`` named here, ``training/objective/baselines.py`` the ``POLICIES``), and so does
``training/config/train.py``, which groups them into a run's ``TrainConfig``. A field whose
default depends on the latent is None here and resolved by ``TrainConfig`` (``resolved``), so a run's config.json
holds the values it ran with.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

COND_MODES = ("token", "prefix", "layernorm", "memory", "query")
"""z pathways (``conditioning.py``)."""
ESTEP_MODES = ("off", "soft", "hard", "label")
ESTEP_PRIORS = ("uniform", "learned")
CLUSTER_MAPS = ("identity", "agreement", "matched")
LABEL_MAPS = ("identity", "matched")
LATENTS = ("discrete", "continuous")


@dataclass(frozen=True)
class Weighting:
    """A reconstruction weighting's name and what it needs (its weights: ``losses.WEIGHT_FUNCTIONS[name]``).
    ``per_example``: it reads an example's own b, so an example whose b sums to < eps is degenerate and falls back
    to uniform. ``needs_dataset_mean``: it reads the dataset's mean of mean_t b_t, which only a store has
    (``WeightingParams.dataset_mean_b``)."""

    name: str
    per_example: bool = True
    needs_dataset_mean: bool = False


WEIGHTINGS: dict[str, Weighting] = {w.name: w for w in (
    Weighting("uniform", per_example=False),
    Weighting("sum", per_example=False),
    Weighting("surprisal-share"),
    Weighting("inverse-surprisal"),
    Weighting("example-inverse"),
    Weighting("distribution-rescale", per_example=False, needs_dataset_mean=True),
    Weighting("excess-share"),
)}
"""Every weighting by name: the names ``LossConfig.weighting`` accepts (the table in ``losses.py``)."""


@dataclass(frozen=True)
class WeightingParams:
    """Constants the weightings need besides b and the mask."""

    eps: float = 1e-6
    """Added to a weight sum; also the degenerate threshold on sum_t b_t (nats)."""
    eps_inv: float = 1e-2
    """Floor under b in inverse-surprisal, 1 / (b + eps_inv): bounds a token's weight (nats)."""
    dataset_mean_b: float | None = None
    """Dataset mean of mean_t b_t (nats), read from the store; distribution-rescale only."""

    def __post_init__(self):
        if not self.eps > 0 or not self.eps_inv > 0:
            raise ValueError("eps and eps_inv must be > 0")
        if self.dataset_mean_b is not None and not self.dataset_mean_b > 0:
            raise ValueError(f"dataset_mean_b must be > 0, got {self.dataset_mean_b}")


@dataclass(frozen=True)
class Policy:
    """Where b comes from, and what that needs (the step's ``Baseline`` it makes: ``baselines.make_baseline``)."""

    name: str
    needs_store: bool = False
    """b is the store's row, joined into the batch by the data stream."""
    frozen_model: bool = False
    """A frozen copy of the baseline model runs one extra z-free pass a step."""


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("precomputed", needs_store=True),
    Policy("frozen", frozen_model=True),
    Policy("dynamic"),
)}
"""Every policy by name: the names ``LossConfig.policy`` accepts (``baselines.py`` says what each computes)."""

TRACKERS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
"""Tracker name -> the module its extra installs (the extra has the tracker's name; ``trackers.py``)."""


def check_report_to(names: tuple[str, ...]) -> None:
    """Refuse a tracker name this version does not know, by name."""
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"report_to: unknown tracker {unknown[0]!r}; choose among {', '.join(TRACKERS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"report_to names a tracker twice: {list(names)}")


def parse_report_to(text: str | None) -> tuple[str, ...]:
    """``--report-to tensorboard,mlflow`` as a tuple of names ("" or "none": none)."""
    names = tuple(n.strip() for n in (text or "").split(",") if n.strip() and n.strip() != "none")
    check_report_to(names)
    return names


def default_cond(latent: str) -> str:
    """The z pathway a run gets unless it names its own (``CVAEConfig.cond``): "query" for a discrete latent, whose
    values then name the strategies where the prefix merges two; "prefix" for a continuous one, the pathway it
    is measured through."""
    return "query" if latent == "discrete" else "prefix"


@dataclass(frozen=True)
class CVAEConfig:
    latent: str = "discrete"
    """"discrete" (K values, exact expectation) or "continuous" (Gaussian, reparameterised)."""
    k: int = 4
    """Latent values of a discrete latent (<= the vocabulary's k_max); clusters for a continuous one's eval."""
    z_dim: int = 2
    """Dimensions of a continuous latent. Each dimension's share of a slot's offset is 1/sqrt(z_dim), so a
    larger z moves the decoder's input less per dimension."""
    samples: int | None = None
    """Draws of a continuous latent per example, each a decoder copy, among which its E-step chooses (a discrete
    latent's copies are its K values). None: 4 for a continuous latent (as many passes as the K = 4 discrete
    default), 1 for a discrete one."""
    prior: str = "learned"
    """Continuous prior: "learned" (conditional, from the decoder at <z>) or "standard" N(0, I)."""
    cond: str | None = None
    """z pathway: "token" (one slot), "prefix" (``slots`` slots), "layernorm" (one slot + LayerNorm modulation)
    or "memory" (z as one extra key/value position per layer; the slot keeps a fixed placeholder) or "query" (z
    as an offset of every query, per layer and head: where the decoder reads; on a Hugging Face backbone by a hook
    on each layer's query projection, before RoPE). One slot is a bottleneck the decoder's response to z does not
    grow through. None: ``default_cond(latent)``."""
    slots: int | None = None
    """Latent slots of the z-conditioned template (prefix only; 1 otherwise); None: 4 for the prefix."""
    posterior_pool: str = "mean"
    """Which z-free states the posterior head reads: "last" (the state at <eos>) or "mean" (the mean of the
    states that predict S, each of which holds the strategy once it is revealed; <eos> predicts nothing)."""
    posterior_likelihood: bool | None = None
    """Whether a discrete posterior also reads y's log-likelihood under each value on the examples the E-step is sure
    of (``estep.read_likelihood``): log q(k | x, y) = head(states)_k + log p(y | x, k) + const, Bayes' rule with the
    head as the log prior, from the K decoder passes each step runs, detached; where the hardening acts
    (``estep.harden`` from ``estep.harden_from``; K >= 3), so the starts, compared by the head's own reading, are
    the runs they were. The head's features fit the training lines; the decoders' likelihoods generalise to others
    None: true for a discrete latent; a continuous one's
    copies are draws from q, so it has none."""
    latent_init_norm: float | None = None
    """The latent rows' offset from the checkpoint's mean latent row at the start, in units of the checkpoint's
    token-row spread (``cvae.model.token_row_spread``): the K rows (discrete) or the slot projection's columns
    (continuous) start as that mean plus orthogonal directions of this norm, so each value differs from step 0
    while the base still reads "a z goes here" (``cvae.model.spread_latent_embeddings``,
    ``Conditioning.init_slots``). 0: the checkpoint's own, nearly parallel rows. None: 0.5 discrete, 1.0
    continuous."""
    latent_init_center: bool = True
    """Offset the rows from the checkpoint's mean latent row (True), or replace them by orthogonal rows of that
    norm around 0 (False: inputs the base never read)."""

    def __post_init__(self):
        if self.latent not in LATENTS:
            raise ValueError(f"latent must be one of {LATENTS}, got {self.latent!r}")
        if self.cond is None:
            object.__setattr__(self, "cond", default_cond(self.latent))
        if self.cond not in COND_MODES:
            raise ValueError(f"cond must be one of {COND_MODES}, got {self.cond!r}")
        if self.slots is None:
            object.__setattr__(self, "slots", 4 if self.cond == "prefix" else 1)
        if self.samples is None:
            object.__setattr__(self, "samples", 4 if self.latent == "continuous" else 1)
        if self.posterior_likelihood is None:
            object.__setattr__(self, "posterior_likelihood", self.latent == "discrete")
        if self.latent_init_norm is None:
            object.__setattr__(self, "latent_init_norm", 0.5 if self.latent == "discrete" else 1.0)
        if self.k < 2 or self.z_dim < 1 or self.slots < 1 or self.samples < 1:
            raise ValueError("need k >= 2, z_dim >= 1, slots >= 1, samples >= 1")
        if self.latent == "discrete" and self.samples != 1:
            raise ValueError(f"samples={self.samples} needs a continuous latent (a discrete one runs its K values)")
        if self.cond != "prefix" and self.slots != 1:
            raise ValueError(f"slots={self.slots} needs cond='prefix'")
        if self.prior not in ("learned", "standard"):
            raise ValueError(f"prior must be 'learned' or 'standard', got {self.prior!r}")
        if self.posterior_likelihood and self.latent != "discrete":
            raise ValueError("posterior_likelihood needs a discrete latent (a continuous one's copies are draws "
                             "from q): set it false")
        if self.posterior_pool not in ("last", "mean"):
            raise ValueError(f"posterior_pool must be 'last' or 'mean', got {self.posterior_pool!r}")
        if self.latent_init_norm < 0:
            raise ValueError(f"latent_init_norm must be >= 0, got {self.latent_init_norm}")

    def to_json(self) -> dict:
        return asdict(self)


HARDEN = 0.5
"""A soft E-step's default ``EStepConfig.harden`` (k >= 3): an example is sure of a copy that q* gives at least
half."""

CLUSTER_WEIGHT = 3.0
"""A discrete latent's default ``EStepConfig.cluster_weight`` in modes soft and hard: gamma_c in units of each
example's spread of R (``cluster_relative``), toward the values the decoders choose (``cluster_map`` "matched")."""


@dataclass(frozen=True)
class EStepConfig:
    """The E-step (``training/objective/estep.py``): which examples each decoder copy learns from. The default is the exact E-step of
    the objective J at the step's beta, q*(k) = softmax(-R(k) / beta) (discrete); for a continuous latent, the
    hard choice of each example's best draw."""

    mode: str | None = None
    """"soft": copies weighted by q* = softmax(log p - R / temperature); "hard": by the one-hot argmax of q*;
    "label": by the one-hot of the example's ground-truth strategy; "off": by the amortised q (the plain
    objective, no E-step). None: "soft" for a discrete latent, "hard" for a continuous one."""
    temperature: float = 1.0
    """Of q* (nats of R per nat of log q), when not ``follow_beta``. Under "hard" it only shapes the balancing
    before the argmax."""
    follow_beta: bool = True
    """Use the step's beta as the temperature, which makes q* the exact E-step of J (at beta = 0 the hard
    argmin)."""
    prior: str | None = None
    """p(k|x) inside q*: "uniform" (against rich-get-richer: a value's falling usage is not fed back into its
    share) or "learned". None: "uniform" for a discrete latent, "learned" for a continuous one (its importance
    weights need the prior the model has)."""
    harden: float | None = None
    """Mode "soft": from step ``harden_from``, an example whose q* gives one copy at least this share trains that
    copy only (its one-hot), the others train by q*; 0: never. Two copies that explain an example about as well
    both learn from it under q* and stay alike there; a sure example's one-hot lets each copy specialise. Where
    no example is that sure (a z not in use) it is the soft E-step, so the share must exceed 1/k. None:
    ``HARDEN`` (0.5) for a discrete latent in mode soft with k >= 3 (at k = 2 half is chance: every example would
    be sure, a z not in use included, so 0 there); 0 in every other mode, whatever it is set to (they have no q*
    to harden)."""
    harden_from: int | None = None
    """The first step at which ``harden`` acts; None: the step the starts were compared at (RUN/starts.json's
    "compared_at"), or ``optim.start_steps_max`` in a run of one start. So the soft E-step chooses the code (the
    starts themselves do not harden) and the hardening sharpens the one kept."""
    balance_iters: int = 0
    """Sinkhorn-Knopp iterations making the batch's assignment equipartitioned over k (0: off). A balance gives
    each value 1/K of every batch, which a strategy code has only when the strategies are equally frequent."""
    until_step: int = 0
    """E-step objective for steps < until_step, then the plain objective (a warm start); 0: every step."""
    labelled: float = 0.0
    """Soft and hard modes: the share of the examples with a strategy label (picked by a hash of the key, the
    same ones every step) whose assignment is their label's value (the one-hot of the value ``label_map`` gives the
    label) instead of q*'s; 0: none. A few labels tie each value to one strategy, which the objective
    alone cannot. Which value a label's lines take: ``label_map``."""
    label_map: str = "matched"
    """Which value ``labelled`` fixes a label's lines to: "identity", value k for the dataset's strategies[k] from step
    0; "matched", the value the decoders already give most of that label's lines beyond chance (argmin R over recent
    steps, one value a label: ``label_values.LabelValues``), which is value k until they choose. Under "identity" a
    few labels fight the code the unlabelled lines set in the first steps, which any permutation of the values fits
    as well, and can lose it: the labelled lines end on values that write other strategies."""
    head_weight: float = 0.0
    """Discrete latent, soft and hard modes: gamma, the weight of the amortised head's log q(k | x, y) (detached,
    before any likelihood read) inside q*: q*(k) ∝ p(k|x) q_head(k)^gamma exp(-R(k) / temperature). The head is
    one linear map of the pooled states (``cvae.posterior_pool``), the same for every input, so its grouping
    carries a value from the examples the decoders have bound to those they nearly tie on; 0: off."""
    cluster_weight: float | None = None
    """Discrete latent, soft and hard modes: gamma_c, the weight of the base's own grouping of the lines
    (``training/objective/clusters.py``): q*(k) ∝ p(k|x) exp(-(R(k) - gamma_c log pi(k)) / temperature), pi an
    example's soft cluster among K centres that k-means fits to the init checkpoint's pooled states
    (``cvae.posterior_pool``) on the first training lines, tilted toward the value ``cluster_map`` gives it. The
    grouping does not learn from the decoders, so it can keep a value on one strategy where the decoders alone
    would bind it to one strategy on some inputs and another on the rest; 0: off (nothing fitted). None:
    ``CLUSTER_WEIGHT`` (3) for a discrete latent in mode soft or hard, 0 in every other case."""
    cluster_relative: bool = True
    """``cluster_weight`` in units of each example's spread of R over the values (their standard deviation) instead
    of nats: the grouping can reorder the values the decoders already tell apart, and cannot make them differ where
    z is not used (a z the weighting would let collapse stays collapsed)."""
    cluster_map: str = "matched"
    """Which value a base cluster tilts toward: "identity", value k is cluster k from step 0; "agreement", the values
    the decoders already choose (argmin R) on the cluster's lines over recent steps, by their pointwise mutual
    information with it (``clusters.Agreement``), so a grouping the decoders do not follow tilts nothing; "matched",
    each value one cluster, the pairs the decoders agree on most, at "identity"'s strength times I(cluster; value) /
    log K of the same table."""
    labelled_weight: float = 0.5
    """The share of a batch's fit (reconstruction and distillation) that its labelled examples carry, whatever their
    number, the unlabelled the rest (each example of a part alike); a batch without both is unweighted. Set to
    ``labelled`` itself, each example weighs about the same, and a few labels are as few in the gradient."""

    def __post_init__(self):
        if self.mode is not None and self.mode not in ESTEP_MODES:
            raise ValueError(f"estep mode must be one of {ESTEP_MODES}, got {self.mode!r}")
        if self.prior is not None and self.prior not in ESTEP_PRIORS:
            raise ValueError(f"estep prior must be one of {ESTEP_PRIORS}, got {self.prior!r}")
        if not self.temperature > 0 or self.balance_iters < 0 or self.until_step < 0:
            raise ValueError("need temperature > 0, balance_iters >= 0, until_step >= 0")
        if not (self.harden is None or 0 <= self.harden <= 1) or (self.harden_from or 0) < 0:
            raise ValueError(f"estep harden must be a share in [0, 1] and harden_from >= 0, got {self.harden}, "
                             f"{self.harden_from}")
        if self.head_weight < 0 or (self.cluster_weight or 0) < 0:
            raise ValueError(f"estep head_weight and cluster_weight must be >= 0, got {self.head_weight}, "
                             f"{self.cluster_weight}")
        if self.cluster_map not in CLUSTER_MAPS:
            raise ValueError(f"estep cluster_map must be one of {CLUSTER_MAPS}, got {self.cluster_map!r}")
        if self.label_map not in LABEL_MAPS:
            raise ValueError(f"estep label_map must be one of {LABEL_MAPS}, got {self.label_map!r}")
        if not 0 < self.labelled_weight < 1:
            raise ValueError(f"estep labelled_weight must be a share in (0, 1), got {self.labelled_weight}")
        if not 0 <= self.labelled <= 1 or (self.labelled and self.mode not in (None, "soft", "hard")):
            raise ValueError(f"estep labelled must be a share in [0, 1], and only in mode soft or hard (mode "
                             f"{self.mode!r}, labelled {self.labelled})")

    def resolved(self, latent: str, k: int, samples: int) -> EStepConfig:
        """This config with the latent's defaults filled in (``harden_from`` is the run's: ``TrainConfig``), checked
        against what the latent can do: a continuous latent's E-step weighs its draws of z, not values that mean
        strategies (no label mode, no labels), nor values a batch can be balanced over, and its importance weights
        need the learned prior and more than one draw to choose among."""
        continuous = latent == "continuous"
        mode = self.mode or ("hard" if continuous else "soft")
        if mode != "soft":
            harden = 0.0  # nothing to harden
        elif self.harden is None:
            harden = HARDEN if not continuous and HARDEN > 1 / k else 0.0
        else:
            harden = self.harden
        cluster = self.cluster_weight
        if cluster is None:
            cluster = CLUSTER_WEIGHT if not continuous and mode in ("soft", "hard") else 0.0
        cfg = replace(self, mode=mode, prior=self.prior or ("learned" if continuous else "uniform"), harden=harden,
                      cluster_weight=cluster)
        if not continuous or cfg.mode == "off":
            return cfg
        if (cfg.mode == "label" or cfg.labelled or cfg.balance_iters or cfg.head_weight or cfg.cluster_weight
                or cfg.prior != "learned"):
            raise ValueError("a continuous latent's E-step weighs its draws of z: it takes mode soft or hard with "
                             f"prior 'learned', balance_iters 0, labelled 0, head_weight 0 and cluster_weight 0, not "
                             f"mode {cfg.mode!r}, prior {cfg.prior!r}, balance_iters {cfg.balance_iters}, labelled "
                             f"{cfg.labelled}, head_weight {cfg.head_weight}, cluster_weight {cfg.cluster_weight}")
        if samples < 2:
            raise ValueError(f"a continuous latent's E-step chooses among its draws: set samples >= 2, not {samples}")
        return cfg

    def check_harden(self, k: int) -> None:
        """Refuses to train with a share q* always reaches (at most 1/k): every example would be sure of a value, a z
        not in use included. Checked where a run trains, so a config.json that holds one (written before the
        refusal) still loads for eval."""
        if self.harden and self.harden <= 1 / k:
            raise ValueError(f"estep harden {self.harden} is at most 1/k = {1 / k:.3g}: every example would be sure "
                             "of a value, a z not in use included; set it above 1/k, or 0 for none")

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StopRule:
    """When validation says a run converged (``convergence.py`` reads it at each periodic validation)."""

    patience: int = 7
    """Counted validations without an improvement before the run converges (0: off, the run trains to its cap).
    At 50 steps a validation: 350 steps, because a run can sit on a plateau for several validations before z is
    found."""
    min_delta_objective: float = 0.02
    """Nats the val objective must fall below its best to count as an improvement: above the validation's own
    noise, so that a run that has settled is not kept going by it."""
    min_delta_mi: float = 0.02
    """Nats the MI must rise above its best to count as an improvement (the same reason)."""

    def __post_init__(self):
        if self.patience < 0 or min(self.min_delta_objective, self.min_delta_mi) < 0:
            raise ValueError("need patience >= 0, min_delta_objective >= 0 and min_delta_mi >= 0")

    def describe(self, eval_every: int, examples: int, beta: float, settle: int) -> str:
        """The rule in words with its numbers."""
        if not (self.patience and eval_every):
            return "off: the run trains to its step cap (patience 0 or no periodic validation)"
        return (f"converged once {self.patience} consecutive validations (every {eval_every} steps, {examples} val "
                f"examples, counted from step {settle}) neither lower the val objective recon + {beta:g} * KL by "
                f"more than {self.min_delta_objective:g} nats below its best nor raise the MI by more than "
                f"{self.min_delta_mi:g} nats above its best")


def check_free_bits(free_bits: float, latent: str, k: int) -> None:
    """Refuse a floor that switches the categorical KL off: KL(q || uniform) <= log K."""
    if free_bits < 0:
        raise ValueError(f"free bits must be >= 0, got {free_bits}")
    if latent == "discrete" and free_bits >= math.log(k):
        raise ValueError(f"free bits {free_bits} >= log K = {math.log(k):.4f}: for a categorical latent "
                         "with a uniform prior the KL can never exceed log K, so the KL term would be constant")


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters on a frozen backbone (``lora.py``), for backbones too large to train whole."""

    rank: int = 0
    """Rank r of the LoRA adapters on every linear layer of the backbone (attention and MLP; not the output
    head). Their scale alpha / r is 1 (alpha = r: a larger rank adds capacity, not step size), dropout 0, and
    B starts at 0, so that step 0 is the full model's. 0: no adapters, every parameter trains."""

    def __post_init__(self):
        if self.rank < 0:
            raise ValueError(f"lora rank must be >= 0 (0: no adapters), got {self.rank}")

    def to_json(self) -> dict:
        return asdict(self)
