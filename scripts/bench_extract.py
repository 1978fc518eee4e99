"""Extraction throughput against a bare forward pass over the same batches (docs/contract.md §6).

On the `default` synthetic data (--data, or generated into --workdir once and reused),
with the given --checkpoint or a briefly trained base model (quality does not matter for
speed). The machine is shared and noisy, so every round runs each measurement once,
interleaved, and the medians over --repeats rounds are printed side by side, with the
load average before and after; each ratio to the bare forward is also taken within each round
(the two runs back to back, under about the same load) and its median over the rounds is the
headline figure, which a neighbour's burst in one round moves least:

- bare forward tokens/s: `model(input_ids)` over exactly the batches extraction builds
  (read, encoded and bucketed beforehand, not timed): the limit;
- forward + scoring tokens/s: the same plus float32 surprisal, entropy and top-1 over S;
- full extraction tokens/s: `pipeline.extract.extract` end to end (read tars, parse, encode,
  bucket, score, write Parquet, fsync, manifest) into a fresh store, with the reader
  process and without it, and their ratios to the bare forward; the one that the default
  (`reader_process=None`: `pipeline.extract.extract.reader_pays`) chooses here is named with its ratio;
- the read + parse + encode + batch stage alone (once);
- the reader process's start: seconds until a new one answers (its interpreter and the reading stage's
  modules), and until it hands back shard 0 given the vocabulary, beside preparing shard 0 here;
- with --stages: where one extraction's time goes, per mode: wall and main-thread CPU seconds of loading,
  planning, the first shard prepared here, scoring, waiting for the reader, checking its marked rows and
  the tail (last part, manifest), and the reader process's CPU seconds;
- the padded fraction of computed tokens, and bytes per S token of `b` on disk;
- with --hf-export: the same checkpoint exported with `export-hf` and run through the
  Hugging Face path (transformers' GPT2LMHeadModel), scoring and in-process extraction,
  each with its ratio to the native path's.

--checkpoint may be a tokweight checkpoint or a Hugging Face model directory.

With --http, only this: extraction of the same shards served over HTTP on this machine (a
local ``http.server`` process, read through a URL list) against extraction from local disk,
both with the reader process (which overlaps the fetch with the forward), interleaved, and the
median ratio within rounds (target >= 0.9).

With --template chat (the model's chat template) or --template FILE (a string template), every
measurement runs in that template: on --data and --checkpoint, or by default on --rows of the
additions task of `scripts/chat_example.py` (string x and y, 10 shards) and a 2-layer, 32-wide Qwen2
chat model with a byte-level BPE tokenizer and a ChatML template, built from a config into --workdir
(nothing is downloaded; its `<|endoftext|>` ends y under a string template). The read + encode + batch
stage alone is then also timed on one core (the process pinned to one CPU; S tokens per CPU second
and per wall second): rendering the template and tokenizing, which on the built-in template is a lookup.

Tokens are S tokens (the ones stored) for every throughput, so the ratios compare
like with like.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pyarrow.parquet as pq
import torch

from tokweight.config_files import preset_config
from tokweight.pipeline.extract import extract
from tokweight.pipeline.models import hf
from tokweight.pipeline.tokens import hf_vocab
from tokweight.pipeline.data.bucketing import padded_fraction, plan_batches
from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import cpus_per_process, run, uses_reader_process
from tokweight.pipeline.extract.prepare import ShardBatches, encode, prepare_shard, read_samples
from tokweight.pipeline.extract.score import score_batch
from tokweight.pipeline.extract.reader import ReaderProcess, busy_cpus, gc_frozen
from tokweight.pipeline.extract.plan import InputShard, Task, run_inputs
from tokweight.pipeline.data.shards import resolve_shards, shard_name
from tokweight.pipeline.data.config import SynthConfig
from tokweight.pipeline.data.synth import write_dataset
from tokweight.pipeline.tokens.templates import Batch, template_option
from tokweight.store.baseline_store import BaselineStore
from tokweight.training.config.base import BaseTrainConfig
from tokweight.training.loop.train_base import run as train_base


def prepare_text(workdir: Path, data: str | None, checkpoint: str | None, rows: int) -> tuple[Path, Path]:
    """String data and a chat model for a chat or string template: the given ones, or the additions task's
    ``rows`` lines in 10 shards and a 2-layer, 32-wide Qwen2 ChatML model over them, made once in ``workdir``."""
    from tokweight.pipeline.data.samples import Sample
    from tokweight.pipeline.data.shards import write_shards
    from tokweight.experiments.chat_model import save_chat_model

    made = workdir / f"chat-{rows}"
    task = runpy.run_path(str(Path(__file__).with_name("chat_example.py")))["write_task"]
    if not (made / "chat-model" / "config.json").is_file():
        lines = task(workdir / f"task-{rows}.jsonl", rows, 0)
        write_shards([Sample(key=r["key"], x=r["x"], y=r["y"], strategy=r["strategy"]) for r in lines],
                     made / "data", shard_size=-(-rows // 10))
        save_chat_model(made / "chat-model", [t for r in lines for t in (r["x"], r["y"])] + ["user", "assistant"],
                        hidden_size=32, layers=2)
    return Path(data) if data else made / "data", Path(checkpoint) if checkpoint else made / "chat-model"


def template_arg(template: str, workdir: Path) -> str:
    """--template as extraction takes it: "string" is a plain prompt/answer string template, written to ``workdir``."""
    if template != "string":
        return template
    path = workdir / "string-template.json"
    path.write_text(json.dumps({"text": "Question: {x}\nAnswer: {y}", "end": "<|endoftext|>"}))
    return str(path)


def prepare(workdir: Path, data: str | None, checkpoint: str | None, train_steps: int) -> tuple[Path, Path]:
    data = Path(data) if data else workdir / "data"
    if not (data / "dataset.json").is_file():
        write_dataset(preset_config(SynthConfig, "synth", "default", seed=0), data, overwrite=True)
    if checkpoint:
        return data, Path(checkpoint)
    ckpt = workdir / f"base-{train_steps}"
    if not (ckpt / "fingerprint.json").is_file():
        train_base(preset_config(BaseTrainConfig, "base", "default", data=str(data), out=str(ckpt), steps=train_steps,
                                 eval_every=train_steps))
    return data, ckpt


def build_batches(data: Path, ckpt, batch_tokens: int):
    """Every shard's batches exactly as extraction plans them, and the padded fraction of the plans."""
    root, paths = resolve_shards(data)
    batches, padded, computed = [], 0.0, 0
    for path in paths:
        name = shard_name(root, path)
        encoded = list(encode(read_samples(path, name, None), ckpt.vocab, ckpt.model.cfg.block_size, name, None))
        lengths = [e.scored_length for e in encoded]
        plan = plan_batches(lengths, batch_tokens)
        shard_computed = sum(len(b) * max(lengths[i] for i in b) for b in plan)
        padded, computed = padded + padded_fraction(lengths, plan) * shard_computed, computed + shard_computed
        batches += [Batch.of(arrays) for _, arrays in ShardBatches.build(name, encoded, batch_tokens).batches]
    return batches, padded / computed


def read_all(data: Path, ckpt, batch_tokens: int) -> None:
    """The reading stage alone (tar scan, WebDataset, JSON, validation, encoding, batching) over every shard, with
    the garbage collector as extraction runs it (``gc_frozen``)."""
    root, paths = resolve_shards(data)
    with gc_frozen():
        for i, path in enumerate(paths):
            task = Task(InputShard(path, shard_name(root, path), 0, ""), f"part-{i:05d}.parquet", 0)
            prepare_shard(task, ckpt.vocab, ckpt.model.cfg.block_size, "error", batch_tokens)


def read_on_one_core(data: Path, ckpt, batch_tokens: int, repeats: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds), the fastest of ``repeats`` runs of ``read_all`` with this process pinned to one
    CPU (the tokenizer's threads too). CPU time counts every thread, and what other jobs take from the core not."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        runs = []
        for _ in range(repeats):
            cpu, wall = time.process_time(), time.perf_counter()
            read_all(data, ckpt, batch_tokens)
            runs.append((time.process_time() - cpu, time.perf_counter() - wall))
    finally:
        os.sched_setaffinity(0, cpus)
    return min(r[0] for r in runs), min(r[1] for r in runs)


def reader_start(data: Path, ckpt, batch_tokens: int) -> tuple[float, float, float]:
    """(seconds from starting a reader process to its first answer: its interpreter and the reading stage's modules;
    seconds from starting one to having shard 0 back from it, given the vocabulary; seconds to prepare shard 0 here)."""
    root, paths = resolve_shards(data)
    task = Task(InputShard(paths[0], shard_name(root, paths[0]), 0, ""), "part-00000.parquet", 0)
    vocab = ckpt.vocab.for_reader() if hasattr(ckpt.vocab, "for_reader") else ckpt.vocab
    there = partial(prepare_shard, vocab=vocab, block_size=ckpt.model.cfg.block_size, policy="error",
                    batch_tokens=batch_tokens)

    def answered(prepare, tasks: list) -> float:
        start = time.perf_counter()
        with ReaderProcess() as reader:
            reader.prepare(prepare)
            list(reader.read(tasks))
            return time.perf_counter() - start

    here = timed(lambda: prepare_shard(task, ckpt.vocab, ckpt.model.cfg.block_size, "error", batch_tokens))
    return answered(int, [0]), answered(there, [task]), here


STAGES = ((extract, "load_backbone", "load"), (extract, "_plan_on_rank0", "plan"), (extract, "score_shard", "score"),
          (extract.ReaderProcess, "_receive", "wait for the reader"), (hf_vocab.TokenizerVocab, "verify", "check marked rows"))


@contextmanager
def stage_times():
    """{stage: [wall s, main-thread CPU s]} of the extraction run inside, and its events (stage, start, end) in
    seconds since it began, from the extraction module's own functions wrapped for the block."""
    totals: dict[str, list[float]] = {}
    events: list[tuple[str, float, float]] = []
    began = time.perf_counter()

    def timing(fn, stage):
        def timed_call(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                total = totals.setdefault(stage, [0.0, 0.0])
                total[0] += end - wall
                total[1] += time.thread_time() - cpu
                events.append((stage, wall - began, end - began))
        return timed_call

    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in STAGES]
    for owner, name, stage in STAGES:
        setattr(owner, name, timing(getattr(owner, name), stage))
    try:
        yield totals, events
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def where_time_goes(extraction, reader_process: bool) -> str:
    """One extraction's stages (``stage_times``), the first shard prepared here (from the end of planning to the first
    scoring, less the checks), the tail, and CPU seconds of the main thread and of the reader process."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu, start = time.thread_time(), time.perf_counter()
    with stage_times() as (totals, events):
        extraction(reader_process)
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reader_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    plan_end = max(e for stage, _, e in events if stage == "plan")
    scores = [(s, e) for stage, s, e in events if stage == "score"]
    checks_before = sum(e - s for stage, s, e in events if stage == "check marked rows" and e <= scores[0][0])
    stages = {name: f"{w:.3f}/{c:.3f}" for name, (w, c) in totals.items()}
    stages["first shard here"] = f"{scores[0][0] - plan_end - checks_before:.3f}"
    stages["tail"] = f"{wall - scores[-1][1]:.3f}"
    return (f"{'reader process' if reader_process else 'in-process'}: {wall:.3f} s wall, main thread {cpu:.3f} CPU s, "
            f"reader process {reader_cpu:.3f} CPU s; stages (wall/CPU s): " + ", ".join(f"{k} {v}" for k, v in stages.items()))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def bare_forward(model, batches) -> None:
    """The limit: host-to-device copy and forward, nothing read back."""
    device = _device_of(model)
    for batch in batches:
        model(batch.input_ids[:, : int(batch.logit_pos.max()) + 1].to(device))
    _sync(device)


def scoring(model, batches) -> None:
    """Forward plus surprisal, entropy and top-1 over S, read back to the host as extraction does."""
    device = _device_of(model)
    for batch in batches:
        [t.cpu() for t in score_batch(model, batch.to(device))]


def b_bytes_per_token(store: Path) -> tuple[float, float]:
    """(bytes of the b column, bytes of the whole part) per S token over every part."""
    view = BaselineStore(store).open()
    b_bytes = 0
    for part in view.parts():
        meta = pq.ParquetFile(view.part_path(part["name"])).metadata
        for rg in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                column = meta.row_group(rg).column(c)
                if column.path_in_schema == "b.list.element":
                    b_bytes += column.total_compressed_size
    tokens = view.manifest["stats"]["tokens"]
    return b_bytes / tokens, sum(p["bytes"] for p in view.parts()) / tokens


def default_mode(data: Path, device: str) -> str:
    """The reading mode that extraction's default (reader_process=None) chooses here for ``data``'s shards."""
    default = ExtractConfig(checkpoint="", data=str(data), store="", device=device)
    return "reader process" if uses_reader_process(default, len(resolve_shards(data)[1])) else "in-process"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "tokweight-bench-extract"))
    parser.add_argument("--data", default=None, help="dataset directory (default: generate `default` in --workdir)")
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--train-steps", type=int, default=50)
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf-export", action="store_true",
                        help="also time the checkpoint exported with export-hf, through the Hugging Face path")
    parser.add_argument("--http", action="store_true",
                        help="only compare extraction over HTTP (a local http.server process) with local disk")
    parser.add_argument("--template", default="tokweight",
                        help='"tokweight" (default: the built-in template, synthetic data), "chat" (the model\'s chat '
                             'template), a string template FILE, or "string" (Question: {x} / Answer: {y}); with no '
                             "--data and --checkpoint, the additions task and a small ChatML model")
    parser.add_argument("--rows", type=int, default=20000, help="lines of the additions task (--template only)")
    parser.add_argument("--stages", action="store_true",
                        help="also time where one extraction's time goes, in each mode (stage_times)")
    return parser.parse_args()


@contextmanager
def http_server(directory: Path):
    """The base URL of a local ``http.server`` process serving ``directory`` (a process, so that serving
    takes no GIL from the extraction measured beside it)."""
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory",
                               str(directory)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 40123 (http://127.0.0.1:40123/) ..."
        yield line.split("(", 1)[1].split(")", 1)[0]
    finally:
        server.terminate()
        server.wait()


def read_inputs(source: str, ckpt, batch_tokens: int) -> None:
    """The reading stage over every input of ``source`` as extraction plans it: local tars hashed first, URLs
    fetched as they are read."""
    for i, shard in enumerate(run_inputs(source)[1]):
        prepare_shard(Task(shard, f"part-{i:05d}.parquet", 0), ckpt.vocab, ckpt.model.cfg.block_size, "error",
                      batch_tokens)


def http_mode(args: argparse.Namespace, workdir: Path, data: Path, ckpt_dir: Path) -> None:
    """Extraction from the shards served over HTTP against from local disk: interleaved rounds, reader process."""
    root, paths = resolve_shards(data)
    with http_server(data) as base:
        listing = workdir / "urls.txt"
        listing.write_text("".join(f"{base}{shard_name(root, p)}\n" for p in paths))

        def extraction(source: str, store_name: str) -> None:
            store = workdir / store_name
            shutil.rmtree(store, ignore_errors=True)
            run(ExtractConfig(checkpoint=str(ckpt_dir), data=source, store=str(store), batch_tokens=args.batch_tokens,
                              device=args.device, progress=False, reader_process=True))

        times, loads = interleaved({"local disk": lambda: extraction(str(data), "store-disk"),
                                    "HTTP": lambda: extraction(str(listing), "store-http")}, args.repeats)
        ckpt = load_backbone(ckpt_dir)
        reading = {name: timed(lambda: read_inputs(source, ckpt, args.batch_tokens))
                   for name, source in (("local disk", str(data)), ("HTTP", str(listing)))}
    print(f"data: {data} ({len(paths)} shards, {sum(p.stat().st_size for p in paths) / 2**20:.1f} MiB), "
          f"threads={args.threads}, device={args.device}, reader process; {os.cpu_count()} CPUs")
    print("reading alone, in this process (inputs hashed or fetched, read, encoded, batched): "
          + ", ".join(f"{name} {t:.3f} s" for name, t in reading.items()))
    for name, ts in times.items():
        runs = ", ".join(f"{t:.2f} s at load {at:.2f}" for t, at in zip(ts, loads[name]))
        print(f"extract from {name:<11} median {statistics.median(ts):7.3f} s  (runs: {runs})")
    ratio = statistics.median(disk / http for disk, http in zip(times["local disk"], times["HTTP"]))
    print(f"HTTP / local disk throughput, within rounds: {ratio:.3f}  (target >= 0.9)")


def interleaved(rounds: dict, repeats: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds of each round, ``repeats`` times, one of each in turn (the machine's noise hits all alike),
    and the 1-minute load average after each run."""
    times: dict[str, list[float]] = {name: [] for name in rounds}
    loads: dict[str, list[float]] = {name: [] for name in rounds}
    for _ in range(repeats):
        for name, fn in rounds.items():
            times[name].append(timed(fn))
            loads[name].append(os.getloadavg()[0])
    return times, loads


def print_hf_ratios(median: dict[str, float]) -> None:
    for native, via_hf in (("forward + scoring", "HF: forward + scoring"),
                           ("extract, in-process", "HF: extract, in-process")):
        print(f"HF path / native path, {native}: {median[native] / median[via_hf]:.3f}  (target >= 0.9)")


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    template = template_arg(args.template, workdir)
    builtin = template == "tokweight"
    if args.hf_export and not builtin:
        raise SystemExit("--hf-export exports a tokweight checkpoint: it takes the built-in template only")
    if args.http and not builtin:
        raise SystemExit("--http compares reading over HTTP with local disk on the built-in template")
    data, ckpt_dir = (prepare(workdir, args.data, args.checkpoint, args.train_steps) if builtin
                      else prepare_text(workdir, args.data, args.checkpoint, args.rows))
    if args.http:
        return http_mode(args, workdir, data, ckpt_dir)
    ckpt = load_backbone(ckpt_dir, device=args.device, template=template_option(template))
    batches, pad = build_batches(data, ckpt, args.batch_tokens)
    s_tokens = sum(int(b.mask.sum()) for b in batches)
    computed = sum(b.input_ids.shape[0] * (int(b.logit_pos.max()) + 1) for b in batches)
    bare_forward(ckpt.model, batches[:4])  # warm-up
    load_before = load()

    def extraction(reader_process: bool, checkpoint: Path = ckpt_dir, store_name: str = "store") -> None:
        store = workdir / store_name
        shutil.rmtree(store, ignore_errors=True)
        run(ExtractConfig(checkpoint=str(checkpoint), data=str(data), store=str(store), batch_tokens=args.batch_tokens,
                          device=args.device, progress=False, reader_process=reader_process, template=template))

    rounds = {"bare forward": lambda: bare_forward(ckpt.model, batches),
              "forward + scoring": lambda: scoring(ckpt.model, batches),
              "extract, reader process": lambda: extraction(True),
              "extract, in-process": lambda: extraction(False)}
    if args.hf_export:
        from tokweight.training.export.checkpoint import export_hf

        hf_dir = export_hf(ckpt_dir, workdir / "hf-export")
        hf = load_backbone(hf_dir, device=args.device)
        rounds |= {"HF: forward + scoring": lambda: scoring(hf.model, batches),
                   "HF: extract, in-process": lambda: extraction(False, hf_dir, "store-hf")}
    times, loads = interleaved(rounds, args.repeats)
    stages = [where_time_goes(extraction, mode) for mode in (True, False)] if args.stages else []
    started, first_there, first_here = reader_start(data, ckpt, args.batch_tokens)
    t_read = timed(lambda: read_all(data, ckpt, args.batch_tokens))
    cpu_one, wall_one = (None, None) if builtin else read_on_one_core(data, ckpt, args.batch_tokens, args.repeats)
    b_bpt, part_bpt = b_bytes_per_token(workdir / "store")
    median = {name: statistics.median(ts) for name, ts in times.items()}
    t_bare = median["bare forward"]

    print(f"data: {data} ({len(batches)} batches, {s_tokens} S tokens, {computed} computed tokens, "
          f"batch_tokens={args.batch_tokens}, threads={args.threads}, device={args.device})")
    print(f"model: {ckpt.model.cfg}; template {template}" + ("" if builtin else f", rendered {ckpt.vocab.rendering}"))
    print(f"load average (1, 5, 15 min): before {load_before}, after {load()}; {os.cpu_count()} CPUs; "
          f"medians of {args.repeats} interleaved rounds")
    paired = {name: statistics.median(b / x for b, x in zip(times["bare forward"], ts)) for name, ts in times.items()}
    for name, t in median.items():
        runs = ", ".join(f"{x:.2f} s at load {at:.2f}" for x, at in zip(times[name], loads[name]))
        print(f"{name:<24}{s_tokens / t:10.0f} S tok/s  {t:7.3f} s  ratio to bare {t_bare / t:.3f}, "
              f"within rounds {paired[name]:.3f}  (runs: {runs})")
    print(f"{'read+encode+batch alone':<24}{s_tokens / t_read:10.0f} S tok/s  {t_read:7.3f} s  (one run)")
    if not builtin:
        print(f"{'the same on one core':<24}{s_tokens / cpu_one:10.0f} S tok/s per CPU second ({cpu_one:.3f} s), "
              f"{s_tokens / wall_one:.0f} per wall second ({wall_one:.3f} s); fastest of {args.repeats}  "
              "(target >= 100000 per CPU second)")
    print(f"reader process start: answers after {started:.3f} s (interpreter, reading modules), hands back shard 0 after "
          f"{first_there:.3f} s given the vocabulary; shard 0 prepared here in {first_here:.3f} s")
    for line in stages:
        print(line)
    default = default_mode(data, args.device)
    print(f"default mode here: {default} ({cpus_per_process()} CPUs, {busy_cpus():.2f} busy elsewhere, "
          f"{torch.get_num_threads()} torch threads, device {args.device}: pipeline.extract.extract.reader_pays), extract / bare "
          f"{paired[f'extract, {default}']:.3f} within rounds, {t_bare / median[f'extract, {default}']:.3f} of the medians"
          f"  (target >= {0.95 if builtin else 0.8})")
    if args.hf_export:
        print_hf_ratios(median)
    print(f"padded fraction of computed tokens: {pad:.4f}  (target <= 0.05)")
    print(f"b column: {b_bpt:.3f} bytes per S token  (target <= 4.5); whole part: {part_bpt:.3f} bytes per S token")


if __name__ == "__main__":
    main()
