"""The training stream divides its work: lanes, ranks and workers (training/loop/stream.py)."""

from dataclasses import replace
from itertools import islice
from pathlib import Path

import pytest

from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import write_shards
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.training.loop.batches import StreamSpec
from tokweight.training.loop.join import StoreRef
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.loop.stream import ShardDecoder, TrainStream

STEPS = 12


def spec_of(tiny, store=None, **kw) -> StreamSpec:
    data, ckpt_dir = tiny
    ckpt = load_checkpoint(ckpt_dir)
    ref = StoreRef(str(store), ckpt.fingerprint) if store else None
    return StreamSpec(urls=split_urls(data, "train"), vocab=ckpt.vocab, slots=1, block_size=ckpt.model.cfg.block_size,
                      batch_size=8, store=ref, seed=5, shuffle_buffer=32, **kw)


def keys(stream: TrainStream, workers: int = 0, steps: int = STEPS) -> list[tuple[str, ...]]:
    return [batch.keys for batch in islice(stream.batches(workers), steps)]


def test_two_ranks_together_read_the_one_process_batches(tiny, tiny_store):
    one = keys(TrainStream(spec_of(tiny, tiny_store, lanes=2), 0, 1))
    ranks = [TrainStream(replace(spec_of(tiny, tiny_store, lanes=2), batch_size=4), r, 2) for r in (0, 1)]
    per_rank = [keys(stream) for stream in ranks]
    assert [a + b for a, b in zip(*per_rank)] == one  # rank r holds rows [4r, 4r + 4) of the global batch
    assert len(set(sum(one, ()))) > 8  # the batches differ from step to step


def test_each_rank_reads_only_its_own_shards(tiny, tiny_store):
    one = TrainStream(spec_of(tiny, tiny_store, lanes=2), 0, 1)
    ranks = [TrainStream(replace(spec_of(tiny, tiny_store, lanes=2), batch_size=4), r, 2) for r in (0, 1)]
    urls = {}
    for r, stream in enumerate(ranks):
        urls[r] = {url for batch in islice(stream.batches(0), STEPS) for url in batch.urls}
    keys(one)
    assert urls[0] and urls[1] and not urls[0] & urls[1]
    assert ranks[0].bytes_read + ranks[1].bytes_read == one.bytes_read
    assert max(ranks[0].bytes_read, ranks[1].bytes_read) < 0.75 * one.bytes_read


def test_the_batches_do_not_depend_on_the_number_of_workers(tiny, tiny_store):
    spec = spec_of(tiny, tiny_store, lanes=2)
    in_process, two_workers = TrainStream(spec, 0, 1), TrainStream(spec, 0, 1)
    assert keys(in_process, 0) == keys(two_workers, 2)
    assert in_process.bytes_read == two_workers.bytes_read


def test_a_shard_drawn_again_reuses_its_parsed_store_part(tiny, tiny_store):
    spec = replace(spec_of(tiny, tiny_store), urls=spec_of(tiny).urls[:1])  # one shard: every draw is it
    tar = Path(spec.urls[0]).stat().st_size
    first, *again = [shard.bytes_read for shard in islice(iter(ShardDecoder(spec, range(1))), 3)]
    assert again == [tar, tar]  # the tar alone: its part's rows and its hash are cached
    assert 2 * tar < first < 3 * tar  # the tar read, hashed once, and its (smaller) part read once


def test_lanes_that_do_not_divide_are_refused(tiny):
    with pytest.raises(ValueError, match="cannot be split over 2 ranks"):
        TrainStream(spec_of(tiny, lanes=3), 0, 2)
    with pytest.raises(ValueError, match="does not split evenly over lanes=3"):
        TrainStream(spec_of(tiny, lanes=3), 0, 1)
    with pytest.raises(ValueError, match=r"need at least 8 shards.*--lanes 4"):
        TrainStream(spec_of(tiny, lanes=8), 0, 1)


def test_one_lane_is_the_resampled_shuffled_stream_of_one_process(tmp_path):
    """Lane 0 is WebDataset's ResampledShards on the stream's seed, then one seeded shuffle buffer."""
    import random

    import webdataset as wds

    from tokweight.training.loop.batches import shuffle
    from tokweight.training.loop.stream import same_seed_everywhere

    vocab = Vocab(("a", "b"), k_max=2)
    samples = [Sample(key=f"k{i:03d}", x=("a",), y=("b",) * (1 + i % 3)) for i in range(40)]
    urls = tuple(str(p) for p in write_shards(samples, tmp_path, shard_size=10))
    spec = StreamSpec(urls=urls, vocab=vocab, slots=1, block_size=32, batch_size=4, seed=9, shuffle_buffer=6)
    shards = wds.ResampledShards(list(urls), seed=9, worker_seed=same_seed_everywhere, deterministic=True)
    by_url = {u: [s.key for s in samples[10 * i:10 * i + 10]] for i, u in enumerate(urls)}
    drawn = (key for item in shards for key in by_url[item["url"]])
    expected = list(islice(shuffle(drawn, 6, random.Random(9)), 5 * 4))
    assert [k for batch in keys(TrainStream(spec, 0, 1), steps=5) for k in batch] == expected


@pytest.mark.parametrize("workers", [0, 1])
def test_a_stream_started_at_step_k_gives_the_batches_of_steps_k_on(tiny, tiny_store, workers):
    """The fast-forward a resumed run makes: every lane, shard draw and shuffle buffer where the uninterrupted
    stream has them. 40 steps take 160 examples from each lane, whose shards hold 128: resumes before and
    after a lane's second shard draw."""
    spec, steps = spec_of(tiny, tiny_store, lanes=2), 40
    whole = keys(TrainStream(spec, 0, 1), workers, steps=steps)
    for start in (1, 17, 33):
        resumed = [batch.keys for batch in islice(TrainStream(spec, 0, 1).batches(workers, start=start), steps - start)]
        assert resumed == whole[start:]
