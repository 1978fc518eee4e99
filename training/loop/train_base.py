"""Train the entangled (z-free) base model: next-token loss on S only.

setup -> fit -> validate: samples are read once from the shards (the base model's
data is small), encoded to the z-free template, and batched by a seeded generator.
AdamW with linear warm-up and cosine decay; metrics go to ``OUT/metrics.jsonl``; the
checkpoint (safetensors + config + vocab + fingerprint) to ``OUT/``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from tokweight.pipeline.models.backbone import s_nll
from tokweight.pipeline.models.checkpoint import save_checkpoint
from tokweight.pipeline.data.labels import DatasetLabels, load_labels
from tokweight.pipeline.models.gpt import GPT, ModelConfig
from tokweight.pipeline.ranks import resolve_device
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import dataset_json, iter_samples, resolve_shards, shard_name
from tokweight.pipeline.data.urls import is_url_data
from tokweight.pipeline.tokens.templates import collate, template_ids
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.training.config.base import BaseTrainConfig
from tokweight.training.loop.trackers import open_trackers


MEMORISED = 0.75
"""A checkpoint whose mean NLL per token on the train split is below this share of its mean on val has learnt the
training lines (what the walk-through's bases measured: docs/own-task.md, "A base that has seen the lines")."""


def memorised_line(train: float, val: float) -> str | None:
    """The warning that a checkpoint has learnt the training lines: on them its memory already says which strategy
    an example takes, which leaves a CVAE's z little to find (docs/own-task.md, "A base that has seen the lines")."""
    if not val > 0 or train >= MEMORISED * val:
        return None
    return (f"warning: the checkpoint's NLL is {train:.3f} nats per token on the train split against {val:.3f} on "
            f"val ({train / val:.2f} of it): it has learnt the training lines, and a CVAE trained on them finds little "
            "z where memory answers; train the CVAE with a checkpoint that has not seen them "
            "(docs/own-task.md, \"A base that has seen the lines\")")


def load_split(data: str | Path, split: str) -> list[Sample]:
    """The samples of ``data/split/`` (URLs: of ``<root>/split/...``), or of the whole dataset if it has no such split."""
    if is_url_data(data):
        root, urls = resolve_shards(data)
        return [s for _, s in iter_samples([u for u in urls if shard_name(root, u).startswith(f"{split}/")] or urls)]
    root = Path(data)
    _, urls = resolve_shards(root / split if (root / split).is_dir() else root)
    return [s for _, s in iter_samples([str(u) for u in urls])]


def dataset_vocab(data: str | Path, samples: list[Sample], k_max: int) -> Vocab:
    """Symbols listed in dataset.json (generator or converter), else those seen in the samples."""
    info = dataset_json(data)
    if info is not None:
        symbols = info["symbols"]
    else:
        symbols = sorted({t for s in samples for t in (*s.x, *s.y)})
    return Vocab(tuple(symbols), k_max=k_max)


def lr_at(step: int, cfg: BaseTrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class EncodedSplit:
    """A split encoded once to z-free ids; `batch(idx)` collates any subset."""

    def __init__(self, samples: list[Sample], vocab: Vocab, labels: DatasetLabels | None = None):
        self.samples, self.vocab = samples, vocab
        self.seqs, self.layouts = map(list, zip(*(template_ids(vocab, s.x, s.y, key=s.key) for s in samples)))
        # log(#strategies consistent at t0): the Bayes-optimal surprisal at t0 (synthetic data only)
        counts = [labels.consistent_at_t0(s) if labels else None for s in samples]
        self.log_consistent = [math.log(c) if c else None for c in counts]

    def __len__(self):
        return len(self.samples)

    def batch(self, idx, slots=None, latent=None):
        """Collate examples idx; slots[j] > 0 gives example j the z-conditioned template with
        that many slots of latent token latent[j] (z-free where slots[j] == 0)."""
        if slots is None:
            return collate([self.seqs[i] for i in idx], [self.layouts[i] for i in idx])
        seqs, layouts = [], []
        for i, m, k in zip(idx, slots, latent):
            s = self.samples[i]
            if m:
                ids, layout = template_ids(self.vocab, s.x, s.y, [self.vocab.latent_id(k)] * m, key=s.key)
                seqs.append(ids)
                layouts.append(layout)
            else:
                seqs.append(self.seqs[i])
                layouts.append(self.layouts[i])
        return collate(seqs, layouts)


@torch.inference_mode()
def evaluate(model: GPT, split: EncodedSplit, device, batch_size: int = 256, zcond_slots: int = 1) -> dict:
    """Mean NLL per S token in the z-free template and in the z-conditioned one (which the CVAE's decoder
    starts from: a base that has not learnt it starts every CVAE damaged), and the base model's surprisal
    around the ground-truth t0.

    b_at_t0 is compared with log_consistent_at_t0, the surprisal of a Bayes-optimal
    z-free model there (log of the number of strategies still consistent).
    """
    model.eval()
    tot = zcond = n = at_t0 = n_at = after = n_after = ref = 0.0
    for start in range(0, len(split), batch_size):
        idx = list(range(start, min(start + batch_size, len(split))))
        batch = split.batch(idx).to(device)
        b = s_nll(model, batch).cpu()
        tot += b.sum().item()
        n += batch.mask.sum().item()
        # the template the CVAE decoder reads: zcond_slots slots of <z_0>
        zcond += s_nll(model, split.batch(idx, [zcond_slots] * len(idx), [0] * len(idx)).to(device)).sum().item()
        for row, i in enumerate(idx):
            t0, T = split.samples[i].t0, split.layouts[i].T
            if t0 is None or t0 >= T:
                continue
            at_t0 += b[row, t0].item()
            ref += split.log_consistent[i] or 0.0
            n_at += 1
            after += b[row, t0 + 1:T].sum().item()
            n_after += T - t0 - 1
    model.train()
    out = {"val_nll": tot / max(n, 1), "val_nll_zcond": zcond / max(n, 1)}
    if n_at:
        out |= {"b_at_t0": at_t0 / n_at, "b_after_t0": after / max(n_after, 1)}
        if any(r is not None for r in split.log_consistent):
            out["log_consistent_at_t0"] = ref / n_at
    return out


def run(cfg: BaseTrainConfig) -> dict:
    torch.manual_seed(cfg.seed)
    device = torch.device(resolve_device(cfg.device))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    train = load_split(cfg.data, "train")
    val = load_split(cfg.data, "val")
    vocab = dataset_vocab(cfg.data, train, cfg.k_max)
    train_enc, val_enc = EncodedSplit(train, vocab), EncodedSplit(val, vocab, load_labels(cfg.data))
    train_head = EncodedSplit(train[:len(val)], vocab)
    longest = max(lay.length for lay in train_enc.layouts + val_enc.layouts)
    block_size = 8 * math.ceil((longest + 2 + cfg.max_slots) / 8)  # room for <z> slots </z>
    mcfg = ModelConfig(vocab_size=len(vocab), block_size=block_size, n_layer=cfg.n_layer,
                       n_head=cfg.n_head, d_model=cfg.d_model)
    model = GPT(mcfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=1) + "\n")
    trackers = open_trackers(cfg.report_to, out)
    trackers.log_hparams(asdict(cfg))
    log = (out / "metrics.jsonl").open("w")
    bar = tqdm(range(cfg.steps), desc="train-base", unit="step", mininterval=1.0)
    t_start = time.perf_counter()
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        rows = torch.randint(len(train_enc), (cfg.batch_size,), generator=gen).tolist()
        slots = torch.randint(cfg.min_slots, cfg.max_slots + 1, (cfg.batch_size,), generator=gen)
        slots = slots * (torch.rand(cfg.batch_size, generator=gen) < cfg.zcond_rate)  # 0: z-free template
        latent = torch.randint(vocab.k_max, (cfg.batch_size,), generator=gen)
        batch = train_enc.batch(rows, slots.tolist(), latent.tolist()).to(device)
        nll = s_nll(model, batch)
        loss = nll.sum() / batch.mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        record = {"step": step, "loss": loss.item(), "lr": lr_at(step, cfg)}
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            record |= evaluate(model, val_enc, device, zcond_slots=cfg.min_slots)
            if step + 1 == cfg.steps:  # as many training lines as val has: has the model learnt them?
                record["train_nll"] = evaluate(model, train_head, device, zcond_slots=cfg.min_slots)["val_nll"]
            bar.set_postfix(loss=f"{loss.item():.3f}", val=f"{record['val_nll']:.3f}")
        log.write(json.dumps(record) + "\n")
        trackers.log_record(record)
    log.close()
    trackers.close()
    final = {k: v for k, v in record.items() if k not in ("step", "lr")}
    final["wall_s"] = time.perf_counter() - t_start
    fp = save_checkpoint(out, model.cpu(), vocab, meta={"train": asdict(cfg), "final": final})
    return {"fingerprint": fp, **final}
