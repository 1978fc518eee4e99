"""How much of the strategy each posterior of a trained discrete run holds. Over a split, I(z; strategy) of four
posteriors:

- q: the amortised posterior head, the one eval reports and encode writes;
- q*: the objective's own, softmax(log p - R(k) / beta) over the K decoder passes (uniform p, the run's beta);
- p(k | x, y): the decoder's likelihood posterior, softmax of -sum_t l_t(k) (uniform prior);
- argmax q: q's one-hot.

q below q* is the head's gap; q* below p(k | x, y) is the weighting's and beta's softness; p(k | x, y) below its
ceiling is the decoder copies not yet apart. Then the examples whose argmax q is not their strategy's value (the
value most of that strategy's examples take), with q and R: whether the decoders' R would put them right.

    python scripts/posterior_probe.py RUN DATA [--split test] [--show 10]
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import torch

from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.data.errors import Skips
from tokweight.training.objective.baselines import make_baseline
from tokweight.training.config.components import WeightingParams
from tokweight.training.loop.batches import StreamSpec
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.objective.estep import read_likelihood
from tokweight.training.objective.terms import reconstruction_weights
from tokweight.training.evaluation.metrics import strategy_mi
from tokweight.training.objective.loss import reconstruction
from tokweight.training.loop.run_dir import load_run
from tokweight.training.objective.schedules import Schedule
from tokweight.training.loop.stream import EvalStream, loader


@torch.no_grad()
def records(run: str, data: str, split: str) -> dict:
    """Per example of ``split``: q, q* and p(k | x, y) (N, K), R (N, K) nats, strategy and key."""
    tcfg, model, vocab, meta = load_run(run, "cpu")
    if tcfg.cvae.latent != "discrete":
        raise SystemExit(f"{run}: a {tcfg.cvae.latent} latent; the probe reads a discrete one's K passes")
    base = load_backbone(tcfg.io.baseline_source, device="cpu", template=vocab.template).model.eval()
    baseline = make_baseline("frozen", base)  # b as the store holds it (to 1e-5), for any split
    params = WeightingParams(tcfg.loss.eps, tcfg.loss.eps_inv, meta.get("dataset_mean_b"))
    at = Schedule.of(tcfg).at(meta["step"] - 1)
    spec = StreamSpec(urls=split_urls(data, split), vocab=vocab, slots=tcfg.cvae.slots,
                      block_size=model.backbone.cfg.block_size, batch_size=128, store=None, root=data,
                      on_bad_sample=tcfg.io.on_bad_sample)
    model.eval()
    rows = {"q": [], "q*": [], "p(k | x, y)": [], "R": [], "strategy": [], "key": []}
    for batch in loader(EvalStream(spec), 0):
        if isinstance(batch, Skips):  # the samples the stream left out
            continue
        out = model(batch, generator=torch.Generator().manual_seed(tcfg.optim.seed))
        pi, _ = reconstruction_weights(tcfg.loss.weighting, baseline(batch, out), batch.zfree.mask, params,
                                       tcfg.loss.token_weighted_reconstruction_weight)
        R = reconstruction(out, pi)  # (B, K) nats
        if at.reads_likelihood:  # q as the run's last step read it
            out = read_likelihood(out, R, at.estep, at.beta)
        R = R.double()
        rows["q"].append(out.post.exp())
        rows["q*"].append(torch.softmax(-R / tcfg.loss.beta, -1))
        rows["p(k | x, y)"].append(torch.softmax(-out.nll.double().sum(-1), -1))
        rows["R"].append(R)
        rows["strategy"] += list(batch.strategies)
        rows["key"] += list(batch.keys)
    return {k: v if k in ("strategy", "key") else torch.cat(v).double().numpy() for k, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("data")
    ap.add_argument("--split", default="test")
    ap.add_argument("--show", type=int, default=10, help="examples off their strategy's value to list")
    args = ap.parse_args()
    torch.set_num_threads(1)
    r = records(args.run, args.data, args.split)
    labels, q = r["strategy"], r["q"]
    if any(s is None for s in labels):
        raise SystemExit(f"{args.data}: split {args.split!r} has examples without a strategy label")
    K, H = q.shape[1], np.log(len(set(labels)))
    posteriors = {"q": q, "q* = softmax(-R/beta)": r["q*"], "p(k | x, y)": r["p(k | x, y)"],
                  "argmax q": np.eye(K)[q.argmax(1)]}
    print(f"{args.run}: {len(labels)} {args.split} examples")
    print(f"| posterior | I(z; strategy) | of log S (S = {len(set(labels))}) |\n|---|---|---|")
    for name, post in posteriors.items():
        mi = strategy_mi(post, labels)
        print(f"| {name} | {mi:.3f} | {mi / H:.3f} |")
    value = q.argmax(1)
    own = {s: Counter(value[i] for i, t in enumerate(labels) if t == s).most_common(1)[0][0] for s in set(labels)}
    off = [i for i, s in enumerate(labels) if value[i] != own[s]]
    right_by_R = sum(r["R"][i].argmin() == own[labels[i]] for i in off)
    print(f"\n{len(off)} examples off their strategy's value; R's argmin puts {right_by_R} of them right")
    for i in off[:args.show]:
        print(f"  {r['key'][i]} {labels[i]} (value {own[labels[i]]}): q {np.round(q[i], 2)}, R {np.round(r['R'][i], 2)}")


if __name__ == "__main__":
    main()
