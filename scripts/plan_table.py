"""The planner's table of docs/benchmarks.md: `tokweight plan` (``training.plan.estimate``) for the configurations a user asks
about, K = 4, at two sequence lengths, each with its largest batch for one 80 GiB GPU per rank.

    python scripts/plan_table.py --out plans.jsonl     # one JSON plan per line, then the markdown table
    python scripts/plan_table.py --accuracy            # fake against real peaks of four small CPU configurations

Every number is an estimate from fake tensors on the CPU; none is a GPU measurement.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROWS = (  # (label, PlanConfig fields)
    ("Qwen2.5-0.5B, full fine-tune", dict(model="qwen2.5-0.5b")),
    ("Qwen2.5-1.5B, full fine-tune", dict(model="qwen2.5-1.5b")),
    ("Llama-3.1-8B, LoRA r=16", dict(model="llama-3.1-8b", lora_rank=16)),
    ("Llama-3.1-8B, full, FSDP2 x 8", dict(model="llama-3.1-8b", shard="fsdp", ranks=8)),
    ("Llama-3.1-8B, LoRA r=16, grad checkpointing, validation at 16",
     dict(model="llama-3.1-8b", lora_rank=16, grad_checkpointing=True, eval_batch_size=16)),
    ("Llama-3.1-8B, full, FSDP2 x 8, grad checkpointing, validation at 16",
     dict(model="llama-3.1-8b", shard="fsdp", ranks=8, grad_checkpointing=True, eval_batch_size=16)),
)


def gib(n: int) -> str:
    return f"{n / (1 << 30):.1f}"


def markdown(plans: list[dict]) -> str:
    head = ("| configuration | seq | params | grads | optim | acts | temps | peak GiB | val GiB | decode GiB "
            "| train TFLOP | largest batch | plan s |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for p in plans:
        t, k = p["train"], p["train"]["kinds"]
        rows.append(f"| {p['label']} | {p['config']['seq_len']} | {gib(k['parameters'])} | {gib(k['gradients'])} | "
                    f"{gib(k['optimizer'])} | {gib(k['activations'])} | {gib(k['temporaries'])} | {gib(t['peak'])} | "
                    f"{gib(p['validation']['peak'])} | {gib(p['decode']['peak'])} | {t['flops'] / 1e12:.0f} | "
                    f"{p['largest_batch']} | {p['wall_s']:.0f} |")
    return "\n".join(rows)


TINY_LLAMA = {"model_type": "llama", "vocab_size": 48, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def accuracy() -> None:
    """Each phase's peak on fake tensors against the same phase run for real on the CPU (batch 2, 16 tokens)."""
    import tempfile
    import time

    from tokweight.training.config.plan import PlanConfig
    from tokweight.training.plan.estimate import run_phases
    from tokweight.training.plan.build import model_spec

    llama = Path(tempfile.mkdtemp()) / "config.json"
    llama.write_text(json.dumps(TINY_LLAMA))
    for name, fields in (("gpt-tiny float32", dict(model="gpt-tiny", dtype="float32")),
                         ("tiny Llama float32", dict(model=str(llama), dtype="float32")),
                         ("tiny Llama LoRA r=4 bfloat16", dict(model=str(llama), lora_rank=4, dtype="bfloat16")),
                         ("tiny Llama LoRA r=4 float32, grad checkpointing",
                          dict(model=str(llama), lora_rank=4, dtype="float32", grad_checkpointing=True))):
        cfg = PlanConfig(batch_size=2, seq_len=16, eval_batch_size=2, **fields)
        spec = model_spec(cfg.model)
        t0 = time.perf_counter()
        fake = run_phases(cfg, spec, 2, None, fake=True)[1]
        t1 = time.perf_counter()
        real = run_phases(cfg, spec, 2, None, fake=False)[1]
        t2 = time.perf_counter()
        cells = [f"{k} {fake[k].peak:,} / {real[k].peak:,} ({fake[k].peak / real[k].peak - 1:+.1%}), FLOPs "
                 f"{'equal' if fake[k].flops == real[k].flops else 'differ'}" for k in fake]
        print(f"{name}: " + "; ".join(cells) + f"; fake {t1 - t0:.0f} s, real {t2 - t1:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="plans.jsonl", help="JSON lines of the plans (appended; rows there are kept)")
    parser.add_argument("--seq-lens", default="512,2048")
    parser.add_argument("--batch-size", type=int, default=8, help="The batch each plan's breakdown is of.")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--only", default="", help="Plan only the rows whose label holds this text.")
    parser.add_argument("--accuracy", action="store_true", help="Fake against real peaks on the CPU, then stop.")
    args = parser.parse_args()

    import torch

    if args.accuracy:
        torch.set_num_threads(1)
        accuracy()
        return

    from tokweight.training.config.plan import PlanConfig
    from tokweight.training.plan.estimate import plan

    torch.set_num_threads(1)
    out = Path(args.out)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []
    for seq_len in map(int, args.seq_lens.split(",")):
        for label, fields in ROWS:
            if args.only not in label or any(p["label"] == label and p["config"]["seq_len"] == seq_len for p in done):
                continue
            cfg = PlanConfig(k=4, batch_size=args.batch_size, seq_len=seq_len, dtype=args.dtype, **fields)
            result = plan(cfg).to_json() | {"label": label}
            done.append(result)
            with out.open("a") as f:
                f.write(json.dumps(result) + "\n")
            print(f"{label} seq {seq_len}: peak {gib(result['train']['peak'])} GiB, largest batch "
                  f"{result['largest_batch']}, {result['wall_s']:.0f} s", flush=True)
    print(markdown(done))


if __name__ == "__main__":
    main()
