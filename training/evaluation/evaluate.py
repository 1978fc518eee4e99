"""`tokweight eval`: every metric on a split, plus decode-per-latent, to RUN/eval.json (eval.md is rendered
from it by the reporting layer, ``tokweight.report.eval_md``).

Decode-per-latent: for every latent value (discrete: each k; continuous: the K k-means
centres of the posterior means over the split) each example is decoded greedily from
its z-conditioned prefix ``... <z> slots </z> <y>`` until ``</y>`` (``training.decoding.decode``,
which ``tokweight generate`` shares).

- Against the references (any data with strategy labels): the Hungarian matching of the split's
  posterior clusters against its labels gives each label a latent value; per value, the share of
  the examples assigned to it whose decode under it equals their own y (and whose first token
  does), against chance: the same examples decoded under the other values (``reference_control``).
- Strategy execution (synthetic data, where ``pipeline.data.labels`` says what s(x) is): an output
  executes s when it equals s(x); control accuracy = matched executions / (examples x K) under the
  one-to-one map latent value -> strategy that maximises them (Hungarian).

Likelihood (labelled data, discrete latent): over the whole split, how much more likely each example's y,
teacher-forced, is under its matched latent value than under the other values (``likelihood_control``).

``z_use`` gives the verdict, one of three outcomes with its rules (eval.json ``z_used``, the head of
eval.md): z used with the decoder whole, z used with the decoder damaged, z not used; the base model's
own greedy exact match and token-mean NLL on the same examples are measured here and printed beside
the CVAE's.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.data.labels import DatasetLabels, load_labels
from tokweight.pipeline.models.dtypes import resolve_dtype
from tokweight.pipeline.ranks import resolve_device
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.tokens.templates import template_ids, y_ids
from tokweight.training.objective.baselines import Frozen, make_baseline
from tokweight.training.config.components import WeightingParams
from tokweight.training.evaluation.verdict import (label_free_control, likelihood_control, reference_control,
                                        reproduction_by_label, strategy_execution, value_report, z_use)
from tokweight.training.cvae.model import CVAE
from tokweight.training.loop.batches import StreamSpec, kept_samples
from tokweight.training.loop.join import StoreRef, extract_command, shards_without_rows
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.decoding.decode import continue_cached, continue_until, greedy_decode, latent_values, until_end
from tokweight.training.evaluation.metrics import contingency, kmeans, matched_labels
from tokweight.training.loop.run_dir import load_run
from tokweight.training.objective.schedules import Schedule
from tokweight.training.loop.stream import EvalStream, loader
from tokweight.training.config.train import IOConfig
from tokweight.training.config.use import EvalConfig
from tokweight.training.evaluation.validation import Scoring, evaluate_pass


@torch.no_grad()
def base_greedy_decode(base, vocab, samples: list[Sample], max_new: int, *, cached: bool = True
                       ) -> list[tuple[str, ...]]:
    """The base (z-free) model's greedy y for every sample, from its own template up to <y>: what the
    entangled model does without a latent, the reference a decoder must not fall below. ``cached`` False:
    recomputing every position at every step (``decode.continue_until``, the reference)."""
    end, outputs, by_len = vocab.end_id, {}, defaultdict(list)
    device = next(base.parameters()).device
    for i, s in enumerate(samples):
        ids, lay = template_ids(vocab, s.x, s.y, key=s.key)
        by_len[lay.s_start].append((i, ids[: lay.s_start]))
    for start, rows in by_len.items():
        prefix = torch.tensor([ids for _, ids in rows], device=device)
        room = min(max_new, base.cfg.block_size - start)
        decoded = (continue_cached(base, prefix, end, room) if cached
                   else continue_until(lambda ids: base.head(base.hidden(ids)[:, -1]), prefix, end, room))
        for (i, _), row in zip(rows, decoded[:, start:].tolist()):
            outputs[i] = tuple(vocab.decode(until_end(row, end)))
    return [outputs[i] for i in range(len(samples))]


def decode_per_latent(model: CVAE, base, vocab, samples: list[Sample], centres, labels: DatasetLabels,
                      matched: dict, own_values: list[int]) -> dict:
    """Every sample decoded under every latent value, and by the base model; matched: strategy label -> latent
    value (Hungarian); own_values[i]: sample i's own latent value (argmax q, or its k-means cluster)."""
    z, slot_ids = latent_values(model, centres)
    V = z.shape[0]
    max_new = max(len(y_ids(vocab, s.x, s.y, key=s.key)) for s in samples) + 2  # tokens, also for text y
    decoded = greedy_decode(model, vocab, samples, z, slot_ids, max_new)
    outputs = [decoded[i * V:(i + 1) * V] for i in range(len(samples))]  # per example: its V outputs
    refs = [reference_tokens(vocab, s) for s in samples]
    base_outputs = base_greedy_decode(base, vocab, samples, max_new)
    assigned = [matched.get(s.strategy, -1) for s in samples]  # -1: no label, or one the matching left out
    control = reference_control(outputs, refs, assigned, {v: label for label, v in matched.items()})
    result = {"latent_values": V, "examples": len(samples), "reference": control,
              "label_free": label_free_control(outputs, refs, base_outputs, own_values)}
    hits = None
    if labels.synth is not None:  # the generator says what each strategy outputs: the execution check too
        executes, hits = strategy_execution(samples, outputs, labels)
        result |= executes
    else:  # labelled lines say which strategy a decode executed where it reproduces the line's own y
        result |= reproduction_by_label(outputs, refs, [s.strategy for s in samples]) or {}
    result["sample_outputs"] = sample_outputs(samples, outputs, refs, assigned, hits)
    return result


def reference_tokens(vocab, sample: Sample) -> tuple[str, ...]:
    """The sample's own y as the token strings a decode yields (a text y as the template tokenizes it)."""
    return tuple(vocab.decode(y_ids(vocab, sample.x, sample.y, key=sample.key)))


def sample_outputs(samples, outputs, refs, assigned, hits, n: int = 8) -> list[dict]:
    """The first n examples: reference, assigned latent value and every value's output (synth: what it executes)."""
    rows = []
    for i, s in enumerate(samples[:n]):
        outs = [{"latent": v, "y": " ".join(y), "matches_reference": y == refs[i]} for v, y in enumerate(outputs[i])]
        for v, out in enumerate(outs if hits else ()):
            out["executes"] = hits[i][v]
        rows.append({"key": s.key, "strategy": s.strategy, "reference": " ".join(refs[i]),
                     "assigned_latent": assigned[i] if assigned[i] >= 0 else None, "outputs": outs})
    return rows


def eval_baseline(policy: str, io: IOConfig, meta: dict, vocab, urls, data: str,
                  split: str) -> tuple[str, StoreRef | None, dict]:
    """(policy, store to join, what eval.json says of b): the run's own ``policy``, except that a split
    the store does not hold is scored by the baseline checkpoint (``frozen``), which gives what the
    store would hold (the store equals the frozen b to 1e-5)."""
    if policy != "precomputed":
        return policy, None, {"policy": policy}
    store = StoreRef(io.store, meta["baseline_fingerprint"])
    missing = shards_without_rows(store.open(vocab), urls)
    if not missing:
        return "precomputed", store, {"policy": "precomputed", "store": io.store}
    command = extract_command(io.baseline_source, data, io.store)
    note = (f"{len(missing)} of {len(urls)} shards of split {split!r} (first {missing[0]}) have no rows in "
            f"store {io.store}: b computed by the baseline checkpoint {io.baseline_source} (policy frozen); "
            f"to store it instead: {command}")
    return "frozen", None, {"policy": "frozen", "reason": note, "extract_command": command}


def run_eval(cfg: EvalConfig) -> dict:
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    tcfg, model, vocab, meta = load_run(cfg.run, device, dtype)
    urls = split_urls(cfg.data, cfg.split)
    policy, store, b_source = eval_baseline(tcfg.loss.policy, tcfg.io, meta, vocab, urls, cfg.data, cfg.split)
    base = load_backbone(tcfg.io.baseline_source, device=device, dtype=dtype,  # b (frozen) and the base decode
                         template=vocab.template).model.eval()
    params = WeightingParams(tcfg.loss.eps, tcfg.loss.eps_inv, meta.get("dataset_mean_b"))
    scoring = Scoring(Frozen.loaded(base) if policy == "frozen" else make_baseline(policy, None), tcfg.loss, params,
                      tcfg.cvae, tcfg.optim.seed, Schedule.of(tcfg).at(meta["step"] - 1))  # q as the last step read it
    spec = StreamSpec(urls=urls, vocab=vocab, slots=tcfg.cvae.slots, block_size=model.backbone.cfg.block_size,
                      batch_size=cfg.batch_size, store=store, root=cfg.data, on_bad_sample=tcfg.io.on_bad_sample)
    records = evaluate_pass(model, loader(EvalStream(spec), 0), scoring, torch.device(device))
    model.eval()
    metrics = scoring.metrics(records)
    centres, clusters = split_clusters(np.stack(records.rows["post"]), tcfg.cvae, tcfg.optim.seed)
    matched = strategy_to_latent(records.rows["strategy"], clusters, tcfg.cvae.k)
    samples = kept_samples(spec, cfg.decode_examples)  # the first ones the stream keeps
    own_value = dict(zip(records.rows["key"], clusters.tolist()))
    decode = decode_per_latent(model, base, vocab, samples, centres, load_labels(cfg.data), matched,
                               [own_value[s.key] for s in samples]) if samples else {}
    likelihood = split_likelihood_control(records.rows, matched, metrics, tcfg.cvae.latent)
    verdict = z_use(metrics, decode, tcfg.cvae.latent, likelihood)
    values = value_report(clusters.tolist(), records.rows["strategy"],
                          decode.get("executes") or decode.get("reproduces"), tcfg.cvae.k)
    result = {"config": asdict(cfg), "step": meta["step"], "split": cfg.split, "baseline": b_source,
              "metrics": metrics, "z_used": verdict, "likelihood": likelihood, "decode": decode, "values": values}
    Path(cfg.run, "eval.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def split_likelihood_control(rows: dict, matched: dict, metrics: dict, latent: str) -> dict:
    """``verdict.likelihood_control`` over every example of the split; the continuous latent's pass scores posterior
    draws, not the K values it decodes, so it is not measured there."""
    if latent != "discrete":
        return {"measured": False, "reason": "continuous latent: the pass scores posterior draws, not the K values"}
    if "strategy_mi" not in metrics:
        return {"measured": False, "reason": "no example of the split has a strategy label"}
    return likelihood_control(np.stack(rows["nll_by_value"]), [matched.get(s, -1) for s in rows["strategy"]],
                              metrics["strategy_mi"])


def split_clusters(post: np.ndarray, cvae, seed: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(the continuous latent values to decode, or None; (N,) the value each example's posterior points to):
    argmax q, or the K k-means centres of mu and each example's cluster (the metrics' seeded call)."""
    if cvae.latent == "discrete":
        return None, post.argmax(1)
    return kmeans(post, cvae.k, seed)


def strategy_to_latent(strategies: list, clusters: np.ndarray, V: int) -> dict:
    """label -> latent value: the Hungarian matching of the split's clusters against its strategy labels
    (V latent values: discrete K, continuous K centres); {} when no example has a label."""
    known = [i for i, s in enumerate(strategies) if s is not None]
    if not known:
        return {}
    table, names = contingency([strategies[i] for i in known], clusters[known], V)
    return matched_labels(table, names)
