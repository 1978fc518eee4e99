"""`tokweight train-base`'s configuration: the entangled (z-free) base model and its training.

Imports only the standard library and name-only modules, so that the CLI builds its options from these fields
without importing torch, numpy or pyarrow."""

from __future__ import annotations

from dataclasses import dataclass

from tokweight.training.config.components import check_report_to


@dataclass(frozen=True)
class BaseTrainConfig:
    """The base model's training. Presets (`tokweight train-base --preset`) are files of the fields they change,
    tokweight/presets/base/<name>.toml."""

    data: str
    """Dataset directory holding train/ and val/ shards (and dataset.json, if synthetic), or their URLs."""
    out: str
    """Checkpoint directory to write."""
    steps: int = 1500
    """Optimizer steps."""
    batch_size: int = 64
    """Sequences per step."""
    lr: float = 2e-3
    """AdamW learning rate after the warm-up, decayed by a cosine to lr * min_lr_ratio."""
    min_lr_ratio: float = 0.05
    """Cosine decay ends at lr * min_lr_ratio."""
    warmup_steps: int = 100
    """Steps of the learning rate's linear warm-up from 0."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    n_layer: int = 2
    """Transformer blocks of the built-in GPT."""
    n_head: int = 4
    """Attention heads per block."""
    d_model: int = 64
    """Width of the residual stream."""
    k_max: int = 8
    """Latent tokens <z_0..z_{k_max-1}> in the vocabulary, untrained here (beyond z-conditioned base
    sequences); the most latent values a discrete CVAE on this checkpoint can have. Part of the
    vocabulary, so of the fingerprint."""
    max_slots: int = 4
    """Context reserved for the latent slots of the z-conditioned template."""
    min_slots: int = 1
    """The z-conditioned template's slots are drawn from min_slots..max_slots. Each count puts y at
    another offset from x, which a copy or a rotation must learn anew: with a long x, several counts can leave
    every one poorly learnt. min_slots = max_slots trains only the count the
    CVAE's prefix pathway reads (CVAEConfig.slots, 4; the other pathways read one)."""
    zcond_rate: float = 0.5
    """Share of training sequences given the z-conditioned template, with min_slots..max_slots
    slots holding one random latent token. z then carries no information about y, so the
    model stays z-free, but it knows the template the CVAE decoder reads: without this,
    inserting <z> <z_k> </z> shifted y onto untrained positions and cost up to 10 nats
    per token at initialisation (default task, 3-layer base)."""
    eval_every: int = 500
    """Steps between validations on the val split (and at the last step)."""
    seed: int = 0
    """Seeds the initialisation and the batches."""
    device: str = "auto"
    """torch device: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"."""
    report_to: tuple[str, ...] = ()
    """Trackers that get each metrics line and the configuration (``training/loop/trackers.py``); not part of what is
    trained."""

    def __post_init__(self):
        object.__setattr__(self, "report_to", tuple(self.report_to))
        check_report_to(self.report_to)
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be >= 1")
        if not 0.0 <= self.zcond_rate <= 1.0:
            raise ValueError(f"zcond_rate must be in [0, 1], got {self.zcond_rate}")
        if not 0 < self.lr < 1:
            raise ValueError("lr must be in (0, 1)")
        if not 1 <= self.min_slots <= self.max_slots:
            raise ValueError(f"need 1 <= min_slots <= max_slots, got {self.min_slots} and {self.max_slots}")
        if self.k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {self.k_max}")
