"""The training and evaluation streams over ``training/loop/batches.py``'s per-shard stages.

Training draws the global batch from ``lanes`` sample streams (MosaicML streaming's
"canonical nodes"): lane l owns the shards i with i % lanes == l, resamples them with
its own seed (WebDataset's ``ResampledShards``) and shuffles its examples in its own
buffer (and, with ``length_buckets``, hands them out in runs of similar length: ``batches.bucketed``);
every step takes the same number of examples from each lane, in lane order.
Rank r reads only its block of lanes, and its loader workers divide the rank's shard
draws between them (worker w decodes draws w, w + W, ...), so every drawn shard is read
once across the job, and the batches depend on the lanes, not on the number of ranks or
workers. One lane is the stream of a single process: resampled shards, one shuffle buffer.
Evaluation is an exact pass, shards split by node and by worker.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Callable, Iterable, Iterator, Sequence

import torch
import webdataset as wds

from tokweight.pipeline.data.errors import SampleError, Skips
from tokweight.pipeline.data.urls import FetchError
from tokweight.training.loop.batches import (Example, StreamSpec, TrainBatch, batched, bucketed, collate_examples,
                                             open_store, shard_examples, shard_label, shuffle)
from tokweight.training.loop.join import StoreMismatchError


def same_seed_everywhere() -> int:
    """ResampledShards' worker seed: 0, so every rank and worker draws the same shard sequence."""
    return 0


def worker_info() -> tuple[int, int]:
    info = torch.utils.data.get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


# ---------------------------------------------------------------- the training stream


@dataclass(frozen=True)
class DecodedShard:
    """One drawn shard of a lane: its examples in file order, the bytes read to make them, the samples
    left out, and the bad-sample or store error that stopped it (raised by the main process, so that it
    arrives as itself, not as a loader worker's traceback)."""

    lane: int
    url: str
    shard: str  # its name relative to the dataset root
    examples: list[Example]
    bytes_read: int
    skipped: dict[str, int] = field(default_factory=dict)
    error: Exception | None = None


def lane_seed(seed: int, lane: int) -> int:
    """Lane 0 runs on the stream's own seed, so that one lane is the plain single-process stream."""
    return seed + lane


def lane_draws(shards: Sequence[str], seed: int) -> Iterator[str]:
    """A lane's infinite sequence of shard draws, identical in every process that asks."""
    resampled = wds.ResampledShards(list(shards), seed=seed, worker_seed=same_seed_everywhere, deterministic=True)
    return (item["url"] for item in resampled)


def lane_urls(spec: StreamSpec, lane: int) -> tuple[str, ...]:
    """The shards lane ``lane`` owns: shard i belongs to lane i % lanes."""
    return spec.urls[lane::spec.lanes]


def rank_draws(spec: StreamSpec, lanes: range) -> Iterator[tuple[int, str]]:
    """(lane, shard url) for the given lanes, round-robin: draw j of each lane before any lane's draw j + 1."""
    draws = [lane_draws(lane_urls(spec, lane), lane_seed(spec.seed, lane)) for lane in lanes]
    for urls in zip(*draws):
        yield from zip(lanes, urls)


def shard_decoder(spec: StreamSpec) -> Callable[[int, str], DecodedShard]:
    """decode(lane, url): one shard read, joined with the store (one view per process) and encoded."""
    view = open_store(spec)

    def decode(lane: int, url: str) -> DecodedShard:
        before = view.bytes_read if view is not None else 0
        name = shard_label(spec, view, url)
        try:
            examples, skipped, size = shard_examples(spec, view, url, name)
        except (SampleError, StoreMismatchError, FetchError) as error:
            return DecodedShard(lane, url, name, [], 0, error=error)
        from_store = view.bytes_read - before if view is not None else 0
        return DecodedShard(lane, url, name, examples, size + from_store, skipped)

    return decode


class ShardDecoder(torch.utils.data.IterableDataset):
    """A rank's shard draws, decoded; loader worker w of W takes draws w, w + W, ... The loader
    returns its workers' items round-robin, so the main process sees them in draw order."""

    def __init__(self, spec: StreamSpec, lanes: range):
        super().__init__()
        self.spec, self.lanes = spec, lanes

    def __iter__(self) -> Iterator[DecodedShard]:
        worker, workers = worker_info()
        decode = shard_decoder(self.spec)
        for lane, url in islice(rank_draws(self.spec, self.lanes), worker, None, workers):
            yield decode(lane, url)


class LaneRouter:
    """Splits the decoded shards (in draw order) into one example stream per lane; raises a shard's error
    and counts its skips (once per shard, however often it is drawn)."""

    def __init__(self, decoded: Iterator[DecodedShard], lane_shards: dict[int, set[str]]):
        self.decoded = decoded
        self.pending: dict[int, deque[DecodedShard]] = {lane: deque() for lane in lane_shards}
        self.lane_shards = lane_shards  # lane -> its shard urls
        self.empty: dict[int, set[str]] = {lane: set() for lane in lane_shards}  # shards that gave no example
        self.bytes_read = 0
        self.skips = Skips()

    def examples(self, lane: int) -> Iterator[Example]:
        while True:
            while not self.pending[lane]:  # other lanes' shards wait in their queues
                self.receive(next(self.decoded))
            yield from self.pending[lane].popleft().examples

    def receive(self, shard: DecodedShard) -> None:
        if shard.error is not None:
            raise shard.error
        self.bytes_read += shard.bytes_read
        self.skips.add(shard.shard, shard.skipped)
        self.pending[shard.lane].append(shard)
        if not shard.examples:
            self.check_not_exhausted(shard)

    def check_not_exhausted(self, shard: DecodedShard) -> None:
        """A lane whose every shard gives no example would be drawn from forever: stop, saying why."""
        self.empty[shard.lane].add(shard.url)
        if self.empty[shard.lane] == self.lane_shards[shard.lane]:
            raise ValueError(f"every shard of lane {shard.lane} ({len(self.lane_shards[shard.lane])}, e.g. "
                             f"{shard.shard}) was skipped or holds no usable sample: "
                             f"{self.skips.summary_line() or 'no samples'}")


def lane_layout(spec: StreamSpec, rank: int, world: int) -> tuple[range, int]:
    """(this rank's block of lanes, examples per lane per step); refuses layouts that do not divide."""
    where = f"the train split ({len(spec.urls)} shards, first {spec.urls[0]})"
    if spec.lanes % world:
        raise ValueError(f"lanes={spec.lanes} cannot be split over {world} ranks: pass --lanes a multiple of {world}")
    if (spec.batch_size * world) % spec.lanes:
        raise ValueError(f"the global batch of {spec.batch_size * world} examples does not split evenly over "
                         f"lanes={spec.lanes}: choose a batch size or --lanes that divides it")
    if len(spec.urls) < spec.lanes:
        raise ValueError(f"lanes={spec.lanes} need at least {spec.lanes} shards, {where}: write smaller "
                         f"shards (tokweight convert --shard-size) or pass --lanes {len(spec.urls)}")
    per_rank = spec.lanes // world
    return range(rank * per_rank, (rank + 1) * per_rank), spec.batch_size * world // spec.lanes


class TrainStream:
    """Infinite batches of this rank's rows of the global batch: rows [r * B, (r + 1) * B),
    which ``global_batch.GlobalBatch`` relies on."""

    def __init__(self, spec: StreamSpec, rank: int, world: int):
        self.spec = spec
        self.lanes, self.lane_batch = lane_layout(spec, rank, world)
        self.router: LaneRouter | None = None

    @property
    def bytes_read(self) -> int:
        """Bytes of shards and store parts read so far for this rank (its loader workers included)."""
        return self.router.bytes_read if self.router is not None else 0

    @property
    def skips(self) -> Skips:
        """The samples this rank's stream left out so far, per shard (each shard counted once)."""
        return self.router.skips if self.router is not None else Skips()

    def batches(self, num_workers: int, start: int = 0) -> Iterator[TrainBatch]:
        """The batches of steps ``start``, ``start`` + 1, ...: the stream is drawn from its beginning and the
        first ``start`` steps' examples dropped uncollated, so a resumed run gets the uninterrupted run's
        batches whatever the lanes, shard draws, shuffle buffers and workers (a fast-forward: no compute,
        but every shard drawn so far is read and decoded again)."""
        lane_shards = {lane: set(lane_urls(self.spec, lane)) for lane in self.lanes}
        self.router = LaneRouter(iter(loader(ShardDecoder(self.spec, self.lanes), num_workers)), lane_shards)
        streams = [shuffle(self.router.examples(lane), self.spec.shuffle_buffer,
                           random.Random(lane_seed(self.spec.seed, lane))) for lane in self.lanes]
        if self.spec.length_buckets:  # each lane's runs of similar length, one per step
            streams = [bucketed(stream, self.lane_batch, self.spec.length_buckets,
                                random.Random(f"{lane_seed(self.spec.seed, lane)}:buckets"))
                       for stream, lane in zip(streams, self.lanes)]
        for _ in range(start):  # step by step, so that no lane runs ahead and other lanes' shards pile up
            for stream in streams:
                deque(islice(stream, self.lane_batch), maxlen=0)
        while True:
            yield collate_examples([ex for stream in streams for ex in islice(stream, self.lane_batch)],
                                   self.spec.length_groups)


class EvalStream(torch.utils.data.IterableDataset):
    """One exact pass: shards split by node and by worker, last batch partial. Each batch is preceded by
    a ``Skips`` of the samples left out while it was filled, if any, and the pass ends with the rest."""

    def __init__(self, spec: StreamSpec):
        super().__init__()
        self.spec = spec

    def __iter__(self) -> Iterator[TrainBatch | Skips]:
        urls = wds.split_by_worker(wds.split_by_node(iter(self.spec.urls)))
        view, skips = open_store(self.spec), Skips()

        def examples(url: str) -> list[Example]:
            name = shard_label(self.spec, view, url)
            kept, skipped, _ = shard_examples(self.spec, view, url, name)
            skips.add(name, skipped)
            return kept

        batches = batched(chain.from_iterable(map(examples, urls)), self.spec.batch_size, partial=True)
        return with_skips(batches, skips)


def first_lines(spec: StreamSpec, lines: int) -> Iterator[TrainBatch]:
    """The first ``lines`` samples of ``spec``'s shards in their order that the streams keep (``shard_examples``'
    rule), in batches of its size, the last partial: the same lines whichever rank or worker reads them."""
    view = open_store(spec)

    def examples(url: str) -> list[Example]:
        return shard_examples(spec, view, url, shard_label(spec, view, url))[0]

    return batched(islice(chain.from_iterable(map(examples, spec.urls)), lines), spec.batch_size, partial=True)


def with_skips(batches: Iterable[TrainBatch], skips: Skips) -> Iterator[TrainBatch | Skips]:
    """Stage: each batch preceded by what ``skips`` gathered while it was filled, the remainder last."""
    for batch in batches:
        yield from skips.drain()
        yield batch
    yield from skips.drain()


def loader(dataset: torch.utils.data.IterableDataset, num_workers: int):
    """A WebLoader over the dataset's ready items; forkserver workers (a worker forked while the parent runs
    threads can deadlock at start, cpython#112275). Its own
    generator: each iterator a loader starts draws a base seed (for its workers' RNGs, which nothing here
    reads), and a draw from torch's global RNG would shift the dropout masks of a resumed run, whose
    loader starts at another moment than the uninterrupted run's."""
    kw = dict(multiprocessing_context="forkserver", persistent_workers=False) if num_workers else {}
    return wds.WebLoader(dataset, batch_size=None, num_workers=num_workers, generator=torch.Generator().manual_seed(0),
                         **kw)
