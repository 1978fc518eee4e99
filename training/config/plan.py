"""`tokweight plan`'s configuration: the model and the training flags that change its memory.

Imports only the standard library and config modules, so that the CLI builds its options from these fields
without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from tokweight.training.config.train import SHARDS

PLAN_DTYPES = ("bfloat16", "float32")
"""The forward's dtypes a plan takes: train's, "auto" resolved as on a GPU."""


@dataclass(frozen=True)
class PlanConfig:
    """A configuration to plan: the model and the training flags that change its memory."""

    model: str
    """A built-in model config (``plan_models.MODELS``), a config.json, or a checkpoint directory."""
    k: int = 4
    """Latent values (the decoder runs K copies of every example)."""
    batch_size: int = 8
    """Examples per rank."""
    seq_len: int = 512
    """Tokens of an example's z-free sequence (half of them y)."""
    dtype: str = "bfloat16"
    """The forward's dtype: "bfloat16" (what train's "auto" gives on a GPU: autocast, frozen weights held in
    bfloat16) or "float32"."""
    lora_rank: int = 0
    """LoRA adapters' rank; 0: every parameter trains."""
    grad_checkpointing: bool = False
    """Recompute the backbone's activations in the backward."""
    shard: str = "ddp"
    """"ddp" (each rank holds the whole model) or "fsdp" (sharded over ``ranks``)."""
    ranks: int = 1
    """Ranks of the job; the plan is one rank's."""
    eval_batch_size: int | None = None
    """Examples per rank of a validation forward; None: ``LogConfig.eval_batch_size``, a run's default."""
    memory_gib: float = 80.0
    """A rank's device memory, GiB: what the largest batch must fit."""
    headroom: float = 0.1
    """Share of ``memory_gib`` left for what the tracker does not see (module docstring)."""
    merge_passes: bool | None = None
    """``io.merge_passes``: the z-free pass in one forward with a discrete latent's copies; None: train's default
    on a GPU (on, without ``grad_checkpointing``)."""
    cvae: object = None
    """A run's whole ``CVAEConfig`` (latent, z pathway, slots), when a run is planned; None: the defaults at ``k``."""

    def __post_init__(self):
        if self.dtype not in PLAN_DTYPES or self.shard not in SHARDS:
            raise ValueError(f"dtype must be one of {PLAN_DTYPES} and shard one of {SHARDS}, got {self.dtype!r}, "
                             f"{self.shard!r}")
        if min(self.k, self.batch_size, self.ranks) < 1 or self.seq_len < 8:
            raise ValueError("k, batch_size and ranks must be >= 1, seq_len >= 8")
        if not 0 <= self.headroom < 1 or self.memory_gib <= 0:
            raise ValueError("memory_gib must be > 0 and headroom in [0, 1)")

    @property
    def budget(self) -> float:
        """Bytes a rank's peak must stay within: ``memory_gib`` less the headroom."""
        return self.memory_gib * (1 << 30) * (1 - self.headroom)

    @property
    def sharded(self) -> bool:
        return self.shard == "fsdp" and self.ranks > 1

    def train_config(self, batch_size: int | None = None):
        """The TrainConfig a run of this configuration has (paths are placeholders: nothing is read)."""
        from tokweight.training.config.components import CVAEConfig, LoRAConfig
        from tokweight.training.config.train import IOConfig, LogConfig, OptimConfig, TrainConfig

        io = IOConfig(checkpoint=self.model, data="plan", out="plan", store="plan", device="cpu", dtype=self.dtype,
                      grad_checkpointing=self.grad_checkpointing, shard=self.shard, merge_passes=self.merge_passes)
        cvae = self.cvae if isinstance(self.cvae, CVAEConfig) else CVAEConfig(k=self.k)
        log = LogConfig() if self.eval_batch_size is None else LogConfig(eval_batch_size=self.eval_batch_size)
        return TrainConfig(io=io, cvae=cvae, optim=OptimConfig(batch_size=batch_size or self.batch_size),
                           lora=LoRAConfig(rank=self.lora_rank), log=log)
