"""Extraction's scoring stage: one shard's batches through the frozen checkpoint -> b_t, the entropy and the top-1
probability of each S position (float32, from a float32 log-softmax over the vocabulary, in chunks of positions),
scattered back to shard order, and the shard's part table (``store.schema.PART_SCHEMA``) with its derived columns
(``store.derived``). ``extract.py`` runs it per shard between the reader and the store's writer.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import torch

from tokweight.pipeline.extract.prepare import ShardBatches
from tokweight.pipeline.tokens.templates import Batch, BatchArrays, to_device
from tokweight.store.derived import derived_columns, scalar_arrays
from tokweight.store.schema import PART_SCHEMA



LOGIT_CHUNK_ELEMENTS = 1 << 26
"""Float32 logits held at once (256 MiB): with a 150k-token vocabulary, ~450 positions per chunk."""


def score_positions(logits_s: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(b, entropy, top1) of (N, V) logits in float32 (whatever the model's dtype) against (N,) targets.

    One log-softmax serves all three: b is its negated target entry, so the normaliser is
    computed once (on a small vocabulary each pass over (N, V) costs as much as the head).
    """
    log_p = logits_s.float().log_softmax(dim=-1)
    b = -log_p.gather(-1, targets[:, None]).squeeze(-1)  # nats
    return b, -(log_p.exp() * log_p).sum(dim=-1), log_p.argmax(dim=-1) == targets


@dataclass(frozen=True)
class ScoreInputs:
    """What the model reads of a batch, made on the host (so that the device is never waited on to learn an index):

    input_ids: (B, L) long, cut after the last position whose logits predict S (the tail </y> <eos> changes nothing)
    positions: (N,) long, flat index row * L + position of each hidden state that predicts S, row-major over the mask
    targets:   (N,) long, the S tokens they predict
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    targets: torch.Tensor

    @classmethod
    def of(cls, batch: Batch) -> ScoreInputs:
        length = int(batch.logit_pos.max()) + 1
        rows = torch.arange(len(batch.input_ids), device=batch.logit_pos.device)[:, None]  # (B, 1)
        positions = (rows * length + batch.logit_pos)[batch.mask]  # (N,)
        return cls(batch.input_ids[:, :length], positions, batch.targets[batch.mask])

    def to(self, device: torch.device) -> ScoreInputs:
        return ScoreInputs(*(to_device(t, device) for t in (self.input_ids, self.positions, self.targets)))


@torch.inference_mode()
def score_batch(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(b, entropy, top1), each (N,): the batch's S positions in row-major order of ``batch.mask``."""
    return score_inputs(model, ScoreInputs.of(batch))


@torch.inference_mode()
def score_inputs(model, inputs: ScoreInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(b, entropy, top1), each (N,), of ``ScoreInputs`` on the model's device. The output head runs only on the
    hidden states that predict S, in chunks of positions, so memory stays bounded whatever the vocabulary."""
    hidden = model.hidden(inputs.input_ids)  # (B, L, d)
    hidden_s = hidden.reshape(-1, hidden.shape[-1]).index_select(0, inputs.positions)  # (N, d)
    chunk = max(1, LOGIT_CHUNK_ELEMENTS // model.cfg.vocab_size)
    scored = [score_positions(model.head(h), t) for h, t in zip(hidden_s.split(chunk), inputs.targets.split(chunk))]
    return tuple(torch.cat(values) for values in zip(*scored))


@dataclass
class Scored:
    """A batch's outputs on their way to the host: ``values`` (b, entropy, top1), readable once ``ready``."""

    rows: np.ndarray  # (B,) the batch's rows among the shard's
    batch: BatchArrays  # on the host
    values: tuple[torch.Tensor, ...]
    copied: object = None  # a torch.cuda.Event after the device-to-host copies; None: on the host already

    @classmethod
    def start(cls, model, rows: np.ndarray, batch: BatchArrays, device: torch.device) -> Scored:
        """Queue the batch's copy, forward and scoring on the device, and the outputs' copy back."""
        values = score_inputs(model, ScoreInputs.of(Batch.of(batch)).to(device))
        if device.type != "cuda":
            return cls(rows, batch, tuple(t.cpu() for t in values))
        values = tuple(t.to("cpu", non_blocking=True) for t in values)  # into pinned memory
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return cls(rows, batch, values, event)

    def ready(self) -> tuple[np.ndarray, ...]:
        if self.copied is not None:
            self.copied.synchronize()
        return tuple(t.numpy() for t in self.values)


def score_shard(rows: ShardBatches, model, device: torch.device,
                on_tokens: Callable[[int], None]) -> pa.Table:
    """Stage: every batch through the model, outputs scattered back to file order -> one PART_SCHEMA table.

    A batch is queued before the one before it is read back, so that on a GPU the device is always busy while
    the host scatters. Never returns NaN or inf: a non-finite output raises, naming the key and shard.
    """
    starts = np.concatenate([[0], np.cumsum(rows.T, dtype=np.int64)])  # (N+1,) flat offsets of the rows
    n = int(starts[-1])
    b, entropy = np.zeros(n, np.float32), np.zeros(n, np.float32)  # flat, row after row, nats
    top1, target_id = np.zeros(n, np.bool_), np.zeros(n, np.int32)
    flat = (b, entropy, top1, target_id)
    queued: deque[Scored] = deque()
    for index, batch in rows.batches:
        queued.append(Scored.start(model, index, batch, device))
        if len(queued) > 1:
            on_tokens(_place(queued.popleft(), starts, flat, rows))
    while queued:
        on_tokens(_place(queued.popleft(), starts, flat, rows))
    return part_table(rows, starts, *flat)


def part_table(rows: ShardBatches, starts: np.ndarray, b: np.ndarray, entropy: np.ndarray, top1: np.ndarray,
               target_id: np.ndarray) -> pa.Table:
    """One PART_SCHEMA table of a shard's flat per-token outputs (row after row, ``starts`` (N+1,) their offsets)."""
    offsets = pa.array(starts.astype(np.int32))
    derived = derived_columns(b, rows.T)  # cumsum_b, the per-example sums (float64) and t0 estimates

    def lists(values: np.ndarray, value_type: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, pa.array(values, type=value_type))

    columns = {
        "key": pa.array(rows.keys, type=pa.string()),
        "shard": pa.array([rows.shard] * len(rows.keys), type=pa.string()),
        "T": pa.array(rows.T),
        "b": lists(b, pa.float32()),
        "target_id": lists(target_id, pa.int32()),
        "entropy": lists(entropy, pa.float32()),
        "top1": lists(top1, pa.bool_()),
        "cumsum_b": lists(derived["cumsum_b"], pa.float32()),
        **scalar_arrays(derived),
        "strategy": pa.array(rows.strategies, type=pa.string()),
        "t0": pa.array(rows.t0s, type=pa.int32()),
    }
    return pa.Table.from_pydict(columns, schema=PART_SCHEMA)


def _place(scored: Scored, starts: np.ndarray, flat: tuple[np.ndarray, ...], rows: ShardBatches) -> int:
    """A batch's outputs into the shard's flat (b, entropy, top1, target_id) columns; returns its S tokens."""
    b_n, entropy_n, top1_n = scored.ready()  # (N,)
    mask = scored.batch.mask  # (B, T_max), True on each row's first T positions
    finite = np.isfinite(b_n) & np.isfinite(entropy_n)
    if not finite.all():
        bad = rows.keys[int(scored.rows[np.nonzero(mask)[0][np.argmin(finite)]])]
        raise FloatingPointError(f"non-finite surprisal or entropy for key {bad!r} in shard {rows.shard!r}: "
                                 "the checkpoint is broken; nothing was written")
    dest = (starts[scored.rows][:, None] + np.arange(mask.shape[1]))[mask]  # flat positions, row-major like [mask]
    for column, values in zip(flat, (b_n, entropy_n, top1_n, scored.batch.targets[mask])):
        column[dest] = values
    return len(dest)
