"""The training components' configs and the names they validate against: frozen dataclasses, each
field documented, checked in ``__post_init__``.

Implementation modules import their config from here (``cvae.py`` builds a CVAE from a
``CVAEConfig``, ``estep.py`` runs an ``EStepConfig``, ``losses.py`` weights by ``WeightingParams``),
and so does ``train_config.py``, which groups them into a run's ``TrainConfig``: a config never
imports the code it configures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

COND_MODES = ("token", "prefix", "layernorm", "memory")
"""z pathways (``conditioning.py``)."""
POLICIES = ("precomputed", "frozen", "dynamic")
"""Where b comes from each step (``baselines.py``)."""
WEIGHTINGS = ("uniform", "sum", "surprisal-share", "inverse-surprisal", "example-inverse", "distribution-rescale",
              "excess-share")
"""Reconstruction weightings (``losses.WEIGHT_FUNCTIONS`` computes each)."""
ESTEP_MODES = ("off", "soft", "hard", "label")
ESTEP_PRIORS = ("uniform", "learned")


@dataclass(frozen=True)
class CVAEConfig:
    latent: str = "discrete"
    """"discrete" (K values, exact expectation) or "continuous" (Gaussian, reparameterised)."""
    k: int = 4
    """Latent values of a discrete latent (<= the vocabulary's k_max)."""
    z_dim: int = 2
    """Dimensions of a continuous latent. From scratch on h0-n16 (surprisal-share, the E-step over 4 draws,
    300 steps, seed 0), 8 dimensions left the decoder ignoring z (MI estimate 0.27 hard, 0.31 soft) and 2 kept
    it (0.68 hard) with the decoder whole: a dimension's slot column is the offset / sqrt(F) long, and 8
    dimensions with the offset doubled (so each column as long as at 2) found z as well (0.50) at a larger
    cost to the decoder (NLL 0.136 against 0.078; docs/results.md, "The continuous latent from scratch")."""
    samples: int | None = None
    """Draws of a continuous latent per example, each a decoder copy (a discrete latent's copies are its K
    values). More than one gives its E-step values to choose among, as the discrete latent's K passes do
    (``estep.py``). None: 4 for a continuous latent, as many passes as the K = 4 discrete default; 1 for a
    discrete one."""
    prior: str = "learned"
    """Continuous prior: "learned" (conditional, from the decoder at <z>) or "standard" N(0, I)."""
    cond: str = "prefix"
    """z pathway: "token" (one slot), "prefix" (`slots` slots), "layernorm" (one slot + LayerNorm modulation)
    or "memory" (z as one extra key/value position per layer; the slot keeps a fixed placeholder).
    From scratch one slot collapsed under every weighting; a 4-slot prefix kept z on 12 of 12 seeds. On the demo's
    data and budget (h0-n16, default recipe with the latent rows then at norm 1, 300 steps; `python
    scripts/demo_variants.py OUT --jobs 2`, 6 cells in 3.4 min), seeds 0 / 1 / 2, exact MI (I(z; strategy)), decoder
    NLL vs the base's 0.133:
      prefix-4                             0.683 / 0.686 / 0.665 (same), whole, NLL 0.003-0.008
      memory, projection at 0.02 (GPT-2)   0.093 / 0.049 / 0.030 (0.000 / 0.012 / 0.015), damaged, NLL 0.19-0.21
      memory, at the keys' scale (now)     0.670 / 0.677 / 0.675 (0.669 / 0.677 / 0.674), whole, NLL 0.006-0.010
    At 0.02 the memory stayed a tenth of a token's keys and values for 300 steps (AdamW moves a weight ~lr a
    step); started at their scale it matches the prefix (docs/results.md, "The memory pathway")."""
    slots: int | None = None
    """Latent slots of the z-conditioned template (prefix only; 1 otherwise); None: 4 for the prefix."""
    posterior_pool: str = "mean"
    """Which z-free states the posterior head reads: "last" (the state at <eos>) or "mean" (the mean
    of the states that predict S). Measured on the experiment's h0-n16 base: with the true strategy
    as the distillation target, "last" stayed at strategy MI 0.000 for 300 steps, "mean" reached
    NMI 1.0 in 90 (the strategy is in every state after t0, which must predict y; <eos> predicts nothing)."""
    posterior_encoder: str = "shared"
    """What the posterior head reads: "shared" (the backbone's z-free pass) or "separate" (a small
    Transformer of its own, so posterior updates leave the decoder alone)."""
    encoder_layers: int = 1
    """Layers of the separate posterior encoder."""
    encoder_d_model: int = 64
    """Width of the separate posterior encoder (4 heads)."""

    def __post_init__(self):
        if self.latent not in ("discrete", "continuous"):
            raise ValueError(f"latent must be 'discrete' or 'continuous', got {self.latent!r}")
        if self.cond not in COND_MODES:
            raise ValueError(f"cond must be one of {COND_MODES}, got {self.cond!r}")
        if self.slots is None:
            object.__setattr__(self, "slots", 4 if self.cond == "prefix" else 1)
        if self.samples is None:
            object.__setattr__(self, "samples", 4 if self.latent == "continuous" else 1)
        if self.k < 2 or self.z_dim < 1 or self.slots < 1 or self.samples < 1:
            raise ValueError("need k >= 2, z_dim >= 1, slots >= 1, samples >= 1")
        if self.latent == "discrete" and self.samples != 1:
            raise ValueError(f"samples={self.samples} needs a continuous latent (a discrete one runs its K values)")
        if self.cond != "prefix" and self.slots != 1:
            raise ValueError(f"slots={self.slots} needs cond='prefix'")
        if self.prior not in ("learned", "standard"):
            raise ValueError(f"prior must be 'learned' or 'standard', got {self.prior!r}")
        if self.posterior_pool not in ("last", "mean"):
            raise ValueError(f"posterior_pool must be 'last' or 'mean', got {self.posterior_pool!r}")
        if self.posterior_encoder not in ("shared", "separate"):
            raise ValueError(f"posterior_encoder must be 'shared' or 'separate', got {self.posterior_encoder!r}")
        if self.encoder_layers < 1 or self.encoder_d_model < 4 or self.encoder_d_model % 4:
            raise ValueError("need encoder_layers >= 1 and encoder_d_model a positive multiple of 4")

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EStepConfig:
    mode: str = "off"
    """"off": decoder copies weighted by the amortised q (the plain objective); "soft": by
    q* = softmax(log p - R / temperature); "hard": by the one-hot argmax of q*; "label": by the
    one-hot of the example's ground-truth strategy (its index in the dataset's strategies)."""
    temperature: float = 1.0
    """Of q* (nats of R per nat of log q). Under "hard" it only shapes the balancing before the
    argmax (an unbalanced argmax does not depend on it)."""
    follow_beta: bool = False
    """Soft mode: use the step's beta as the temperature, which makes q* the exact E-step of J;
    at beta = 0 that is the hard argmin."""
    prior: str = "uniform"
    """p(k|x) inside q*: "uniform" (Shen et al.'s choice against rich-get-richer) or "learned"."""
    balance_iters: int = 0
    """Sinkhorn-Knopp iterations making the batch's assignment equipartitioned over k (0: off)."""
    posterior_weight: float = 1.0
    """Weight of the distillation cross-entropy -sum_k a(k) log q(k) training the amortised posterior."""
    until_step: int = 0
    """E-step objective for steps < until_step, then the plain objective (a warm start); 0: every step."""
    labelled: float = 0.0
    """Soft and hard modes: the share of the examples with a strategy label (picked by a hash of the key, the
    same ones every step) whose assignment is their label's value (the one-hot of its index in the dataset's
    strategies) instead of q*'s; 0: none. A few labels tie each value to one strategy, which the objective
    alone cannot (docs/results.md, "What the merge is")."""

    def __post_init__(self):
        if self.mode not in ESTEP_MODES:
            raise ValueError(f"estep mode must be one of {ESTEP_MODES}, got {self.mode!r}")
        if self.prior not in ESTEP_PRIORS:
            raise ValueError(f"estep prior must be one of {ESTEP_PRIORS}, got {self.prior!r}")
        if not self.temperature > 0 or self.balance_iters < 0 or self.posterior_weight < 0 or self.until_step < 0:
            raise ValueError("need temperature > 0, balance_iters >= 0, posterior_weight >= 0, until_step >= 0")
        if not 0 <= self.labelled <= 1 or (self.labelled and self.mode not in ("soft", "hard")):
            raise ValueError(f"estep labelled must be a share in [0, 1], and only in mode soft or hard (mode "
                             f"{self.mode!r}, labelled {self.labelled})")

    def active(self, step: int) -> bool:
        return self.mode != "off" and (self.until_step == 0 or step < self.until_step)

    def to_json(self) -> dict:
        return asdict(self)


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
