"""Where a run's labelled lines ended: each labelled training line (``estep.labelled``'s, the same hash of the key the
run used) decoded greedily under every latent value, against the value its label was fixed to at the end (the
checkpoint's table under ``estep.label_map`` "matched", else value k for label k).

    python scripts/label_probe.py RUN DATA [--lines 100]

Prints, per label, how many of its first ``--lines`` labelled lines each value reproduces exactly, and how many are
reproduced under the label's own value; the same for as many unlabelled lines, which show the run's code.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch

from tokweight.pipeline.data.labels import load_labels
from tokweight.pipeline.data.shards import iter_samples
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.decoding.decode import greedy_decode, latent_values
from tokweight.training.evaluation.evaluate import reference_tokens
from tokweight.training.loop.run_dir import load_run
from tokweight.training.objective.estep import labelled_indices
from tokweight.training.objective.label_values import LabelValues


def label_values(cfg, meta: dict, labels: int) -> list[int]:
    """The value each label's lines were fixed to at the run's last checkpoint."""
    if cfg.estep.label_map == "matched" and meta.get("label_values") is not None:
        return LabelValues.start(labels, cfg.cvae.k, torch.device("cpu"), meta["label_values"]).values().tolist()
    return list(range(labels))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("--lines", type=int, default=100, help="labelled lines (and as many unlabelled) to decode")
    args = ap.parse_args()
    cfg, model, vocab, meta = load_run(args.run)
    share = cfg.estep.labelled
    if not share:
        raise SystemExit(f"{args.run}/config.json: estep.labelled is 0, the run fixed no labelled line")
    names = load_labels(args.data).strategies
    fixed = label_values(cfg, meta, len(names))
    labelled, unlabelled = [], []
    for _, s in iter_samples(split_urls(str(args.data), "train")):
        if s.strategy is None:
            continue
        picked = labelled_indices([s.strategy], names, [s.key], share)[0] >= 0  # the run's own rule
        (labelled if picked else unlabelled).append(s)
        if len(labelled) >= args.lines and len(unlabelled) >= args.lines:
            break
    z, slot_ids = latent_values(model, None)
    V = z.shape[0]
    print(f"labels -> values at the last checkpoint ({cfg.estep.label_map}): "
          + ", ".join(f"{n} -> {v}" for n, v in zip(names, fixed)))
    for name, samples in (("labelled", labelled[:args.lines]), ("unlabelled", unlabelled[:args.lines])):
        refs = [reference_tokens(vocab, s) for s in samples]
        outputs = greedy_decode(model, vocab, samples, z, slot_ids, max(map(len, refs)) + 2)
        under, own = Counter(), 0
        for i, (s, ref) in enumerate(zip(samples, refs)):
            hits = tuple(v for v in range(V) if outputs[i * V + v] == ref)
            under[(s.strategy, hits)] += 1
            own += fixed[names.index(s.strategy)] in hits
        print(f"{name} lines: {len(samples)}, reproduced under their label's value: {own}")
        for (strategy, hits), n in sorted(under.items()):
            print(f"  {strategy}: under {list(hits) or 'no value'}: {n}")


if __name__ == "__main__":
    main()
