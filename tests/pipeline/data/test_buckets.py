"""Length-bucketed training batches (``data.bucketed``, ``IOConfig.length_buckets``): the stage on a list, then
the training stream with it: less padding, every example still drawn, resumes at any step, two ranks read the
one-process batches."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import islice
from types import SimpleNamespace

from tests.training.loop.test_stream import keys, spec_of
from tokweight.training.loop.batches import bucketed
from tokweight.training.loop.stream import TrainStream


def example(i: int, length: int, z_pos: int):
    return SimpleNamespace(key=i, zcond=(0,) * length, layout=SimpleNamespace(z_pos=z_pos))


def test_the_stage_hands_out_each_example_once_in_runs_of_sorted_length():
    rng = random.Random(0)
    items = [example(i, rng.randint(5, 40), rng.randint(3, 9)) for i in range(50)]
    out = list(bucketed(items, 4, 3, random.Random(1)))
    assert sorted(ex.key for ex in out) == list(range(50))  # each once, the last take short (50 = 4 * 12 + 2)
    for start in range(0, 48, 12):  # a take of 3 runs: its runs are the sorted take cut in fours, in some order
        take = sorted(items[start: start + 12], key=lambda ex: (len(ex.zcond), ex.layout.z_pos))
        runs = [take[i: i + 4] for i in range(0, 12, 4)]
        got = [out[i: i + 4] for i in range(start, start + 12, 4)]
        assert sorted(got, key=lambda r: r[0].key) == sorted(runs, key=lambda r: r[0].key)
    assert [ex.key for ex in out] == [ex.key for ex in bucketed(items, 4, 3, random.Random(1))]  # seeded


def padded_share(batches) -> float:
    """Padding among the tokens of the batches' z-conditioned passes."""
    computed = real = 0
    for batch in batches:
        computed += batch.zcond.input_ids.numel()
        real += int((batch.zcond.input_ids != 0).sum())
    return 1 - real / computed


def test_bucketed_streams_pad_less_resume_exactly_and_split_over_ranks(tiny, tiny_store):
    one_lane = spec_of(tiny, tiny_store)
    plain = list(islice(TrainStream(one_lane, 0, 1).batches(0), 24))
    buckets = list(islice(TrainStream(replace(one_lane, length_buckets=8), 0, 1).batches(0), 24))
    assert padded_share(buckets) < 0.5 * padded_share(plain)
    for take in range(3):  # a take of 8 batches: the examples the plain stream's 8 batches hold, rearranged
        runs = slice(8 * take, 8 * take + 8)
        assert sorted(k for b in buckets[runs] for k in b.keys) == sorted(k for b in plain[runs] for k in b.keys)
    bucketed_spec, steps = replace(spec_of(tiny, tiny_store, lanes=2), length_buckets=4), 24
    whole = keys(TrainStream(bucketed_spec, 0, 1), steps=steps)
    for start in (1, 5, 17):  # a resumed run's fast-forward: inside a take of runs and at its edge
        resumed = [b.keys for b in islice(TrainStream(bucketed_spec, 0, 1).batches(0, start=start), steps - start)]
        assert resumed == whole[start:]
    ranks = [TrainStream(replace(bucketed_spec, batch_size=4), r, 2) for r in (0, 1)]
    per_rank = [keys(stream, steps=steps) for stream in ranks]
    assert [a + b for a, b in zip(*per_rank)] == whole
