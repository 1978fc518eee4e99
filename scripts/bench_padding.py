"""Padding against batch composition: why training batches are not length-bucketed by default, and what running a
batch in length groups (``io.length_groups``) leaves.

For each synthetic kind's preset at K = 4 (the permutations, lexical, format, procedure), the training split's
examples through the training stream's own stages (``batches.encode``, ``shuffle``, ``bucketed``, batches of 32),
shuffled only and length-bucketed (``io.length_buckets`` 16), and for each:

- padding: the share of the z-conditioned passes' tokens that are padding (each batch pads to its longest); for the
  shuffled batches also run in ``io.length_groups`` groups (``batches.length_groups``: the same batches, each group
  padded to its own longest);
- the batches' composition: the largest share one strategy holds in a batch, the strategies a batch holds, and the
  batches that hold one strategy alone. The objective's batch-coupled terms (the E-step's balance over a batch,
  free bits' batch mean of the KL) read a batch as a sample of the task.

    python scripts/bench_padding.py [--batches 16] [--batch-size 32] [--groups 4]

Where strategies write lines of different lengths (the kinds that write different things), a length is nearly a
strategy, so the buckets that remove the padding also sort the batches by strategy; the groups leave the batches as
they are.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from itertools import islice

from tokweight.config_files import preset_config
from tokweight.pipeline.data.synth import SynthConfig, generate, kind_strategies
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.training.config.train import GPU_LENGTH_GROUPS, IOConfig
from tokweight.training.loop.batches import bucketed, encode, length_groups, shuffle

KINDS = ("default", "lexical", "format", "procedure")
"""The synth presets measured: ``default`` is the permutation task every other table uses."""


def examples(preset: str, k: int):
    """The preset's training split at K = ``k`` as Examples (the built-in template, one latent slot)."""
    kind = preset_config(SynthConfig, "synth", preset).kind
    cfg = preset_config(SynthConfig, "synth", preset, strategies=list(kind_strategies(kind)[:k]))
    vocab = Vocab(tuple(cfg.symbols()))
    return list(encode((("synth", s) for s in generate(cfg, "train")), vocab, slots=1, block_size=4096))


def batch_stats(stream, batch_size: int, groups: int = 1) -> dict:
    """Padding share and composition over the stream's full batches, each run in up to ``groups`` length groups."""
    it, tops, kinds, pure, computed, real = iter(stream), [], [], 0, 0, 0
    while len(batch := list(islice(it, batch_size))) == batch_size:
        counts = Counter(ex.strategy for ex in batch)
        tops.append(max(counts.values()) / batch_size)
        kinds.append(len(counts))
        pure += len(counts) == 1
        lengths = [len(ex.zcond) for ex in batch]
        computed += sum(len(rows) * max(lengths[i] for i in rows) for rows in length_groups(lengths, groups))
        real += sum(lengths)
    n = len(tops)
    return {"padding": 1 - real / computed, "top": sum(tops) / n, "strategies": sum(kinds) / n, "pure": pure / n,
            "batches": n}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=16, help="io.length_buckets: batches drawn and bucketed at a time")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--groups", type=int, default=GPU_LENGTH_GROUPS, help="io.length_groups for the grouped column")
    args = ap.parse_args()
    t = time.perf_counter()
    print("| task | K | mean y length per strategy | batches | padding, shuffled / bucketed / shuffled in groups | "
          "largest strategy share in a batch | strategies per batch | one-strategy batches |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in KINDS:
        data = examples(preset, args.k)
        count, total = Counter(ex.strategy for ex in data), Counter()
        for ex in data:
            total[ex.strategy] += ex.layout.n
        shuffled = lambda: shuffle(data, IOConfig.shuffle_buffer, random.Random(0))  # the training stream's buffer
        plain = batch_stats(shuffled(), args.batch_size)
        sorted_ = batch_stats(bucketed(shuffled(), args.batch_size, args.batches, random.Random(1)), args.batch_size)
        grouped = batch_stats(shuffled(), args.batch_size, args.groups)
        lengths = ", ".join(f"{s} {total[s] / n:.1f}" for s, n in count.items())
        print(f"| {preset} | {args.k} | {lengths} | {plain['batches']} | {plain['padding']:.1%} / "
              f"{sorted_['padding']:.1%} / {grouped['padding']:.1%} | {plain['top']:.3f} / {sorted_['top']:.3f} | "
              f"{plain['strategies']:.2f} / {sorted_['strategies']:.2f} | {plain['pure']:.3f} / {sorted_['pure']:.3f} |")
    print(f"({time.perf_counter() - t:.0f} s; io.length_buckets {args.batches}, io.length_groups {args.groups}, "
          f"batch {args.batch_size})")


if __name__ == "__main__":
    main()
