"""Decoding speed with and without the key/value cache, side by side in one run: a benchmark, not a test.

A CVAE built from a fresh backbone (no training: speed does not depend on the weights) decodes 64 new tokens
for every (prompt, latent value) through ``decode_ids``, cached (the prompt runs once, each new token one
position against the cache) and recomputing every position at every step (``cached=False``, the decode
before the cache), in alternating rounds; tokens/s are medians over the rounds. No row stops early (the end
token is one the vocabulary lacks), so every decode is 64 tokens. The two decodes' tokens are compared too.

Backbones: the built-in GPT (3 layers, d = 128, as the default base) and Hugging Face models built from a
config, no download (Llama and GPT-2, 3 layers, hidden 128), each with a 128-token context. The CVAE is
discrete, K = 4, the 4-slot prefix pathway (the query, the default, decodes through the same cache: tests/training/decoding/test_decode_cache.py). Target: cached >= 3x recompute on the CPU for each.

    python scripts/bench_decode.py [--rounds 3] [--prompts 16] [--backbones gpt,llama,gpt2] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

NEW_TOKENS = 64
CONTEXT = 128
SYMBOLS = tuple(f"s{i}" for i in range(24))


def backbone(kind: str, vocab_size: int):
    """A fresh backbone of 3 layers, width 128, a 128-token context."""
    from tokweight.pipeline.models.hf import HFBackbone
    from tokweight.pipeline.models.gpt import GPT, ModelConfig

    torch.manual_seed(0)
    if kind == "gpt":
        return GPT(ModelConfig(vocab_size=vocab_size, block_size=CONTEXT, n_layer=3, n_head=4, d_model=128))
    import transformers as tf

    if kind == "llama":
        config = tf.LlamaConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=512, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                                bos_token_id=1, eos_token_id=2, pad_token_id=0)
        return HFBackbone(tf.LlamaForCausalLM(config))
    config = tf.GPT2Config(vocab_size=vocab_size, n_positions=CONTEXT, n_embd=128, n_layer=3, n_head=4,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return HFBackbone(tf.GPT2LMHeadModel(config))


def setup(kind: str, prompts: int):
    """(CVAE in eval mode, prompts, z, slot ids): x of 6 to 9 symbols, so the prompts make 4 length groups."""
    from tokweight.pipeline.tokens.vocab import Vocab
    from tokweight.training.config.components import CVAEConfig
    from tokweight.training.cvae.model import build_cvae
    from tokweight.training.decoding.decode import latent_values, prompt_maker

    vocab = Vocab(SYMBOLS, k_max=4)
    model = build_cvae(backbone(kind, len(vocab)), vocab, CVAEConfig(k=4, cond="prefix")).eval()
    make = prompt_maker(vocab, model.conditioning.slots)
    xs = [[SYMBOLS[(i * 7 + j) % len(SYMBOLS)] for j in range(6 + i % 4)] for i in range(prompts)]
    return model, [make(x) for x in xs], *latent_values(model, None)


def timed_decode(model, prompts, z, slot_ids, cached: bool) -> tuple[float, list[list[int]]]:
    """(seconds, the decoded ids) of one decode of NEW_TOKENS per (prompt, latent value)."""
    from tokweight.training.decoding.decode import decode_ids

    start = time.perf_counter()
    ids = decode_ids(model, prompts, z, slot_ids, -1, NEW_TOKENS, cached=cached)  # -1: no row stops early
    return time.perf_counter() - start, ids


def bench(kind: str, prompts: int, rounds: int) -> dict:
    model, inputs, z, slot_ids = setup(kind, prompts)
    timed_decode(model, inputs[:2], z, slot_ids, True)  # warm-up
    times, outputs = {True: [], False: []}, {}
    for r in range(rounds):
        for cached in (True, False) if r % 2 == 0 else (False, True):
            seconds, outputs[cached] = timed_decode(model, inputs, z, slot_ids, cached)
            times[cached].append(seconds)
    tokens = sum(len(row) for row in outputs[True])
    assert tokens == prompts * len(z) * NEW_TOKENS
    rate = {cached: tokens / statistics.median(t) for cached, t in times.items()}
    return {"backbone": kind, "tokens": tokens, "cached": rate[True], "recompute": rate[False],
            "ratio": rate[True] / rate[False], "same_tokens": outputs[True] == outputs[False],
            "wall_s": sum(map(sum, times.values()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--backbones", default="gpt,llama,gpt2")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{NEW_TOKENS} new tokens per (prompt, latent value), {args.prompts} prompts x K = 4, {args.rounds} rounds, "
          f"{args.threads} torch thread(s); load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'backbone':<8} {'cached tok/s':>13} {'recompute tok/s':>16} {'ratio':>7}  same tokens  wall s")
    for kind in args.backbones.split(","):
        r = bench(kind, args.prompts, args.rounds)
        print(f"{r['backbone']:<8} {r['cached']:>13.0f} {r['recompute']:>16.0f} {r['ratio']:>6.2f}x  "
              f"{str(r['same_tokens']):<11}  {r['wall_s']:.1f}", flush=True)
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
