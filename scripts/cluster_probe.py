"""Does a base model's own representation of a line already group lines by strategy? For a tokweight base
checkpoint and a synth dataset: the base's final hidden states of the z-free template over a split, pooled two ways
(the mean over the states that predict S, which the posterior head reads by default, and the state at the last
token), standardised, and k-means with K clusters (10 seeded starts, the lowest inertia kept); then
I(cluster; strategy) against log K, the clusters' purity and the cluster x strategy counts.

A grouping the base already holds is one a posterior could hand the decoder's values the same way on every input;
where it holds none, the values' code has to come from the decoders alone.

    python scripts/cluster_probe.py CHECKPOINT DATA [--split train] [--examples 2048]
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

import numpy as np
import torch

from tokweight.pipeline.data.errors import Skips
from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.tokens.templates import gather_s
from tokweight.training.loop.batches import StreamSpec
from tokweight.pipeline.data.splits import split_urls
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


def kmeans(X: np.ndarray, k: int, seed: int, iters: int = 100) -> tuple[np.ndarray, float]:
    """Lloyd's k-means from k rows drawn with ``seed``: (N,) assignments and the inertia."""
    rng = np.random.default_rng(seed)
    centres = X[rng.choice(len(X), k, replace=False)]
    for _ in range(iters):
        assigned = ((X[:, None] - centres[None]) ** 2).sum(-1).argmin(1)
        moved = np.stack([X[assigned == c].mean(0) if (assigned == c).any() else centres[c] for c in range(k)])
        if np.allclose(moved, centres):
            break
        centres = moved
    return assigned, float(((X - centres[assigned]) ** 2).sum())


def mutual_information(a: np.ndarray, b: np.ndarray) -> float:
    """I(a; b) in nats of two label arrays."""
    joint = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(joint, (a, b), 1)
    joint /= joint.sum()
    outer = joint.sum(1, keepdims=True) @ joint.sum(0, keepdims=True)
    nz = joint > 0
    return float((joint[nz] * np.log(joint[nz] / outer[nz])).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("data")
    ap.add_argument("--split", default="train")
    ap.add_argument("--examples", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pools, strategies = pooled_states(args.checkpoint, args.data, args.split, args.examples)
    names = sorted(set(strategies))
    y, k = np.array([names.index(s) for s in strategies]), len(names)
    print(f"{args.checkpoint} on {len(y)} {args.split} lines of {args.data}, K = {k}")
    for pool, X in pools.items():
        X = (X - X.mean(0)) / (X.std(0) + 1e-6)
        assigned = min((kmeans(X, k, seed) for seed in range(10)), key=lambda run: run[1])[0]
        counts = Counter(zip(assigned.tolist(), y.tolist()))
        purity = sum(max(counts[(c, s)] for s in range(k)) for c in range(k)) / len(y)
        print(f"{pool}: I(cluster; strategy) {mutual_information(assigned, y):.3f} of log K {math.log(k):.3f}, "
              f"purity {purity:.3f}; clusters x ({', '.join(names)}): "
              + "; ".join(" ".join(str(counts[(c, s)]) for s in range(k)) for c in range(k)))


if __name__ == "__main__":
    main()
