"""The README's worked example for a chat model, end to end on CPU, with each command's wall time.

    python scripts/chat_example.py OUT [--lines 3000] [--finetune-steps 400] [--cvae-steps 600] [--threads 1]

Nothing is downloaded. The script makes what a user brings: a JSON-lines task (additions answered in
two forms, "the sum is 7" or "7 is the sum", labelled ``strategy``) and a chat model that knows both
forms but not which one (a small Qwen2 with a ChatML tokenizer, built from a config and fine-tuned
here on the task in its chat format). Then it runs the README's commands as a user would, each a
`tokweight` subprocess: convert, extract --template chat, sql over the store (where b lies), train
--k 2, eval, generate, encode and sql over the posteriors (what z means), printing each command, its
wall time and what it said. Deterministic on CPU: a rerun prints the same numbers. Writes under OUT:
task.jsonl, chat-model/, data/, store/, run/, inputs.jsonl, outputs.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from tokweight.experiments.chat_model import save_chat_model

B_PROFILE = (  # where the base model's surprisal lies in S: the first token decides the form
    "SELECT strategy, round(avg(b[1]), 3) AS b_first_token, round(avg(b_sum - b[1]), 3) AS b_rest, "
    "round(avg(T), 1) AS tokens, count(*) AS n FROM examples GROUP BY ALL ORDER BY ALL")
ANSWER_FIRST_BY_ANSWER = (  # which latent value each answer's "answer-first" examples took, from the task's own lines
    "SELECT regexp_extract(t.y, '[0-9]+')::int AS answer, "
    "round(avg(p.latent) FILTER (WHERE p.strategy = 'answer-first'), 2) AS latent_of_answer_first, "
    "round(avg(p.latent) FILTER (WHERE p.strategy = 'answer-last'), 2) AS latent_of_answer_last, count(*) AS n "
    "FROM posteriors p JOIN read_json('{task}') t USING (key) GROUP BY ALL ORDER BY answer")
FORMS = {"answer-last": "the sum is {c}", "answer-first": "{c} is the sum"}  # strategy -> y's form


def question(a: int, b: int) -> str:
    return f"what is {a} plus {b}?"


def write_task(path: Path, lines: int, seed: int) -> list[dict]:
    """``lines`` additions of two digits 1-9, each answered in a form drawn with probability 1/2."""
    rng = random.Random(seed)
    rows = []
    for i in range(lines):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        strategy = rng.choice(sorted(FORMS))
        rows.append({"key": f"q{i:05d}", "x": question(a, b), "y": FORMS[strategy].format(c=a + b),
                     "strategy": strategy})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def conversation_ids(tokenizer, row: dict) -> tuple[list[int], int]:
    """The conversation's ids in the model's chat template, and where the assistant's tokens start."""
    user = [{"role": "user", "content": row["x"]}]
    prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True)["input_ids"]
    ids = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": row["y"]}])["input_ids"]
    return ids, len(prompt)


def assistant_batches(tokenizer, rows: list[dict], batch_size: int, rng: random.Random):
    """Endless shuffled batches (ids, labels): labels -100 except on the assistant's tokens through its
    end-of-turn token, the tokens a chat model is fine-tuned to produce."""
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    encoded = []
    for row in rows:
        ids, start = conversation_ids(tokenizer, row)
        end = ids.index(end_of_turn, start) + 1
        encoded.append((ids[:end], [-100] * start + ids[start:end]))
    while True:
        rng.shuffle(encoded)
        for i in range(0, len(encoded) - batch_size + 1, batch_size):
            chunk = encoded[i:i + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            ids = [ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in chunk]
            labels = [labels + [-100] * (width - len(labels)) for _, labels in chunk]
            yield torch.tensor(ids), torch.tensor(labels)


def fine_tune(model_dir: Path, rows: list[dict], steps: int, seed: int, batch_size: int = 64, lr: float = 3e-3):
    """A plain torch loop on the assistant tokens; the fine-tuned weights replace the initial ones."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).train()
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batches = assistant_batches(tokenizer, rows, batch_size, random.Random(seed))
    for step in range(steps):
        ids, labels = next(batches)
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  fine-tune step {step}: assistant-token loss {loss.item():.3f} nats")
    model.save_pretrained(model_dir)


def transformers_quiet() -> None:
    """No progress bars from this script's own loads and saves: the output is the example's."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def run_command(args: list[str], log: list[tuple[str, float]]) -> str:
    """Run `tokweight ARGS` in this Python's environment, print it and its wall time; its stdout."""
    shown = "tokweight " + shlex.join(args)
    print(f"\n$ {shown}", flush=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tokweight.cli", *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{shown} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    print(f"  [{seconds:.1f} s]")
    log.append((shown, seconds))
    return done.stdout


def print_training(metrics: Path) -> None:
    """The validations' MI and I(z; strategy) and why the run stopped, from the run's metrics.jsonl."""
    for record in map(json.loads, metrics.read_text().splitlines()):
        if record.get("split") == "val":
            print(f"  val step {record['step']}: exact MI {record['mi']:.3f} nats, I(z; strategy) "
                  f"{record['strategy_mi']:.3f}, NLL {record['nll_token_mean']:.4f} nats/token "
                  f"(base {record['base_nll_token_mean']:.4f})")
        elif "stop" in record:
            print(f"  stopped: {record['stop']['reason']} at step {record['stop']['step']} "
                  f"(best validation at step {record['stop']['best_step']})")


def tail(text: str, n: int) -> None:
    for line in text.strip().splitlines()[-n:]:
        print("  " + line)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def make_task_and_model(out: Path, args) -> None:
    """What a user brings: task.jsonl and a fine-tuned chat model in chat-model/."""
    rows = write_task(out / "task.jsonl", args.lines, args.seed)
    model_dir = out / "chat-model"
    save_chat_model(model_dir, [text for r in rows for text in (r["x"], r["y"])] + ["user", "assistant"],
                    hidden_size=64, seed=args.seed)
    print(f"{len(rows)} lines in {out / 'task.jsonl'}, e.g. {json.dumps(rows[0])}\n"
          f"a chat model in {model_dir}, fine-tuned on the task in its chat format:")
    fine_tune(model_dir, rows, args.finetune_steps, args.seed)


def run_user_path(out: Path, args, log: list[tuple[str, float]]) -> None:
    """The README's commands, in its order, on what ``make_task_and_model`` wrote."""
    d = {name: str(out / name) for name in ("task.jsonl", "chat-model", "data", "store", "run", "inputs.jsonl",
                                             "outputs.jsonl")}
    threads = ["--threads", str(args.threads)]
    converted = json.loads(run_command(["convert", "--jsonl", d["task.jsonl"], "--out", d["data"], "--overwrite"],
                                       log))
    print(f"  splits {converted['splits']}")
    extracted = json.loads(run_command(["extract", "--checkpoint", d["chat-model"], "--data", d["data"],
                                        "--store", d["store"], "--template", "chat", "--no-progress"], log))
    print(f"  fingerprint {extracted['fingerprint']}: {extracted['tokens_written']} tokens of S, "
          f"{extracted['tokens_per_s']} per second")
    tail(run_command(["sql", d["store"], B_PROFILE], log), 30)
    run_command(["train", "--checkpoint", d["chat-model"], "--data", d["data"], "--store", d["store"],
                 "--out", d["run"], "--k", "2", "--steps", str(args.cvae_steps), *threads], log)
    print_training(out / "run" / "metrics.jsonl")
    run_command(["eval", "--run", d["run"], "--data", d["data"], *threads], log)
    print("  " + json.loads((out / "run" / "eval.json").read_text())["z_used"]["statement"])

    Path(d["inputs.jsonl"]).write_text("".join(json.dumps({"key": f"in{i}", "x": question(a, b)}) + "\n"
                                               for i, (a, b) in enumerate([(3, 4), (8, 9), (2, 2)])))
    run_command(["generate", "--run", d["run"], "--input", d["inputs.jsonl"], "--out", d["outputs.jsonl"],
                 *threads], log)
    for line in Path(d["outputs.jsonl"]).read_text().splitlines():
        print("  " + line)
    run_command(["encode", "--run", d["run"], "--data", d["data"], *threads], log)
    for query in ("SELECT latent, count(*) FROM posteriors GROUP BY ALL",  # the README's
                  "SELECT strategy, latent, count(*) FROM posteriors GROUP BY ALL ORDER BY ALL",
                  ANSWER_FIRST_BY_ANSWER.format(task=d["task.jsonl"])):
        tail(run_command(["sql", d["store"], "--run", d["run"], query], log), 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--lines", type=int, default=3000)
    parser.add_argument("--finetune-steps", type=int, default=400)
    parser.add_argument("--cvae-steps", type=int, default=600)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers_quiet()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"load average {load_average()} on {os.cpu_count()} CPUs; torch threads {args.threads}")
    total = time.perf_counter()
    make_task_and_model(args.out, args)
    made = time.perf_counter() - total
    log: list[tuple[str, float]] = []
    run_user_path(args.out, args, log)
    print(f"\n{'seconds':>8}  command\n{made:8.1f}  (the task, the chat model and its fine-tune)")
    for shown, seconds in log:
        print(f"{seconds:8.1f}  {shown if len(shown) < 100 else shown[:96] + ' ...'}")
    print(f"{time.perf_counter() - total:8.1f}  total; load average {load_average()}")


if __name__ == "__main__":
    main()
