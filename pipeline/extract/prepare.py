"""Stage one's reading stage: a shard read, validated, encoded and batched (``prepare_shard``), ready for the model.

    read_samples   tar (a local file, or a URL's bytes fetched once) -> Sample, in shard order
                   (bad samples raise or are counted)
    drop_later_occurrences   Sample -> Sample: keys an earlier shard of the run has are duplicates
    encode         Sample -> Encoded: z-free ids, layout, position in the shard (rows tokenized in batches)
    ShardBatches   Encoded -> batches of similar length (pipeline.data.bucketing), collated into numpy arrays

Nothing here imports torch or transformers: extraction's reader process (``pipeline.extract.reader``)
runs it with the tokenizers library alone (``pipeline.tokens.tokenizer_ids``), and the model's process makes
tensors of the arrays it receives (``Batch.of``, no copy).
"""

from __future__ import annotations

import tarfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np

from tokweight.pipeline.data.bucketing import bucket
from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.tokens.rendering import Check
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import iter_shard, scan_shard, tar_keys
from tokweight.pipeline.tokens.templates import BatchArrays, Layout, check_length, collate_arrays, template_ids_many
from tokweight.pipeline.extract.config import Retry
from tokweight.pipeline.data.urls import fetch

if TYPE_CHECKING:
    from tokweight.pipeline.extract.plan import Task
    from tokweight.pipeline.tokens.vocab import Vocab


@dataclass(frozen=True)
class Encoded:
    index: int  # position among the shard's kept samples: the row order of the part
    sample: Sample
    ids: list[int]  # z-free template ids
    layout: Layout

    @property
    def scored_length(self) -> int:
        """Tokens the model must see: up to the last position whose logits predict S (not </y> <eos>)."""
        return self.layout.s_logit_positions()[-1] + 1


ErrorHandler = Callable[[SampleError], None] | None


def read_samples(path: Path | str, shard: str, on_error: ErrorHandler,
                 members: list[tarfile.TarInfo] | None = None, data: bytes | None = None) -> Iterator[Sample]:
    """Stage: one shard's valid samples in file order (shards.iter_shard does the per-sample checks,
    dotted keys included). members: ``scan_shard(path)`` if the caller has scanned the tar already;
    data: the bytes of the URL ``path``, fetched once (``read_input``)."""
    for _, sample in iter_shard(path, on_error=on_error, members=members, name=shard, data=data):
        yield sample


def drop_later_occurrences(samples: Iterable[Sample], duplicates: dict[str, str], shard: str,
                           skips: ShardSkips | InOrder | None) -> Iterator[Sample]:
    """Stage: samples whose key an earlier shard of the run has (``extract_plan.cross_shard_duplicates``)
    are left out, counted as 'duplicate-key'; under 'error' (``skips`` None) the plan has raised already."""
    for sample in samples:
        if sample.key not in duplicates:
            yield sample
            continue
        error = SampleError("duplicate-key", f"key also occurs in the earlier shard {duplicates[sample.key]}",
                            key=sample.key, shard=shard)
        if skips is None:
            raise error
        skips.later_occurrence(error)


ENCODE_ROWS = 1024  # samples encoded together: a chat or string template's rows go to the tokenizer in one call


def encode(samples: Iterable[Sample], vocab: Vocab, block_size: int, shard: str, on_error: ErrorHandler,
           reading: InOrder | None = None) -> Iterator[Encoded]:
    """Stage: samples -> z-free ids, ``ENCODE_ROWS`` at a time (``templates.template_ids_many``); unknown symbols
    and too-long sequences are bad samples. Bad samples come out in file order: the samples read before a bad one
    that the reading stages found (held back by ``reading``, or raised) are encoded before it is passed on."""
    counter = iter(range(1 << 62))  # Encoded.index: position among the kept samples
    held: list[Sample] = []
    upstream = iter(samples)
    while True:
        try:
            sample = next(upstream, None)
        except SampleError:  # the 'error' policy: the reading stages raise, after the samples before
            yield from _encoded(held, vocab, block_size, shard, on_error, counter)
            raise
        if sample is None or len(held) == ENCODE_ROWS or (reading is not None and reading.waiting):
            yield from _encoded(held, vocab, block_size, shard, on_error, counter)
            held = []
            if reading is not None:
                reading.release()
        if sample is None:
            return
        held.append(sample)


def _encoded(samples: list[Sample], vocab: Vocab, block_size: int, shard: str, on_error: ErrorHandler,
             counter: Iterator[int]) -> Iterator[Encoded]:
    results = template_ids_many(vocab, [s.x for s in samples], [s.y for s in samples], [s.key for s in samples])
    for sample, result in zip(samples, results):
        try:
            if isinstance(result, SampleError):
                raise result
            ids, layout = result
            check_length(len(ids), block_size, key=sample.key)
        except SampleError as error:
            error = error.located(shard=shard)
            if on_error is None:
                raise error from None
            on_error(error)
            continue
        yield Encoded(next(counter), sample, ids, layout)


class InOrder:
    """The reading stages' error handler in front of ``ShardSkips`` while ``encode`` holds samples back: a bad
    sample they find waits until the samples read before it are encoded, so that bad samples are counted, and
    their keys listed, in file order."""

    def __init__(self, skips: ShardSkips):
        self.skips = skips
        self.waiting: list[tuple[Callable[[SampleError], None], SampleError]] = []

    def __call__(self, error: SampleError) -> None:
        self.waiting.append((self.skips, error))

    def later_occurrence(self, error: SampleError) -> None:
        self.waiting.append((self.skips.later_occurrence, error))

    def release(self) -> None:
        for report, error in self.waiting:
            report(error)
        self.waiting.clear()


@dataclass
class ShardBatches:
    """One shard's kept samples ready for the model: per-row columns in file order, and the batches.

    Built where the shard is read (possibly a reader process), so that the model's
    process receives plain arrays, no per-sample objects.
    """

    shard: str  # name relative to the data root
    keys: list[str]  # (N,) file order
    strategies: list[str | None]
    t0s: list[int | None]
    T: np.ndarray  # (N,) int32, |S| per row
    batches: list[tuple[np.ndarray, BatchArrays]]  # (rows (B,) int64 indices into the N rows, collated batch)

    @classmethod
    def build(cls, shard: str, encoded: list[Encoded], batch_tokens: int) -> "ShardBatches":
        """Bucket by scored length (pipeline.data.bucketing) and collate each bucket."""
        batches = [(np.array([e.index for e in items], dtype=np.int64),
                    collate_arrays([e.ids for e in items], [e.layout for e in items]))
                   for items in bucket(encoded, batch_tokens, lambda e: e.scored_length)]
        return cls(shard, [e.sample.key for e in encoded], [e.sample.strategy for e in encoded],
                   [e.sample.t0 for e in encoded], np.array([e.layout.T for e in encoded], dtype=np.int32), batches)


class ShardSkips:
    """The 'skip' policy's error handler for one shard: bad samples per reason, and their keys per
    reason, which the part's manifest entry records so that training skips exactly these."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.keys: dict[str, list[str]] = {}  # reason -> keys in file order
        self.extra_copies = 0  # a duplicate key's further copies inside the shard: not samples of their own

    def __call__(self, error: SampleError) -> None:
        self._count(error)
        self.extra_copies += error.reason == "duplicate-key"  # iter_shard's only duplicates: inside the shard

    def later_occurrence(self, error: SampleError) -> None:
        """A sample whose key an earlier shard has: a sample of this tar, skipped."""
        self._count(error)

    def _count(self, error: SampleError) -> None:
        self.counts[error.reason] += 1
        if error.key is not None:
            self.keys.setdefault(error.reason, []).append(error.key)

    def samples(self) -> int:
        """Samples of the tar left out."""
        return sum(self.counts.values()) - self.extra_copies


@dataclass
class PreparedShard:
    """A shard read, encoded and batched (or found truncated, under 'skip'), ready for the model."""

    task: Task
    rows: ShardBatches | None  # None: a truncated tar skipped whole
    skipped: Counter  # bad samples per reason
    skipped_keys: dict[str, list[str]]  # their keys, per reason
    in_tar: int  # samples in the tar: rows + skipped (a duplicate's extra copies are not samples)
    checks: list[Check] = field(default_factory=list)  # rows a reader process rendered once, to be rendered
    # per row where transformers is (``TokenizerVocab.verify``) before anything of the shard is written


def read_input(task: Task, retry: Retry) -> tuple[Task, bytes | None]:
    """(the task, None) for a local tar; for a URL its bytes, fetched once, and the task with their size and
    sha256. A URL read before (its size and sha256 known) must give the same bytes: ShardChangedError."""
    shard = task.shard
    if shard.url is None:
        return task, None
    fetched = fetch(shard.url, retry, None if shard.sha256 is None else (shard.size, shard.sha256))
    return replace(task, shard=replace(shard, size=fetched.size, sha256=fetched.sha256)), fetched.data


def prepare_shard(task: Task, vocab: Vocab, block_size: int, policy: str, batch_tokens: int,
                  retry: Retry = Retry()) -> PreparedShard:
    """Read, encode and batch one shard. A truncated tar raises, or under 'skip' is marked whole."""
    skips = None if policy == "error" else ShardSkips()
    reading = None if skips is None else InOrder(skips)  # the reading stages' bad samples, in order with encode's
    name = task.shard.name
    task, data = read_input(task, retry)  # a URL's fault raises FetchError, whatever the policy
    try:
        members = scan_shard(task.shard.source if data is None else data, name)
        samples = read_samples(task.shard.source, name, reading, members, data)  # stream: Sample, file order
        samples = drop_later_occurrences(samples, task.duplicates, name, reading)  # keys unique across shards
        encoded = list(encode(samples, vocab, block_size, name, skips, reading))  # Encoded, file order
    except SampleError as error:
        if error.reason != "truncated-shard" or skips is None:
            raise
        return PreparedShard(task, None, Counter(), {}, 0, unchecked(vocab))
    skips = ShardSkips() if skips is None else skips
    in_tar, _ = tar_keys([m.name for m in members])
    if len(encoded) + skips.samples() != in_tar:
        raise RuntimeError(f"shard {name!r}: {in_tar} samples in the tar but {len(encoded)} read + "
                           f"{skips.samples()} skipped; refusing to write a part that lacks samples")
    rows = ShardBatches.build(name, encoded, batch_tokens)
    return PreparedShard(task, rows, skips.counts, skips.keys, in_tar, unchecked(vocab))


def unchecked(vocab: Vocab) -> list[Check]:
    """The rows the vocabulary rendered once and marked to be checked where transformers is; a vocabulary that
    checks them itself (``TokenizerVocab``) or renders nothing leaves none."""
    take = getattr(vocab, "take_unchecked", None)
    return [] if take is None else take()
