"""`tokweight eval`: every metric on a split, plus decode-per-latent, to RUN/eval.json and RUN/eval.md.

Decode-per-latent: for every latent value (discrete: each k; continuous: the K k-means
centres of the posterior means over the split) each example is decoded greedily from
its z-conditioned prefix ``... <z> slots </z> <y>`` until ``</y>``. An output *executes*
strategy s when it equals s(x) exactly, where the dataset can say what s(x) is
(``pipeline.labels``: synthetic data). Control accuracy = matched executions / (examples x K) under the
one-to-one map latent value -> strategy that maximises them (Hungarian).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from pipeline.checkpoint import load_checkpoint
from pipeline.labels import DatasetLabels, load_labels
from pipeline.samples import Sample
from pipeline.shards import iter_samples
from pipeline.templates import Layout, template_ids
from store.tables import general, markdown_table
from training.baselines import make_baseline
from training.cvae import CVAE
from training.data import EvalStream, StoreRef, StreamSpec, extract_command, loader, shards_without_rows, split_urls
from training.losses import WeightingParams
from training.metrics import hungarian_accuracy, kmeans
from training.run_dir import load_run
from training.train_config import IOConfig
from training.validation import Scoring, evaluate_pass


@dataclass(frozen=True)
class EvalConfig:
    run: str
    """The train run directory."""
    data: str
    """Dataset directory holding the split."""
    split: str = "test"
    """Split to evaluate (a subdirectory of data)."""
    batch_size: int = 128
    """Examples per forward batch."""
    decode_examples: int = 256
    """Examples decoded per latent value (the first ones of the split)."""
    device: str = "cpu"
    """torch device."""

    def __post_init__(self):
        if self.batch_size < 1 or self.decode_examples < 0:
            raise ValueError("batch_size must be >= 1 and decode_examples >= 0")


@torch.no_grad()
def greedy_decode(model: CVAE, vocab, samples: list[Sample], z: torch.Tensor, slot_ids: torch.Tensor | None,
                  max_new: int) -> list[tuple[str, ...]]:
    """Greedy y for every (example, latent value): z (V, F) features, slot_ids (V,) or None.

    Returns len(samples) * V outputs, example-major. Examples are batched by prefix length.
    """
    V, M = z.shape[0], model.conditioning.slots
    end, outputs = vocab.id("</y>"), {}
    prefixes, by_len = {}, defaultdict(list)  # the z-conditioned template up to <y>, grouped by its length
    for i, s in enumerate(samples):
        ids, lay = template_ids(vocab, s.x, s.y, [vocab.latent_id(0)] * M, key=s.key)
        prefixes[i] = ids[: lay.s_start]
        by_len[lay.m].append(i)
    for m, idx in by_len.items():
        lay = Layout(m, 1, M)
        prefix = torch.tensor([prefixes[i] for i in idx]).repeat_interleave(V, 0)  # (n*V, s_start)
        zz, sid = z.repeat(len(idx), 1), None if slot_ids is None else slot_ids.repeat(len(idx))
        slot_pos = torch.tensor([list(lay.slot_positions)]).expand(len(prefix), M)
        ids, done = prefix, torch.zeros(len(prefix), dtype=torch.bool)
        for _ in range(min(max_new, model.backbone.cfg.block_size - prefix.shape[1])):
            inp, kwargs = model.conditioning.decoder_inputs(model.backbone, ids, slot_pos, zz, sid)
            nxt = model.backbone(inp, **kwargs)[0][:, -1].argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], 1)
            done |= nxt == end
            if done.all():
                break
        for row, i_v in enumerate(ids[:, lay.s_start:].tolist()):
            gen = i_v[: i_v.index(end)] if end in i_v else i_v
            outputs[(idx[row // V], row % V)] = tuple(vocab.decode(gen))
    return [outputs[(i, v)] for i in range(len(samples)) for v in range(V)]


def latent_values(model: CVAE, centres: np.ndarray | None):
    """(z features (V, F), slot ids (V,) or None): every k, or the continuous cluster centres."""
    lat = model.latent
    if lat.kind == "discrete":
        return torch.eye(lat.k), lat.latent_ids.clone()
    return torch.as_tensor(centres, dtype=torch.float32), None


def decode_per_latent(model: CVAE, vocab, samples: list[Sample], centres, labels: DatasetLabels) -> dict:
    z, slot_ids = latent_values(model, centres)
    V = z.shape[0]
    max_new = max(len(vocab.encode_symbols(s.y, key=s.key)) for s in samples) + 2  # tokens, also for text y
    decoded = greedy_decode(model, vocab, samples, z, slot_ids, max_new)
    names = sorted(labels.outputs(samples[0].x) or {})
    counts = np.zeros((V, len(names) + 1))  # last column: executes no strategy
    examples = []
    for i, s in enumerate(samples):
        cands = labels.outputs(s.x) or {}
        row = {"key": s.key, "strategy": s.strategy, "outputs": []}
        for v in range(V):
            y = decoded[i * V + v]
            hit = [n for n in names if cands.get(n) == y]
            counts[v, names.index(hit[0]) if hit else len(names)] += 1
            row["outputs"].append({"latent": v, "y": " ".join(y), "executes": hit[0] if hit else None})
        examples.append(row)
    result = {"latent_values": V, "examples": len(samples),
              "executes": {str(v): {n: float(counts[v, j] / len(samples)) for j, n in enumerate(names + ["none"])}
                           for v in range(V)},
              "sample_outputs": examples[:8]}
    if names:
        result["control_accuracy"] = float(hungarian_accuracy(counts[:, :-1]) * counts[:, :-1].sum() / counts.sum())
    return result


def markdown(metrics: dict, decode: dict) -> str:
    numbers = [[k, general(v)] for k, v in metrics.items() if isinstance(v, (int, float))]
    parts = [markdown_table(["metric", "value"], numbers)]
    if decode:
        names = list(next(iter(decode["executes"].values())))
        parts.append(markdown_table(["latent", *names], [[v, *(f"{row[n]:.2f}" for n in names)]
                                                         for v, row in decode["executes"].items()]))
        if "control_accuracy" in decode:
            parts.append(f"control accuracy: {decode['control_accuracy']:.3f}")
    return "\n\n".join(parts) + "\n"


def eval_baseline(policy: str, io: IOConfig, meta: dict, vocab, urls,
                  cfg: EvalConfig) -> tuple[str, StoreRef | None, dict]:
    """(policy, store to join, what eval.json says of b): the run's own ``policy``, except that a split
    the store does not hold is scored by the baseline checkpoint (``frozen``), which gives what the
    store would hold (the store equals the frozen b to 1e-5)."""
    if policy != "precomputed":
        return policy, None, {"policy": policy}
    store = StoreRef(io.store, meta["baseline_fingerprint"])
    missing = shards_without_rows(store.open(vocab), urls)
    if not missing:
        return "precomputed", store, {"policy": "precomputed", "store": io.store}
    command = extract_command(io.baseline_source, cfg.data, io.store)
    note = (f"{len(missing)} of {len(urls)} shards of split {cfg.split!r} (first {missing[0]}) have no rows in "
            f"store {io.store}: b computed by the baseline checkpoint {io.baseline_source} (policy frozen); "
            f"to store it instead: {command}")
    return "frozen", None, {"policy": "frozen", "reason": note, "extract_command": command}


def run_eval(cfg: EvalConfig) -> dict:
    tcfg, model, vocab, meta = load_run(cfg.run, cfg.device)
    urls = split_urls(cfg.data, cfg.split)
    policy, store, b_source = eval_baseline(tcfg.loss.policy, tcfg.io, meta, vocab, urls, cfg)
    baseline_model = None
    if policy == "frozen":
        baseline_model = load_checkpoint(tcfg.io.baseline_source, device=cfg.device).model
    params = WeightingParams(tcfg.loss.eps, tcfg.loss.eps_inv, meta.get("dataset_mean_b"))
    scoring = Scoring(make_baseline(policy, baseline_model), tcfg.loss, params, tcfg.cvae, tcfg.optim.seed)
    spec = StreamSpec(urls=urls, vocab=vocab, slots=tcfg.cvae.slots, block_size=model.backbone.cfg.block_size,
                      batch_size=cfg.batch_size, store=store)
    records = evaluate_pass(model, loader(EvalStream(spec), 0), scoring, torch.device(cfg.device))
    model.eval()
    metrics = scoring.metrics(records)
    centres = (kmeans(np.stack(records.rows["post"]), tcfg.cvae.k, tcfg.optim.seed)[0]
               if tcfg.cvae.latent == "continuous" else None)
    samples = [s for _, s in islice(iter_samples(list(urls)), cfg.decode_examples)]  # only the first ones are parsed
    decode = decode_per_latent(model, vocab, samples, centres, load_labels(cfg.data)) if samples else {}
    result = {"config": asdict(cfg), "step": meta["step"], "split": cfg.split, "baseline": b_source,
              "metrics": metrics, "decode": decode}
    Path(cfg.run, "eval.json").write_text(json.dumps(result, indent=1) + "\n")
    Path(cfg.run, "eval.md").write_text(markdown(metrics, decode))
    return result
