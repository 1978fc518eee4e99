"""The GPU check: tokweight's stages on a model of the shape users bring, timed in steady state, one prepared command.

    python scripts/gpu_check.py OUT                        # on a GPU: a 0.5B-shaped Qwen2 chat model, 512 tokens
    python scripts/gpu_check.py OUT --small --device cpu   # the same stages on a tiny model: a smoke test

It builds a chat model from a config, nothing downloaded (the shape of Qwen2-0.5B: hidden 896, 24 layers, 14 heads
over 2 key/value heads, MLP 4864, a tied 151,936-row embedding; random weights; a byte-level BPE tokenizer trained
here with a ChatML template), writes a 4-strategy string task whose rows fill ``--seq-len`` tokens (a context of
words before the words the strategy orders), converts it and extracts its store (`tokweight convert`, `tokweight
extract --template chat`, timed whole as the commands run). Then each stage, in its own try (one failure leaves the
others' rows), times what it names in this process after a warm-up (``gpu_check_stages.py``): CUDA events on a GPU,
FLOPs from ``FlopCounterMode``, MFU against the detected GPU's dense bfloat16 peak (``--peak-tflops`` for another):

- extract: the bare forward with the head on the positions that predict S, and extraction's scoring loop, over the
  same batches;
- train: the full fine-tune, the same with the batches' rows in length groups or whole (``io.length_groups``: the
  value the device does not default to), the same with the z-free pass and the copies in one forward or two
  (``io.merge_passes``, likewise), LoRA (rank 16), a continuous latent, the 1.5B shape (Qwen2.5-1.5B: hidden 1536,
  28 layers, 12 heads over 2, MLP 8960; gradient checkpointing), each a step time; resume (checkpoint write and
  set-up from it); `--starts 3` (whole run); with two or more GPUs the full fine-tune on 2 ranks (torchrun, NCCL);
- eval's scoring pass (bfloat16 autocast where training runs in it) and generate's sampled decode;
- the planner's peak against the full fine-tune's measured peak, where ``tokweight.training.plan.estimate`` exists.

It prints the table as Markdown with the targets (what docs/benchmarks.md records, with the device and date) and
writes it to OUT/gpu_check.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_stages as st  # noqa: E402

STRATEGIES = {"copy": lambda s: s, "reverse": lambda s: s[::-1], "sort": sorted,
              "sort-desc": lambda s: sorted(s, reverse=True)}
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()
SHAPES = {  # Qwen2-0.5B's and Qwen2.5-1.5B's shapes, and tiny stand-ins for the smoke test
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True),
    "tiny-wide": dict(hidden_size=96, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True),
}
SIZES = {  # per mode: shapes, task, batches, timed windows, decode
    "gpu": dict(shape="0.5B", large="1.5B", rows=2000, seq_len=512, batch=8, large_batch=4, warmup=3, steps=10,
                eval_batch=32, prompts=64, max_new_tokens=32, start_steps=4, val_fraction=0.05),
    "small": dict(shape="tiny", large="tiny-wide", rows=240, seq_len=48, batch=4, large_batch=2, warmup=1, steps=2,
                  eval_batch=8, prompts=8, max_new_tokens=8, start_steps=1, val_fraction=0.1),
}


def write_task(path: Path, rows: int, seq_len: int, seed: int) -> list[dict]:
    """``rows`` lines: x a context of words and then 4-7 words to order, about ``seq_len`` tokens with y; y those
    words under one of 4 strategies (the label), as strings."""
    rng = random.Random(seed)
    lines = []
    for i in range(rows):
        words = rng.sample(WORDS, rng.randint(4, 7))
        context = [rng.choice(WORDS) for _ in range(max(0, seq_len - 2 * len(words) - 24))]  # a word a token
        strategy = rng.choice(sorted(STRATEGIES))
        lines.append({"key": f"r{i:06d}", "x": f"context: {' '.join(context)} order: {' '.join(words)}",
                      "y": " ".join(STRATEGIES[strategy](words)), "strategy": strategy})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def build_model(out: Path, shape: str, context: int, tokenizer_from: list[str] | Path, device: torch.device) -> int:
    """A random Qwen2 of ``shape`` saved in bfloat16 with a ChatML BPE tokenizer (trained on the corpus
    ``tokenizer_from``, or copied from that model directory); its parameters."""
    import transformers

    from tokweight.experiments.chat_model import CHAT_SPECIALS, CHATML, bpe_tokenizer

    if isinstance(tokenizer_from, Path):
        tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_from, local_files_only=True)
        tokenizer.save_pretrained(out)
    else:
        tokenizer = bpe_tokenizer(out, tokenizer_from, CHAT_SPECIALS, CHATML, vocab_size=600)
    torch.manual_seed(0)
    config = transformers.Qwen2Config(max_position_embeddings=context, bos_token_id=None,
                                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                      **SHAPES[shape])
    with torch.device(device):  # initialised where it is fast
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


def prepare(out: Path, name: str, lines: list[dict], model: Path, shard_size: int, check: st.Check,
            held_out: float = 0.1) -> st.Row:
    """OUT/data-NAME and OUT/store-NAME: the lines converted (``held_out`` of them to val and as many to test) and
    extracted by ``model``, by the commands; the extraction's row (its whole command: load, hash, read, score,
    write)."""
    (out / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    data, store = out / f"data-{name}", out / f"store-{name}"
    command(["convert", "--jsonl", str(out / f"{name}.jsonl"), "--out", str(data), "--overwrite",
             "--shard-size", str(shard_size), "--val-fraction", str(held_out), "--test-fraction", str(held_out)])
    st.synchronize(check.device)
    start = time.perf_counter()
    result = command(["extract", "--checkpoint", str(model), "--data", str(data), "--store", str(store),
                      "--template", "chat", "--dtype", check.dtype, "--no-progress", "--device", str(check.device)])
    wall = time.perf_counter() - start
    tokens = result["stats"]["tokens"]
    return st.Row(f"extract command ({name})", wall, "command", tokens / wall, peak_gib=st.peak_gib(check.device),
                  note=f"{tokens:,} S tokens; load, hash, read, score and write: not a steady state")


def large_step(check: st.Check, name: str, shape: str, lines: list[dict], batch: int, context: int) -> st.Row:
    """One timed full fine-tune step of the ``shape`` model (gradient checkpointing, batch ``batch``) after one
    warm-up step, on its own store of a few lines."""
    model = check.out / f"model-{shape}"
    params = build_model(model, shape, context, check.model, check.device)
    st.fresh_memory(check.device)
    rows = 12 * batch  # a few shards of each split (training resamples them)
    prepared = prepare(check.out, shape, lines[:rows], model, max(1, rows // 4), check)
    row = st.training(check, name, out=f"run-{shape}", checkpoint=model,
                      data=check.out / f"data-{shape}", store=check.out / f"store-{shape}", batch=batch,
                      grad_checkpointing=True, warmup=1, steps=1)
    row.note = f"{params:,} parameters, {row.note}; extract {prepared.seconds:.1f} s"
    return row


def several_gpus(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.device_count() >= 2


def two_ranks(check: st.Check, name: str, args, timeout_s: float = 300.0) -> st.Row:
    """The full fine-tune on 2 GPUs: ``gpu_check_stages.py`` under torchrun, DistributedDataParallel on NCCL."""
    if not several_gpus(check.device):
        return st.Row(name, status="skipped: fewer than 2 GPUs")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
              str(Path(__file__).resolve().parent / "gpu_check_stages.py"), "--out", str(check.out),
              "--model", str(check.model), "--data", str(check.data), "--store", str(check.store),
              "--device", check.device.type, "--dtype", check.dtype, "--batch", str(check.batch), "--k", str(check.k),
              "--warmup", str(check.warmup), "--steps", str(check.steps)]
    if args.peak_tflops:
        launch += ["--peak-tflops", str(args.peak_tflops)]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    launcher = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = launcher.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:  # SIGTERM to the launcher ends its workers (their own session)
        launcher.terminate()
        launcher.communicate(timeout=60)
        raise RuntimeError(f"torchrun ran past {timeout_s} s and was stopped") from None
    sys.stderr.write(stderr[-4000:])
    found = [line for line in stdout.splitlines() if line.startswith("GPU_CHECK_ROW ")]
    if launcher.returncode or not found:
        tail = " ".join(stderr.strip().splitlines()[-1:])[:160]
        raise RuntimeError(f"torchrun exited {launcher.returncode}: {tail}")
    return st.Row(**{**json.loads(found[-1].removeprefix("GPU_CHECK_ROW ")), "stage": name})


def fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def markdown(rows: list[st.Row]) -> str:
    lines = ["| stage | time s | per | tokens/s | TFLOP/s | MFU | peak GiB | status | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.stage} | {fmt(r.seconds, '.4g')} | {r.per} | {fmt(r.tokens_per_s, ',.0f')} | "
                     f"{fmt(r.tflops, '.3g')} | {fmt(r.mfu, '.1%')} | {fmt(r.peak_gib, '.2f')} | {r.status} | "
                     f"{r.note} |")
    return "\n".join(lines)


def targets(rows: list[st.Row], seq_len: int, judged: bool) -> list[str]:
    """The check's targets, each with what was measured; ``judged`` (on a GPU only): met or not."""
    by = {r.stage: r for r in rows}
    full, lora = by.get("train full"), by.get("train LoRA (rank 16)")
    scoring, bare = by.get("extract: scoring loop"), by.get("extract: bare forward, head on S")
    planner = by.get("planner peak vs measured")

    def line(what: str, value: str | None, ok: bool | None) -> str:
        verdict = "n/a" if value is None else ("met" if ok else "not met") if judged else "not judged off a GPU"
        return f"- {what}: {value or 'not measured'} ({verdict})"

    mfu = full.mfu if full else None
    lora_x = lora.tokens_per_s / full.tokens_per_s if full and lora and full.tokens_per_s and lora.tokens_per_s \
        else None
    extract_x = bare.seconds / scoring.seconds if scoring and bare and scoring.seconds and bare.seconds else None
    planned = planner.note if planner and planner.status in ("ok", "off target") else None
    return [line(f"full fine-tune step MFU >= 30% at sequence length {seq_len}", fmt(mfu, ".1%") or None,
                 mfu is not None and mfu >= 0.3),
            line("LoRA tokens/s >= 1.5 x the full fine-tune's", fmt(lora_x, ".2f") or None,
                 lora_x is not None and lora_x >= 1.5),
            line("extraction's scoring loop >= 0.9 of the bare forward", fmt(extract_x, ".2f") or None,
                 extract_x is not None and extract_x >= 0.9),
            line("the planner's peak within 10% of torch.cuda.max_memory_allocated", planned,
                 planner is not None and planner.status == "ok")]


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a tiny model and task: the stages' smoke test")
    ap.add_argument("--rows", type=int, default=None, help="task lines (default: 2000; small: 240)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per row, about (default: 512; small: 48)")
    ap.add_argument("--batch-size", type=int, default=None, help="training examples per step (default: 8; small: 4)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per train stage (default: 10; small: 2)")
    ap.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                    help="the forward's precision (default: bfloat16 on a GPU, float32 on the CPU)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the device's dense bf16 peak for MFU (default: by the GPU's name; none: MFU n/a)")
    return ap.parse_args()


def main() -> None:
    from tokweight.training.config.components import CVAEConfig, LoRAConfig
    from tokweight.training.config.train import GPU_LENGTH_GROUPS, default_length_groups, default_merge_passes

    args = arguments()
    sizes = dict(SIZES["small" if args.small else "gpu"])
    sizes.update({k: v for k, v in (("rows", args.rows), ("seq_len", args.seq_len), ("batch", args.batch_size),
                                    ("steps", args.steps)) if v})
    device = torch.device(args.device)
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    out = args.out
    for name in os.listdir(out) if out.is_dir() else ():  # every stage from scratch: a run left by an earlier
        if name.startswith(("model", "data-", "store-", "run-")):  # check would be resumed, not measured
            shutil.rmtree(out / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    lines = write_task(out / "task.jsonl", sizes["rows"], sizes["seq_len"], seed=0)
    corpus = [f"{line['x']} {line['y']}" for line in lines[:2000]]
    context = max(1024, 2 * sizes["seq_len"])  # positions: the z-conditioned template is longer than the row
    params = build_model(out / "model", sizes["shape"], context, corpus, device)
    print(f"[gpu_check] model: {params:,} parameters, built in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    check = st.Check(out=out, model=out / "model", data=out / "data-task", store=out / "store-task", device=device,
                     dtype=dtype, batch=sizes["batch"], k=4, warmup=sizes["warmup"], steps=sizes["steps"],
                     peak=st.peak_tflops(device, args.peak_tflops), eval_batch=sizes["eval_batch"],
                     max_new_tokens=sizes["max_new_tokens"],
                     prompts=[line["x"] for line in lines[: sizes["prompts"]]])
    rows: list[st.Row] = []
    other_groups = 1 if default_length_groups(device.type) > 1 else GPU_LENGTH_GROUPS
    other_merge = not default_merge_passes(device.type)
    shard_size = max(1, sizes["rows"] // 8)  # several shards: extraction's parts, and a lane per rank
    stages = {  # row name (a failed stage's too): what makes the row
        "extract command (task)": lambda name: prepare(out, "task", lines, check.model, shard_size, check,
                                                       sizes["val_fraction"]),  # val: the validations' cost
        "extract": lambda name: st.extraction(check),  # two rows: the bare forward and the scoring loop
        "train full": lambda name: st.training(check, name, keep=True, out="run-full"),
        "resume": lambda name: st.resume(check, name),  # the full run's state: before any other stage runs
        "planner peak vs measured": lambda name: st.planner(check, name),
        # the same run with its batches' rows in length groups or whole, whichever the device's default is not
        f"train full, io.length_groups {other_groups}": lambda name: st.training(check, name, out="run-groups",
                                                                                length_groups=other_groups),
        f"train full, io.merge_passes {other_merge}": lambda name: st.training(check, name, out="run-merge",
                                                                              merge_passes=other_merge),
        "train LoRA (rank 16)": lambda name: st.training(check, name, out="run-lora", lora=LoRAConfig(rank=16)),
        "train continuous latent": lambda name: st.training(check, name, out="run-continuous",
                                                            cvae=CVAEConfig(latent="continuous", k=check.k)),
        "train --starts 3": lambda name: st.starts(check, name, 3, sizes["start_steps"]),
        f"eval pass ({dtype})": lambda name: st.evaluation(check, name),
        "generate (sampled, T=1)": lambda name: st.generation(check, name, temperature=1.0),
        f"full step, {sizes['large']} shape": lambda name: large_step(check, name, sizes["large"], lines,
                                                                       sizes["large_batch"], context),
        "full, 2 ranks (DDP, NCCL)": lambda name: two_ranks(check, name, args),
    }
    for name, make in stages.items():
        st.run_stage(check, rows, name, lambda: make(name))
    report(args, check, rows, sizes, params, time.perf_counter() - started)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def report(args, check: st.Check, rows: list[st.Row], sizes: dict, params: int, total_s: float) -> None:
    peak = f"peak {check.peak:g} TFLOPS dense bf16" if check.peak else "no known peak: MFU n/a"
    argv = " ".join("OUT" if a == str(args.out) else a for a in sys.argv[1:])
    header = (f"`python scripts/gpu_check.py {argv}`, "
              f"{date.today()}, {device_name(check.device)}, {peak}, torch {torch.__version__}, {check.dtype}, "
              f"{params:,} parameters ({sizes['shape']} shape), {sizes['rows']} rows of about {sizes['seq_len']} "
              f"tokens, batch {check.batch}, K {check.k}, {check.warmup} warm-up + {check.steps} timed steps; "
              f"total {total_s:.0f} s")
    if check.device.type != "cuda":
        header += "; on the CPU: not a GPU figure, the targets are checked on a GPU only"
    judged = targets(rows, sizes["seq_len"], check.device.type == "cuda")
    text = f"{header}\n\n{markdown(rows)}\n\nTargets:\n" + "\n".join(judged) + "\n"
    (args.out / "gpu_check.md").write_text(text)
    (args.out / "gpu_check.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
