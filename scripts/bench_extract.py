"""Extraction throughput against a bare forward pass over the same batches (SPEC §6).

On the `default` synthetic data (generated into --workdir once and reused), with a
briefly trained base model unless --checkpoint is given (quality does not matter for
speed). Prints, side by side from one run:

- bare forward tokens/s: `model(input_ids)` over exactly the batches extraction builds
  (read, encoded and bucketed beforehand, not timed): the limit;
- scoring tokens/s: the same plus float32 surprisal, entropy and top-1 over S;
- full extraction tokens/s: `pipeline.extract.run` end to end (read tars, parse, encode,
  bucket, score, write Parquet, fsync, manifest) into a fresh store, and the ratio;
- the padded fraction of computed tokens, and the LM head's share of the forward;
- bytes per S token of the `b` column on disk (Parquet column-chunk metadata).

Tokens are S tokens (the ones stored) for every throughput, so the ratios compare
like with like.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import torch

from pipeline.bucketing import bucket, padded_fraction, plan_batches
from pipeline.extract import ExtractConfig, InputShard, Task, encode, load_shard, read_samples, run, score_batch
from pipeline.shards import resolve_shards, shard_name
from pipeline.synth import PRESETS, write_dataset
from pipeline.templates import collate, gather_s
from store.baseline_store import BaselineStore
from training.checkpoint import load_checkpoint
from training.train_base import BASE_PRESETS, BaseTrainConfig, run as train_base


def prepare(workdir: Path, checkpoint: str | None, train_steps: int) -> tuple[Path, Path]:
    data = workdir / "data"
    if not (data / "dataset.json").is_file():
        write_dataset(replace(PRESETS["default"], seed=0), data, overwrite=True)
    if checkpoint:
        return data, Path(checkpoint)
    ckpt = workdir / f"base-{train_steps}"
    if not (ckpt / "fingerprint.json").is_file():
        train_base(BaseTrainConfig(data=str(data), out=str(ckpt), **{**BASE_PRESETS["default"],
                                                                     "steps": train_steps, "eval_every": train_steps}))
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
        for items in bucket(encoded, batch_tokens, lambda e: e.scored_length):
            batches.append(collate([e.ids for e in items], [e.layout for e in items]))
    return batches, padded / computed


def read_all(data: Path, ckpt) -> None:
    """The reading stage alone (tar scan, WebDataset, JSON, validation, encoding) over every shard."""
    root, paths = resolve_shards(data)
    for i, path in enumerate(paths):
        task = Task(InputShard(path, shard_name(root, path), 0, ""), f"part-{i:05d}.parquet", 0)
        load_shard(task, ckpt.vocab, ckpt.model.cfg.block_size, "error")


def timed(fn, repeats: int) -> float:
    """Best of ``repeats`` wall times (the machine is shared and noisy)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


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


@torch.inference_mode()
def head_share(model, batches) -> tuple[float, float]:
    """(time of hidden @ wte.T on every position, on S positions only) / time of the forward."""
    device = _device_of(model)
    hiddens = [model(b.input_ids[:, : int(b.logit_pos.max()) + 1].to(device))[1] for b in batches]
    positions = [b.logit_pos.to(device) for b in batches]
    wte = model.wte.weight
    full = timed(lambda: ([h @ wte.T for h in hiddens], _sync(device)), 3)
    s_only = timed(lambda: ([gather_s(h, p) @ wte.T for h, p in zip(hiddens, positions)], _sync(device)), 3)
    forward = timed(lambda: bare_forward(model, batches), 3)
    return full / forward, s_only / forward


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "tokweight-bench-extract"))
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--train-steps", type=int, default=50)
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    data, ckpt_dir = prepare(workdir, args.checkpoint, args.train_steps)
    ckpt = load_checkpoint(ckpt_dir, device=args.device)
    batches, pad = build_batches(data, ckpt, args.batch_tokens)
    s_tokens = sum(int(b.mask.sum()) for b in batches)
    computed = sum(b.input_ids.shape[0] * (int(b.logit_pos.max()) + 1) for b in batches)
    bare_forward(ckpt.model, batches[:4])  # warm-up

    t_bare = timed(lambda: bare_forward(ckpt.model, batches), args.repeats)
    t_score = timed(lambda: scoring(ckpt.model, batches), args.repeats)
    t_load = timed(lambda: read_all(data, ckpt), 1)
    t_extract = float("inf")
    for _ in range(args.repeats):
        store = workdir / "store"
        shutil.rmtree(store, ignore_errors=True)
        start = time.perf_counter()
        run(ExtractConfig(checkpoint=str(ckpt_dir), data=str(data), store=str(store),
                          batch_tokens=args.batch_tokens, device=args.device, progress=False))
        t_extract = min(t_extract, time.perf_counter() - start)
    full_head, s_head = head_share(ckpt.model, batches)
    b_bpt, part_bpt = b_bytes_per_token(workdir / "store")

    print(f"data: {data} ({len(batches)} batches, {s_tokens} S tokens, {computed} computed tokens, "
          f"batch_tokens={args.batch_tokens}, threads={args.threads}, device={args.device})")
    print(f"model: {ckpt.model.cfg}")
    print(f"bare forward      {s_tokens / t_bare:12.0f} S tok/s   ({t_bare:.3f} s)")
    print(f"forward + scoring {s_tokens / t_score:12.0f} S tok/s   ({t_score:.3f} s)  ratio {t_bare / t_score:.3f}")
    print(f"read+parse+encode {s_tokens / t_load:12.0f} S tok/s   ({t_load:.3f} s)  (overlapped with the forward)")
    print(f"full extraction   {s_tokens / t_extract:12.0f} S tok/s   ({t_extract:.3f} s)  ratio {t_bare / t_extract:.3f}"
          "  (target >= 0.9)")
    print(f"padded fraction of computed tokens: {pad:.4f}  (target <= 0.05)")
    print(f"LM head share of the forward: all positions {full_head:.3f}, S positions only {s_head:.3f}")
    print(f"b column: {b_bpt:.3f} bytes per S token  (target <= 4.5); whole part: {part_bpt:.3f} bytes per S token")


if __name__ == "__main__":
    main()
