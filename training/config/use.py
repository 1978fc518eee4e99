"""The configurations of the commands that use a trained run: `tokweight eval`, `generate`, `encode` and
`export`; and the names and threshold of eval's verdict on z, which the experiments' tables read.

Imports only the standard library and name-only modules, so that the CLI builds its options from these fields
without importing torch, numpy or pyarrow."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokweight.pipeline.models.dtypes import resolve_dtype

OUTCOMES = ("z used, decoder whole", "z used, decoder damaged", "z not used")
"""eval's verdict on z (eval.json ``z_used``; ``verdict.z_use`` gives it)."""
KEPT_FRACTION = 0.5
"""z counts as kept (its code formed) when the exact MI is at least this fraction of log K."""


def kept_threshold(k: int) -> float:
    """KEPT_FRACTION * log K nats: the exact MI at which z of K values counts as kept."""
    return KEPT_FRACTION * math.log(k)


@dataclass(frozen=True)
class EvalConfig:
    run: str
    """The train run directory."""
    data: str
    """Dataset directory holding the split."""
    split: str = "test"
    """Split to evaluate (a subdirectory of data)."""
    batch_size: int = 128
    """Examples per forward batch."""
    decode_examples: int = 256
    """Examples decoded per latent value (the first ones of the split)."""
    device: str = "auto"
    """torch device: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"."""
    dtype: str = "auto"
    """The weights' and the forward's dtype (the run's model and the base model): "float32", "bfloat16", "float16", or
    "auto" (bfloat16 on CUDA, float32 elsewhere); the log-softmax and the posterior run in float32 whatever it is."""

    def __post_init__(self):
        resolve_dtype(self.dtype, "cpu")  # refuses an unknown name
        if self.batch_size < 1 or self.decode_examples < 0:
            raise ValueError("batch_size must be >= 1 and decode_examples >= 0")


@dataclass(frozen=True)
class GenerateConfig:
    run: str
    """The train run directory."""
    input: str
    """JSON lines, one input each: {"key"?: ..., "x": ...}."""
    out: str
    """JSON lines to write, one per input line."""
    temperature: float = 0.0
    """0: greedy; > 0: sampling from softmax(logits / temperature)."""
    seed: int = 0
    """Seeds the sampling draws (unused when greedy)."""
    max_new_tokens: int = 256
    """Tokens of y at most, before </y> (fewer where the backbone's context ends first): a line whose decode never
    writes </y> stops here, not at the end of a real model's context."""
    data: str | None = None
    """Continuous latent only: the dataset whose split's posterior means give the K centres."""
    split: str = "test"
    """The split of ``data`` (eval's default)."""
    batch_size: int = 64
    """Input lines decoded together (each as K rows); also the batch of the centres' pass."""
    device: str = "auto"
    """torch device: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"."""
    dtype: str = "auto"
    """The weights' and the forward's dtype: "float32", "bfloat16", "float16", or "auto" (bfloat16 on CUDA, float32
    elsewhere); the log-softmax runs in float32 whatever it is."""

    def __post_init__(self):
        resolve_dtype(self.dtype, "cpu")  # refuses an unknown name
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {self.temperature}")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError("batch_size and max_new_tokens must be >= 1")


@dataclass(frozen=True)
class EncodeConfig:
    run: str
    """The train run directory."""
    data: str
    """Dataset directory holding the split."""
    split: str = "test"
    """Split to encode (a subdirectory of data)."""
    out: str | None = None
    """The Parquet file to write; None: RUN/posteriors-<split>.parquet (where `tokweight sql --run` looks)."""
    batch_size: int = 128
    """Examples per forward batch."""
    device: str = "auto"
    """torch device: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"."""
    dtype: str = "auto"
    """The weights' and the forward's dtype: "float32", "bfloat16", "float16", or "auto" (bfloat16 on CUDA, float32
    elsewhere); the log-softmax and the posterior run in float32 whatever it is."""

    def __post_init__(self):
        resolve_dtype(self.dtype, "cpu")  # refuses an unknown name
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class ExportConfig:
    run: str
    """The train run directory."""
    out: str
    """The directory to write (export.json and the model directories)."""
    data: str | None = None
    """Continuous latent only: the dataset whose split's posterior means give the K centres (as generate)."""
    split: str = "test"
    """The split of ``data``."""
    batch_size: int = 64
    """Batch of the centres' pass."""
