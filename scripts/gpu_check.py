"""The GPU check: every stage of tokweight on a model of the shape users bring, one prepared command.

    python scripts/gpu_check.py OUT                  # on a GPU: a 0.5B-shaped Qwen2 chat model, within ~6 minutes
    python scripts/gpu_check.py OUT --small --device cpu   # the same stages on a tiny model: a smoke test

It builds a chat model from a config, nothing downloaded (the shape of Qwen2-0.5B: hidden 896, 24 layers, 14
heads over 2 key/value heads, MLP 4864, a tied 151,936-row embedding; random weights in bfloat16; a byte-level
BPE tokenizer trained here with a ChatML template), writes a 4-strategy string task as JSON lines, and runs the
commands a user runs, in this process through the CLI (so each stage's peak GPU memory is its own):
convert -> extract --template chat -> train (full, bf16, gradient checkpointing) -> train (LoRA rank 16, bf16)
-> train (the query z pathway, bf16, gradient checkpointing) -> eval -> generate -> encode. Per stage it prints the wall time, tokens/s, the model FLOPs utilisation where
it applies (2N FLOPs per forward token, 6N per trained token, N the parameters; --peak-tflops, default the
H200's dense bf16 989) and the peak memory, then the table as Markdown (what docs/benchmarks.md records, with
the device and date).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import shutil
import sys
import time
from datetime import date
from pathlib import Path

import torch

STRATEGIES = {"copy": lambda s: s, "reverse": lambda s: s[::-1], "sort": sorted,
              "sort-desc": lambda s: sorted(s, reverse=True)}
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()
SHAPES = {  # Qwen2-0.5B's shape, and a tiny one for the smoke test
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "small": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True),
}


def write_task(path: Path, rows: int, seed: int) -> list[dict]:
    """``rows`` lines: x a list of 4-7 words, y the words under one of 4 strategies (the label), as strings."""
    rng = random.Random(seed)
    lines = []
    for i in range(rows):
        words = rng.sample(WORDS, rng.randint(4, 7))
        strategy = rng.choice(sorted(STRATEGIES))
        lines.append({"key": f"r{i:06d}", "x": "order: " + " ".join(words),
                      "y": " ".join(STRATEGIES[strategy](words)), "strategy": strategy})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def build_model(out: Path, shape: str, corpus: list[str]) -> int:
    """A random Qwen2 of ``shape`` in bfloat16 and a ChatML BPE tokenizer trained on ``corpus``; its parameters."""
    import transformers

    from tokweight.experiments.chat_model import CHAT_SPECIALS, CHATML, bpe_tokenizer

    tokenizer = bpe_tokenizer(out, corpus, CHAT_SPECIALS, CHATML, vocab_size=600)
    torch.manual_seed(0)
    config = transformers.Qwen2Config(max_position_embeddings=512, bos_token_id=None,
                                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                      **SHAPES[shape])
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def command(args: list[str]) -> dict:
    """One `tokweight` command in this process; its JSON result (the last JSON object it printed)."""
    from tokweight.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(args, standalone_mode=False)
    text = printed.getvalue()
    start = text.find("{")
    return json.loads(text[start:]) if start >= 0 else {}


class Stages:
    """Runs stages, timing each and reading its peak memory; collects the table."""

    def __init__(self, device: str, params: int, peak_flops: float):
        self.device, self.params, self.peak_flops, self.rows = device, params, peak_flops, []

    def run(self, name: str, args: list[str], tokens=None, flops_per_token: int = 0) -> dict:
        """``tokens``: the stage's tokens from its result (a function), for tokens/s and MFU."""
        cuda = self.device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        print(f"[gpu_check] {name}: tokweight {' '.join(args)}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        result = command(args)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        count = tokens(result) if tokens else None
        rate = count / wall if count else None
        mfu = (rate * flops_per_token * self.params / self.peak_flops if rate and flops_per_token and cuda
               else None)
        peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None
        self.rows.append({"stage": name, "wall_s": wall, "tokens": count, "tokens_per_s": rate, "mfu": mfu,
                          "peak_gib": peak})
        print(f"[gpu_check] {name}: {wall:.1f} s" + (f", {rate:,.0f} tokens/s" if rate else "")
              + (f", MFU {mfu:.1%}" if mfu else "") + (f", peak {peak:.2f} GiB" if peak else ""), file=sys.stderr)
        return result

    def markdown(self) -> str:
        def fmt(value, spec):
            return "" if value is None else format(value, spec)

        lines = ["| stage | wall s | tokens | tokens/s | MFU | peak GiB |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(f"| {r['stage']} | {r['wall_s']:.1f} | {fmt(r['tokens'], ',')} | "
                         f"{fmt(r['tokens_per_s'], ',.0f')} | {fmt(r['mfu'], '.1%')} | {fmt(r['peak_gib'], '.2f')} |")
        return "\n".join(lines)


def decoded_tokens(model: Path, outputs: Path) -> int:
    """Tokens of every output generate wrote (each latent value's), in the model's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    texts = [y for line in outputs.read_text().splitlines() for y in json.loads(line)["outputs"]]
    return sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({torch.get_num_threads()} threads)"


def train_tokens(steps: int, batch: int, k: int, mean_tokens: float):
    """A train stage's computed tokens: the z-free pass and K decoder copies of every example of every step."""
    return lambda result: int(result["stop"]["step"] * batch * (k + 1) * mean_tokens) if result else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a tiny model and task: the stages' smoke test")
    ap.add_argument("--rows", type=int, default=None, help="task lines (default: 20000; small: 240)")
    ap.add_argument("--steps", type=int, default=None, help="steps per train stage (default: 40; small: 2)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak, for MFU")
    args = ap.parse_args()
    rows, steps = args.rows or (240 if args.small else 20000), args.steps or (2 if args.small else 40)
    batch, k = (8 if args.small else args.batch_size), 4
    out = args.out
    for name in ("model", "data", "store", "run-full", "run-lora", "run-query"):  # every stage from scratch: a store or run
        shutil.rmtree(out / name, ignore_errors=True)  # left by an earlier check would be resumed, not measured
    out.mkdir(parents=True, exist_ok=True)
    lines = write_task(out / "task.jsonl", rows, seed=0)
    started = time.perf_counter()
    params = build_model(out / "model", "small" if args.small else "0.5b",
                         [f"{line['x']} {line['y']}" for line in lines[:2000]])
    print(f"[gpu_check] model: {params:,} parameters, built in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    stages = Stages(args.device, params, args.peak_tflops * 1e12)
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    on = ["--device", args.device]
    stages.run("convert", ["convert", "--jsonl", str(out / "task.jsonl"), "--out", str(out / "data"), "--overwrite"])
    extracted = stages.run("extract", ["extract", "--checkpoint", str(out / "model"), "--data", str(out / "data"),
                                       "--store", str(out / "store"), "--template", "chat", "--dtype", dtype,
                                       "--no-progress", *on],
                           tokens=lambda r: r["stats"]["tokens"], flops_per_token=2)
    mean_tokens = 3 * extracted["stats"]["tokens"] / max(extracted["stats"]["rows"], 1)  # a row's prompt and S
    common = ["--checkpoint", str(out / "model"), "--data", str(out / "data"), "--store", str(out / "store"),
              "--k", str(k), "--steps", str(steps), "--batch-size", str(batch), "--starts", "1", "--eval-every", "0",
              "--num-workers", "0", "--dtype", "bfloat16" if dtype == "bfloat16" else "float32", *on]
    stages.run("train full", ["train", *common, "--out", str(out / "run-full"), "--grad-checkpointing"],
               tokens=train_tokens(steps, batch, k, mean_tokens), flops_per_token=6)
    stages.run("train LoRA", ["train", *common, "--out", str(out / "run-lora"), "--lora-rank", "16"],
               tokens=train_tokens(steps, batch, k, mean_tokens), flops_per_token=6)
    stages.run("train query", ["train", *common, "--out", str(out / "run-query"), "--cond", "query",
                               "--grad-checkpointing"],
               tokens=train_tokens(steps, batch, k, mean_tokens), flops_per_token=6)
    run = str(out / "run-full")
    stages.run("eval", ["eval", "--run", run, "--data", str(out / "data"), "--decode-examples", "64", *on])
    (out / "inputs.jsonl").write_text("".join(json.dumps({"x": line["x"]}) + "\n" for line in lines[:64]))
    stages.run("generate", ["generate", "--run", run, "--input", str(out / "inputs.jsonl"),
                            "--out", str(out / "outputs.jsonl"), "--max-new-tokens", "32", *on],
               tokens=lambda r: decoded_tokens(out / "model", out / "outputs.jsonl"))
    stages.run("encode", ["encode", "--run", run, "--data", str(out / "data"), *on])
    table = stages.markdown()
    header = (f"`python scripts/gpu_check.py OUT{' --small' if args.small else ''} --device {args.device}`, "
              f"{date.today()}, {device_name(args.device)}, torch {torch.__version__}, {params:,} parameters, "
              f"{rows} rows, {steps} steps per train stage; total {time.perf_counter() - started:.0f} s")
    (out / "gpu_check.md").write_text(f"{header}\n\n{table}\n")
    print(f"{header}\n\n{table}")


if __name__ == "__main__":
    main()
