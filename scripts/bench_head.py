"""The output head on the states that predict S against full-vocabulary logits at every position (the CVAE
before pipeline/models/head.py), side by side: a benchmark, not a test. On a 2-layer d = 32 Llama with a
131,072-token vocabulary (K = 4, prefix-4, sequences of 18-30 tokens): peak resident memory and step time of
training steps (batch 8) and of eval forwards (no gradients, batch 64, as validation reads them), each variant in a
fresh process (the peak is the process's ru_maxrss, the high-water mark of its resident pages; above start: minus
the resident size before the first step), as ratios head-on-S / full.

    python scripts/bench_head.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import K, load_average  # noqa: E402  (the sibling script's K and load line)


HEAD_VOCAB, HEAD_SLOTS, HEAD_STEPS = 131_072, 4, 3
HEAD_BATCH = {"train": 8, "eval": 64}  # eval: a validation batch (eval_batch_size), where full logits peaked
HEAD_VARIANTS = ("full_logits", "head_on_s")


def full_logits_nll(model, hidden, logit_pos, targets, mask, count=None) -> torch.Tensor:
    """The CVAE's S NLLs before pipeline/models/head.py: logits (N, L, V) at every position, then gathered."""
    from tokweight.pipeline.tokens.templates import gather_s, token_surprisal

    return token_surprisal(gather_s(model.head(hidden), logit_pos), targets, mask)


def head_case(batch_size: int, seed: int = 0):
    """(CVAE, TrainBatch, b) of the 131k-vocabulary case: a Llama built from a config, random symbols."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tokweight.pipeline.models.hf import HFBackbone
    from tokweight.pipeline.data.samples import Sample
    from tokweight.pipeline.tokens.vocab import SPECIALS, Vocab
    from tokweight.training.cvae.model import CVAEConfig, build_cvae
    from tokweight.training.loop.batches import collate_examples, encode

    symbols = tuple(f"s{i}" for i in range(HEAD_VOCAB - len(SPECIALS) - K))
    vocab = Vocab(symbols, k_max=K)
    torch.manual_seed(seed)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0))
    model = build_cvae(HFBackbone(llama), vocab, CVAEConfig(k=K, cond="prefix", slots=HEAD_SLOTS))
    rng = random.Random(seed)
    draw = lambda lo, hi: tuple(rng.choices(symbols, k=rng.randint(lo, hi)))
    samples = [Sample(f"k{i}", draw(4, 7), draw(7, 10)) for i in range(batch_size)]  # z-free 18-24, z-cond 24-30
    batch = collate_examples(list(encode([("bench.tar", s) for s in samples], vocab, HEAD_SLOTS, 64)))
    b = torch.rand(batch.zfree.mask.shape, generator=torch.Generator().manual_seed(seed)) * batch.zfree.mask
    return model, batch, b


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def head_child(variant: str, mode: str, steps: int) -> dict:
    """One variant in this (fresh) process: ``steps`` + 1 training steps (or eval forwards), the first
    a warm-up; the first loss (to check that the variants compute the same), median seconds and memory."""
    from tokweight.training.cvae import model as cvae
    from tokweight.training.config.components import WeightingParams
    from tokweight.training.objective.terms import reconstruction_weights
    from tokweight.training.objective.loss import plain_objective, reconstruction

    if variant == "full_logits":
        cvae.nll_over_s = full_logits_nll  # this process only: the CVAE as it was
    model, batch, b = head_case(HEAD_BATCH[mode])
    pi, _ = reconstruction_weights("surprisal-share", b, batch.zfree.mask, WeightingParams())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_of(out) -> torch.Tensor:
        return plain_objective(model.latent, out, reconstruction(out, pi), 0.3).loss

    def train_step() -> float:
        loss = loss_of(model(batch, generator=torch.Generator().manual_seed(0)))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    @torch.no_grad()
    def eval_forward() -> float:
        return loss_of(model(batch, generator=torch.Generator().manual_seed(0))).item()

    fn = train_step if mode == "train" else eval_forward
    start_mib, times, losses = resident_mib(), [], []
    for _ in range(steps + 1):
        t = time.perf_counter()
        losses.append(fn())
        times.append(time.perf_counter() - t)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"variant": variant, "mode": mode, "first_loss": losses[0], "step_s": statistics.median(times[1:]),
            "start_mib": start_mib, "peak_mib": peak_mib, "above_start_mib": peak_mib - start_mib}


def bench_head_on_s(steps: int) -> dict:
    """{mode: {variant: child's result}, ratios}, each variant and mode in a fresh process, one after another."""
    out = {"load_before": load_average()}
    for mode in ("train", "eval"):
        runs = {}
        for variant in HEAD_VARIANTS:
            cmd = [sys.executable, __file__, "--head-child", variant, mode, "--steps", str(steps)]
            lines = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
            runs[variant] = json.loads(lines[-1])
        new, old = runs["head_on_s"], runs["full_logits"]
        out[mode] = {**runs, "peak_ratio": new["peak_mib"] / old["peak_mib"],
                     "above_start_ratio": new["above_start_mib"] / old["above_start_mib"],
                     "time_ratio": new["step_s"] / old["step_s"],
                     "loss_diff": abs(new["first_loss"] - old["first_loss"])}
    out["load_after"] = load_average()
    return out


def print_head_on_s(result: dict, steps: int) -> None:
    for mode in ("train", "eval"):
        r = result[mode]
        old, new = r["full_logits"], r["head_on_s"]
        what = "training step" if mode == "train" else "eval forward (no grad)"
        print(f"head on S vs full logits, V={HEAD_VOCAB}, {what} (batch {HEAD_BATCH[mode]}, K={K}, "
              f"prefix-{HEAD_SLOTS}, median of {steps}): peak RSS {new['peak_mib']:.0f} vs {old['peak_mib']:.0f} MiB = "
              f"{r['peak_ratio']:.3f} (above start {new['above_start_mib']:.0f} vs {old['above_start_mib']:.0f} MiB = "
              f"{r['above_start_ratio']:.3f}); step {new['step_s'] * 1e3:.0f} vs {old['step_s'] * 1e3:.0f} ms = "
              f"{r['time_ratio']:.3f}; first loss differs by {r['loss_diff']:.2g}")
    print(f"  (load average (1, 5, 15 min) {result['load_before']} before, {result['load_after']} after)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=HEAD_STEPS, help="timed steps per variant, after one warm-up")
    ap.add_argument("--head-child", nargs=2, metavar=("VARIANT", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.head_child:
        print(json.dumps(head_child(*args.head_child, args.steps)))
        return
    head = bench_head_on_s(args.steps)
    print_head_on_s(head, args.steps)
    print(json.dumps({"head_on_s": head}, default=float))


if __name__ == "__main__":
    main()
