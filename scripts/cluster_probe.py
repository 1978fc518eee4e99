"""Does a base model's own representation of a line already group lines by strategy? For a tokweight base
checkpoint and a synth dataset: the base's final hidden states of the z-free template over a split, pooled two ways
(the mean over the states that predict S, which the posterior head reads by default, and the state at the last
token), standardised, and eval's k-means (k-means++ starts, 10 seeds, the lowest inertia kept) with K clusters; then
I(cluster; strategy) against log K, the clusters' purity and the cluster x strategy counts.

A grouping the base already holds is one a posterior could hand the decoder's values the same way on every input;
where it holds none, the values' code has to come from the decoders alone.

    python scripts/cluster_probe.py CHECKPOINT DATA [--split train] [--examples 2048]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from tokweight.pipeline.data.errors import Skips
from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.tokens.templates import gather_s
from tokweight.training.loop.batches import StreamSpec
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.evaluation.metrics import best_kmeans, contingency, contingency_mi
from tokweight.training.loop.stream import EvalStream, loader


@torch.no_grad()
def pooled_states(checkpoint: str, data: str, split: str, examples: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """{"mean over S": (N, d), "last token": (N, d)} of the base's final states, and the N examples' strategies."""
    ck = load_backbone(checkpoint, device="cpu")
    model = ck.model.eval()
    spec = StreamSpec(urls=split_urls(data, split), vocab=ck.vocab, slots=1, block_size=model.cfg.block_size,
                      batch_size=128, store=None, root=data)
    pools, strategies = {"mean over S": [], "last token": []}, []
    for batch in loader(EvalStream(spec), 0):
        if isinstance(batch, Skips):
            continue
        free = batch.zfree
        h = model.hidden(free.input_ids)  # (B, L, d)
        mask = free.mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        pools["mean over S"].append(((gather_s(h, free.logit_pos) * mask).sum(1) / mask.sum(1)).numpy())
        last = (free.input_ids != ck.vocab.pad_id).sum(1) - 1  # (B,)
        pools["last token"].append(h[torch.arange(len(last)), last].numpy())
        strategies += list(batch.strategies)
        if len(strategies) >= examples:
            break
    n = min(examples, len(strategies))
    return {k: np.concatenate(v)[:n] for k, v in pools.items()}, strategies[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("data")
    ap.add_argument("--split", default="train")
    ap.add_argument("--examples", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pools, strategies = pooled_states(args.checkpoint, args.data, args.split, args.examples)
    k = len(set(strategies))
    print(f"{args.checkpoint} on {len(strategies)} {args.split} lines of {args.data}, K = {k}")
    for pool, X in pools.items():
        X = (X - X.mean(0)) / (X.std(0) + 1e-6)
        _, assigned = best_kmeans(X, k, 10)
        table, names = contingency(strategies, assigned, k)  # (clusters, strategies) counts
        print(f"{pool}: I(cluster; strategy) {contingency_mi(table):.3f} of log K {math.log(k):.3f}, "
              f"purity {table.max(1).sum() / table.sum():.3f}; clusters x ({', '.join(names)}): "
              + "; ".join(" ".join(str(int(n)) for n in row) for row in table))


if __name__ == "__main__":
    main()
