"""Training data: WebDataset shards -> (store join) -> encoded examples -> TrainBatch.

A stream is a chain of generator stages, each ``Iterator[A] -> Iterator[B]``; the first
three run per shard (``shard_examples``):

    shard url  -> (url, Sample)                       pipeline.data.shards.iter_shard (a URL fetched once, its
                                                      bytes checked against the store's sha256)
               -> (url, Sample, stored row | None)    join_store: by (__url__, __key__), before any shuffle
               -> Example                             encode: templates, T and echoed-id checks
               -> Example (shuffled)                  shuffle (seeded)
               -> Example (in runs of similar length) bucketed (training, where asked; seeded)
               -> TrainBatch                          batched + collate_examples (its rows also in length groups,
                                                      where asked: ``Groups``)

Bad samples follow one rule in every stage (``BadSamples``): what extraction skipped, as the
store's manifest records it (a tar skipped whole, or keys per reason), is skipped here too,
whatever the stream's policy; any other bad sample raises a SampleError naming its key and
the shard (relative to the dataset root, as extraction names it), or under the policy
'skip' is left out. Skips are counted per shard and reason (``pipeline.data.errors.Skips``).

The training stream over these stages (lanes, ranks, workers) is ``stream.py``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import iter_shard, shard_name
from tokweight.pipeline.data.splits import data_root
from tokweight.pipeline.tokens.templates import Batch, Layout, check_length, collate, s_targets, template_ids, to_device
from tokweight.pipeline.extract.config import Retry
from tokweight.pipeline.data.urls import ShardChangedError, fetch, is_url
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.training.loop.join import (REMEDY, BadSamples, StoredShard, StoreMismatchError, StoreRef, checked_b,
                                         join_store, stored_shard)


# ---------------------------------------------------------------- examples


@dataclass(frozen=True)
class Example:
    """One sample in both templates; ``b`` (T,) float32 nats over S when joined with the store."""

    key: str
    url: str
    zfree: tuple[int, ...]
    zcond: tuple[int, ...]  # latent slots hold a placeholder, written per copy by the CVAE
    layout: Layout  # of the z-conditioned sequence; its ``zfree`` is the z-free one
    strategy: str | None
    t0: int | None
    b: np.ndarray | None = field(default=None, compare=False)


def encode(items: Iterable[tuple], vocab: Vocab, slots: int, block_size: int,
           fingerprints: tuple[str, str] | None = None, on_error: BadSamples | None = None) -> Iterator[Example]:
    """(url, Sample[, row]) -> Example, checking T and the echoed S token ids of every stored row.

    fingerprints: (store, baseline) named in errors. on_error: gets an unknown symbol or a too-long
    sequence (None: they raise); errors name its shard, else the url.
    """
    placeholder = [vocab.latent_id(0)] * slots
    for url, sample, *row in items:
        try:
            zfree, free_layout = template_ids(vocab, sample.x, sample.y, key=sample.key)
            zcond, layout = template_ids(vocab, sample.x, sample.y, placeholder, key=sample.key)
            check_length(len(zcond), block_size, key=sample.key)
        except SampleError as error:
            if on_error is None:
                raise
            on_error(error)
            continue
        b = None
        if row and row[0] is not None:
            shard = url if on_error is None else on_error.shard
            b = checked_b(row[0], s_targets(zfree, free_layout), sample.key, shard, fingerprints)
        yield Example(sample.key, url, tuple(zfree), tuple(zcond), layout, sample.strategy, sample.t0, b)


@dataclass(frozen=True)
class Widths:
    """Where a step slices its batch, as host ints counted from the examples when the batch is built, so that
    the step reads nothing back from the device (SPEC §6: a step that does not log makes no host sync)."""

    prefix: int  # the longest shared prefix <bos> <x> x </x>, the tokens before <z>: max z_pos
    free_suffix: int  # the longest z-free sequence past its prefix: max(len(zfree) - z_pos)
    cond_suffix: int  # the longest z-conditioned sequence past its prefix: max(len(zcond) - z_pos)

    @classmethod
    def of(cls, examples: Sequence[Example]) -> Widths:
        z_pos = [ex.layout.z_pos for ex in examples]
        return cls(max(z_pos), max(len(ex.zfree) - z for ex, z in zip(examples, z_pos)),
                   max(len(ex.zcond) - z for ex, z in zip(examples, z_pos)))


@dataclass(frozen=True)
class TrainBatch:
    """A batch in both templates. Per-token tensors are (B, T_max) over S.

    zfree, zcond: templates.Batch (input_ids, logit_pos, targets, mask; s_tokens); same targets and mask.
    z_pos:     (B,) position before the first slot in zcond (<z>): its logits are the discrete prior
    slot_pos:  (B, M) positions of the latent slots in zcond
    last_pos:  (B,) last position of the z-free sequence (<eos>, the template's tail): the posterior reads it
    b:         (B, T_max) float32 nats over S from the store, 0 where masked; None without a store
    t0:        (B,) long ground-truth t0, -1 where unknown
    widths:    host ints: where a step slices the tensors (``Widths``)
    groups:    the same rows in groups of similar length, each padded to its own longest (``Groups``), for a
               forward that runs group by group; None: one group, the batch
    """

    zfree: Batch
    zcond: Batch
    z_pos: torch.Tensor
    slot_pos: torch.Tensor
    last_pos: torch.Tensor
    b: torch.Tensor | None
    t0: torch.Tensor
    keys: tuple[str, ...]
    urls: tuple[str, ...]
    strategies: tuple[str | None, ...]
    widths: Widths
    groups: Groups | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def to(self, device) -> "TrainBatch":
        """The batch on ``device``. To a GPU through pinned host memory, without blocking: the host goes on
        queueing the step's kernels while the copies run, and nothing waits for them but those kernels."""
        move = lambda t: maybe_to_device(t, device)
        return TrainBatch(self.zfree.to(device), self.zcond.to(device), move(self.z_pos), move(self.slot_pos),
                          move(self.last_pos), move(self.b), move(self.t0), self.keys, self.urls, self.strategies,
                          self.widths, None if self.groups is None else self.groups.to(device))


def maybe_to_device(t: torch.Tensor | None, device):
    """``to_device``, None staying None."""
    return None if t is None else to_device(t, device)


@dataclass(frozen=True)
class Groups:
    """A batch's rows in groups of similar length, each collated on its own, so that a forward run group by group
    (``CVAE.forward``) pads each group's rows to the group's longest instead of the batch's. The batch itself (its
    rows, their order, what the objective reads) is unchanged: only the passes' padding is.

    parts:  the groups as batches, shortest first
    order:  (B,) long, the batch's rows in the groups' order (group 0's rows, then group 1's, ...); None: one group
    place:  (B,) long, where each of the batch's rows sits in that order (``order``'s inverse); None: one group
    """

    parts: tuple[TrainBatch, ...]
    order: torch.Tensor | None = None
    place: torch.Tensor | None = None

    @classmethod
    def of(cls, batch: TrainBatch) -> "Groups":
        """The batch's groups: its own, or the batch itself as the one group (``split`` and ``merge`` then pass
        their tensors through)."""
        return batch.groups if batch.groups is not None else cls((batch,))

    def to(self, device) -> "Groups":
        return Groups(tuple(p.to(device) for p in self.parts), maybe_to_device(self.order, device),
                      maybe_to_device(self.place, device))

    def split(self, t: torch.Tensor | None, copies: int = 1) -> list:
        """Rows of the batch, ``copies`` consecutive rows per example ((B * copies, ...)) -> each group's rows, in
        the group's order; None -> None per group."""
        if t is None or self.order is None:
            return [t] * len(self.parts)
        rows = t.view(-1, copies, *t.shape[1:]).index_select(0, self.order)
        return [g.flatten(0, 1) for g in rows.split([len(p) for p in self.parts])]

    def merge(self, parts: Sequence, width: int | None = None):
        """Each group's (b_j, ...) rows -> the batch's (B, ...) in its own order; ``width``: the last dimension
        padded with zeros to it (per-token values over S, 0 where masked). Tuples merge field by field; None stays
        None."""
        first = parts[0]
        if first is None or self.order is None:
            return first
        if isinstance(first, tuple):
            return tuple(self.merge(field, width) for field in zip(*parts))
        if width is not None:
            parts = [torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in parts]
        return torch.cat(parts).index_select(0, self.place)


def length_groups(lengths: Sequence[int], groups: int) -> list[list[int]]:
    """The rows 0..B-1 of ``lengths`` in at most ``groups`` groups that pad least: sorted by length (stably) and cut
    where the sum over groups of rows x longest row is smallest, the fewest groups among equals (dynamic programming
    over the cuts between two lengths: a cut inside a run of one length never pads less)."""
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    ordered = np.asarray(lengths, dtype=np.int64)[order]
    cuts = np.concatenate([[0], np.flatnonzero(np.diff(ordered)) + 1, [len(ordered)]])  # where a group may end
    longest = np.concatenate([[0], ordered[cuts[1:] - 1]])  # longest[a]: the longest row before cut a
    later = np.triu(np.ones((len(cuts), len(cuts)), dtype=bool))  # (a, c) with c >= a: not a group
    costs, froms = [(cuts * longest).astype(np.float64)], [np.zeros(len(cuts), dtype=np.int64)]  # one group: from 0
    for _ in range(min(groups, len(cuts) - 1) - 1):  # one more group: the best cut c < a to start it at
        total = costs[-1][None, :] + (cuts[:, None] - cuts[None, :]) * longest[:, None]  # (a, c)
        total[later] = np.inf
        froms.append(total.argmin(1))
        costs.append(total[np.arange(len(cuts)), froms[-1]])
    n = min(range(len(costs)), key=lambda j: (costs[j][-1], j))  # the fewest groups among the least padding
    bounds, a = [], len(cuts) - 1
    for j in range(n, -1, -1):
        c = int(froms[j][a])
        bounds.append((int(cuts[c]), int(cuts[a])))
        a = c
    return [order[lo:hi].tolist() for lo, hi in reversed(bounds) if hi > lo]


def collate_examples(examples: Sequence[Example], groups: int = 1) -> TrainBatch:
    """The examples as one batch; with ``groups`` > 1, their rows also in up to that many groups of similar
    length (``Groups``: the z-conditioned sequences' lengths, the passes that run K copies)."""
    batch = collate_whole(examples)
    if groups <= 1 or len(examples) < 2:
        return batch
    rows = length_groups([len(ex.zcond) for ex in examples], groups)
    if len(rows) == 1:
        return batch
    order = torch.tensor([i for r in rows for i in r])
    parts = tuple(collate_whole([examples[i] for i in r], with_b=False) for r in rows)  # the passes read no b
    return replace(batch, groups=Groups(parts, order, torch.argsort(order)))


def collate_whole(examples: Sequence[Example], with_b: bool = True) -> TrainBatch:
    """The examples as one batch, padded to its longest row; ``with_b``: with their stored b, where they all have
    one."""
    layouts = [ex.layout for ex in examples]
    zfree = collate([ex.zfree for ex in examples], [lay.zfree for lay in layouts])
    zcond = collate([ex.zcond for ex in examples], layouts)
    b = stored_b(examples, zfree.mask.shape) if with_b and all(ex.b is not None for ex in examples) else None
    return TrainBatch(
        zfree=zfree, zcond=zcond,
        z_pos=torch.tensor([lay.z_pos for lay in layouts]),
        slot_pos=torch.tensor([list(lay.slot_positions) for lay in layouts]),
        last_pos=torch.tensor([len(ex.zfree) - 1 for ex in examples]),
        b=b, t0=torch.tensor([-1 if ex.t0 is None else ex.t0 for ex in examples]),
        keys=tuple(ex.key for ex in examples), urls=tuple(ex.url for ex in examples),
        strategies=tuple(ex.strategy for ex in examples), widths=Widths.of(examples))


def stored_b(examples: Sequence[Example], shape: tuple[int, int]) -> torch.Tensor:
    """(B, T_max) float32 nats over S, 0 past each row's T: rows copied in numpy, one tensor made at the end
    (a tensor per row cost ten times more)."""
    b = np.zeros(shape, dtype=np.float32)
    for i, ex in enumerate(examples):
        b[i, : len(ex.b)] = ex.b
    return torch.from_numpy(b)


# ---------------------------------------------------------------- generic stages


def shuffle(items: Iterable, buffer: int, rng: random.Random) -> Iterator:
    """Reservoir shuffle with a seeded rng; buffer <= 1 passes items through."""
    pool = []
    for item in items:
        if len(pool) < buffer:
            pool.append(item)
            continue
        i = rng.randrange(buffer)
        yield pool[i]
        pool[i] = item
    rng.shuffle(pool)
    yield from pool


def bucketed(items: Iterable[Example], batch: int, batches: int, rng: random.Random) -> Iterator[Example]:
    """Stage: the examples in runs of ``batch`` of similar lengths. ``batches`` runs' worth are taken at a time,
    sorted (stably) by the z-conditioned sequence's length and then the prefix's (<z>'s position), cut into runs
    of ``batch``, and the runs handed out in an order drawn from ``rng``; a consumer that takes ``batch`` examples
    at a time gets one run, whose sequences pad to about one length. Every example is handed out once; a finite
    stream's last take may be short."""
    it = iter(items)
    while pool := list(islice(it, batch * batches)):
        pool.sort(key=lambda ex: (len(ex.zcond), ex.layout.z_pos))
        runs = [pool[i: i + batch] for i in range(0, len(pool), batch)]
        rng.shuffle(runs)
        for run in runs:
            yield from run


def batched(items: Iterable[Example], batch_size: int, *, partial: bool) -> Iterator[TrainBatch]:
    it = iter(items)
    while chunk := list(islice(it, batch_size)):
        if len(chunk) < batch_size and not partial:
            return
        yield collate_examples(chunk)


# ---------------------------------------------------------------- datasets (picklable, built inside workers)


@dataclass(frozen=True)
class StreamSpec:
    """What a loader worker needs to rebuild its stream (plain, picklable values)."""

    urls: tuple[str, ...]
    vocab: Vocab
    slots: int
    block_size: int
    batch_size: int
    store: StoreRef | None = None
    seed: int = 0
    shuffle_buffer: int = 256
    length_buckets: int = 0  # a training lane's batches drawn at a time and bucketed by length (``bucketed``); 0: off
    length_groups: int = 1  # a training batch's rows run in up to this many groups of similar length (``Groups``)
    lanes: int = 1
    root: str | None = None  # the dataset (its root, or the --data that gave its URLs) shards are named relative to
    on_bad_sample: str = "error"  # a bad sample the store does not record as skipped: "error" or "skip"
    retry: Retry = Retry()  # how a URL that fails transiently is retried

    def __post_init__(self):
        if self.on_bad_sample not in ("error", "skip"):
            raise ValueError(f"on_bad_sample must be 'error' or 'skip', got {self.on_bad_sample!r}")


def open_store(spec: StreamSpec):
    return None if spec.store is None else spec.store.open(spec.vocab)


def shard_label(spec: StreamSpec, view, url: str) -> str:
    """The shard's name in errors and counts, as extraction names it: its path relative to ``spec.root``;
    without a root, the store's name for it (relative to the root extraction read); else the url."""
    try:
        if spec.root is not None:
            return shard_name(data_root(spec.root), url)
        if view is not None:
            return view.input_for_shard(url)["name"]
    except (ValueError, KeyError):  # not below the root, or not in the store (joining it raises)
        pass
    return url



def read_bytes(spec: StreamSpec, url: str, stored: StoredShard | None) -> tuple[bytes | None, int]:
    """(a URL's bytes, fetched once, or None for a local tar; the shard's size). A URL whose bytes are not
    those its stored part was made of is a StoreMismatchError naming it."""
    if not is_url(url):
        return None, Path(url).stat().st_size
    try:
        fetched = fetch(url, spec.retry, None if stored is None else stored.digest)
    except ShardChangedError as error:
        raise StoreMismatchError(f"{error}; its stored rows are not this shard's: {REMEDY}") from None
    return fetched.data, fetched.size


def shard_examples(spec: StreamSpec, view, url: str, name: str) -> tuple[list[Example], dict[str, int], int]:
    """One shard (``name``: its ``shard_label``) read, joined with the store (``view``, None without one) and
    encoded: (its examples in file order, the samples left out per reason, the shard's bytes). A bad sample
    raises SampleError, or is skipped (``BadSamples``); a URL that cannot be read raises FetchError."""
    stored = None if view is None else stored_shard(view, url, spec.store.fingerprint)
    if stored is not None and stored.whole is not None:
        return [], {stored.whole: 1}, 0
    data, size = read_bytes(spec, url, stored)
    bad = BadSamples(name, spec.on_bad_sample, None if stored is None else stored.skipped)
    samples = iter_shard(url, on_error=bad, name=name, data=data)  # (url, Sample); bad samples go to ``bad``
    try:
        examples = list(_encoded(spec, view, stored, bad, samples))
    except SampleError as error:  # a truncated tar raises whatever the handler says
        if error.reason != "truncated-shard" or spec.on_bad_sample == "error":
            raise
        return [], {error.reason: 1}, size
    return examples, dict(bad.counts), size


def kept_samples(spec: StreamSpec, n: int) -> list[Sample]:
    """The split's first ``n`` samples that the streams keep (``shard_examples``' rule, so never one that
    extraction or the policy skipped), in shard order: what evaluation decodes."""
    view, kept = open_store(spec), []
    for url in spec.urls:
        if len(kept) >= n:
            break
        examples, _, _ = shard_examples(spec, view, url, shard_label(spec, view, url))
        keys = {ex.key for ex in examples}
        if keys:  # read again for the samples themselves: bad ones are known to be left out
            samples = iter_shard(url, on_error=lambda error: None, retry=spec.retry)
            kept += [s for _, s in samples if s.key in keys][: n - len(kept)]
    return kept


def _encoded(spec: StreamSpec, view, stored: StoredShard | None, bad: BadSamples, items) -> Iterator[Example]:
    if stored is None:
        return encode(items, spec.vocab, spec.slots, spec.block_size, on_error=bad)
    fps = (view.fingerprint, spec.store.fingerprint)
    return encode(join_store(items, stored, bad), spec.vocab, spec.slots, spec.block_size, fps, bad)
