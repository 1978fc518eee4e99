"""`tokweight extract`'s configuration, and how a URL is retried (``Retry``, which training's streams share).

Imports only the standard library and name-only modules, so that the CLI builds its options from these fields
without importing torch, numpy or pyarrow."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tokweight.pipeline.models.dtypes import DTYPE_CHOICES
from tokweight.store.formats import PARQUET, check_format


@dataclass(frozen=True)
class Retry:
    """How a URL is retried after a transient failure."""

    attempts: int = 5
    """Tries in all (1: never retried)."""
    backoff_s: float = 1.0
    """Seconds before the second try, doubled before each later one; 0 retries at once (tests)."""

    def __post_init__(self):
        if self.attempts < 1 or self.backoff_s < 0:
            raise ValueError(f"Retry needs attempts >= 1 and backoff_s >= 0, got {self.attempts}, {self.backoff_s}")

    def wait(self, failed: int) -> None:
        """Sleep before the try after the ``failed``-th."""
        if self.backoff_s > 0:
            time.sleep(self.backoff_s * 2 ** (failed - 1))


ON_BAD_SAMPLE = ("error", "skip")
"""What extract does with a bad sample: stop naming it, or skip and count it."""


@dataclass(frozen=True)
class ExtractConfig:
    checkpoint: str
    """Checkpoint directory of the frozen z-free (entangled) base model."""
    data: str
    """Dataset directory (every *.tar below it), a glob of shards, or URLs (pipeline.data.urls): a brace pattern of
    http(s):// or pipe: URLs, or a file listing one per line."""
    store: str
    """Store root; parts go to STORE/fingerprint=<checkpoint fingerprint>/."""
    format: str = PARQUET
    """Part format: "parquet" (one row per example, list columns) or "zarr" (flat values + offsets)."""
    batch_tokens: int = 16384
    """Computed tokens per forward batch (batch size x padded length), a memory/speed knob only."""
    device: str = "auto"
    """torch device: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"; under torchrun "cuda" (or "auto" on a
    machine with GPUs) means each rank's cuda:LOCAL_RANK."""
    dtype: str = "auto"
    """Dtype of the forward ("float32", "bfloat16", "float16", or "auto": bfloat16 on CUDA, float32 elsewhere); the
    log-softmax is float32 whatever it is. The manifest records the resolved one."""
    on_bad_sample: str = "error"
    """"error": stop at the first bad sample or truncated shard, naming shard and key;
    "skip": leave it out and count it per reason in the part entry and the manifest."""
    lock_wait_s: float = 0.0
    """Seconds to wait for another extract holding this store's lock; 0 fails at once."""
    progress: bool = True
    """Show a tqdm bar with tokens/s (S tokens)."""
    template: str = "tokweight"
    """The checkpoint's format: "tokweight" (the built-in template), "chat" (the tokenizer's chat template:
    x the user turn, y the assistant turn) or the path of a string template file
    ({"text": "... {x} ... {y}", "end": "<end token>"}). Recorded in the store: later stages read it there."""
    reader_process: bool | None = None
    """True: read, parse, encode and batch shards in a separate (spawned) process, ahead of the model, on
    another core (where the vocabulary reads without transformers: not a chat template rendered per row);
    False: all in this process (no process to start: tiny inputs, tests); None (default): a reader process
    where it pays, by ``reader_pays`` (idle CPUs beside the forward). Same parts either way."""
    retry: Retry = Retry()
    """How a URL that fails transiently is retried (attempts, backoff); local shards are not retried."""

    def __post_init__(self):
        check_format(self.format)
        if self.batch_tokens < 1:
            raise ValueError(f"batch_tokens must be >= 1, got {self.batch_tokens}")
        if self.on_bad_sample not in ON_BAD_SAMPLE:
            raise ValueError(f"on_bad_sample must be one of {ON_BAD_SAMPLE}, got {self.on_bad_sample!r}")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {self.dtype!r}")
        if self.lock_wait_s < 0:
            raise ValueError(f"lock_wait_s must be >= 0, got {self.lock_wait_s}")
