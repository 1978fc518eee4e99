"""The measuring half of scripts/gpu_check.py: steady-state clocks, counted FLOPs, the GPU's peak, and the stages.

Every timed stage builds its objects in this process the way the command does (``setup.setup``, ``load_run``,
``load_backbone``), puts its inputs on the device first, runs ``warmup`` calls, then times a window of calls:
between two CUDA events on a GPU (the host synchronizes once, at the window's end), by ``time.perf_counter``
elsewhere. Loading, hashing, validation and checkpoint writes are outside the window. FLOPs are those
``torch.utils.flop_counter.FlopCounterMode`` counts over the same calls run once more (forward and backward; the
counter counts what runs, so a recomputed forward under gradient checkpointing is counted too). MFU is the
counted FLOPs over the window's seconds over the GPU's dense bfloat16 peak (``PEAK_TFLOPS``).

Run as a script (by the check, under torchrun) it is one rank of the 2-rank stage: it times training steps
under DistributedDataParallel on NCCL and rank 0 prints its row as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

PEAK_TFLOPS = (  # (a substring of torch.cuda.get_device_name, dense bfloat16 tensor TFLOPS of its datasheet)
    ("H200", 989.0),  # also matches GH200, the same Hopper die
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", 312.0),
)


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    """The peak MFU is taken against: ``given`` (--peak-tflops), else the table's for this GPU; None on a CPU or
    an unknown GPU (MFU then n/a)."""
    if given:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tflops for key, tflops in PEAK_TFLOPS if key in name), None)


# ---------------------------------------------------------------- clocks, FLOPs, memory


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def window_seconds(device: torch.device, fn: Callable, items: list) -> float:
    """Seconds of ``fn(item)`` for every item, back to back: CUDA events around the window on a GPU, the host
    waiting only at its end; ``time.perf_counter`` elsewhere."""
    if device.type != "cuda":
        start = time.perf_counter()
        for item in items:
            fn(item)
        return time.perf_counter() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for item in items:
        fn(item)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1000


def steady_seconds(device: torch.device, fn: Callable, items: list, warmup: int) -> float:
    """Seconds per call over ``items[warmup:]``, after ``fn`` ran on ``items[:warmup]`` (allocator, kernels'
    autotuning, the optimizer's lazy state)."""
    if len(items) <= warmup:
        raise ValueError(f"{len(items)} inputs leave none to time after {warmup} warm-up calls")
    for item in items[:warmup]:
        fn(item)
    return window_seconds(device, fn, items[warmup:]) / (len(items) - warmup)


def counted_flops(fn: Callable, items: list) -> int:
    """FLOPs ``FlopCounterMode`` counts over ``fn(item)`` for every item (matrix products and attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        for item in items:
            fn(item)
    return counter.get_total_flops()


def fresh_memory(device: torch.device) -> None:
    """On a GPU, what earlier stages left freed (their reference cycles collected) and the peak counter
    restarted: a stage's peak is its own. Nothing on the CPU, where no peak is read."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None


# ---------------------------------------------------------------- rows


@dataclass
class Row:
    """One line of the table. ``seconds`` is per ``per`` (a step, a pass, a decode; or the whole stage where
    ``per`` says so); tokens/s, TFLOP/s and MFU are over the same window."""

    stage: str
    seconds: float | None = None
    per: str = ""
    tokens_per_s: float | None = None
    tflops: float | None = None  # achieved TFLOP/s: counted FLOPs / seconds
    mfu: float | None = None
    peak_gib: float | None = None
    status: str = "ok"
    note: str = ""


@dataclass
class Check:
    """What every stage reads: paths, device and sizes."""

    out: Path
    model: Path  # the Hugging Face checkpoint (0.5B-shaped, or the small stand-in)
    data: Path
    store: Path
    device: torch.device
    dtype: str  # the training forward's: "bfloat16" (autocast) or "float32"
    batch: int
    k: int
    warmup: int
    steps: int
    peak: float | None  # TFLOPS; None: MFU n/a
    eval_batch: int
    max_new_tokens: int
    prompts: list[str]  # x of the inputs generate decodes
    kept: dict = field(default_factory=dict)  # what one stage hands the next (the full run's state for resume)

    def mfu(self, flops: float, seconds: float) -> float | None:
        """MFU against the dense bfloat16 peak: only for a bfloat16 forward on a GPU of known peak."""
        if self.peak is None or self.dtype != "bfloat16" or self.device.type != "cuda":
            return None
        return flops / seconds / (self.peak * 1e12)

    def measured(self, stage: str, seconds: float, per: str, tokens: float | None, flops: float | None,
                 note: str = "") -> Row:
        """A row of ``seconds`` per call, ``tokens`` and ``flops`` per call."""
        return Row(stage, seconds, per, tokens / seconds if tokens else None,
                   flops / seconds / 1e12 if flops else None, self.mfu(flops, seconds) if flops else None,
                   peak_gib(self.device), note=note)


def run_stage(check: Check, rows: list[Row], name: str, fn: Callable[[], Row | list[Row]]) -> None:
    """``fn``'s rows appended, or one row saying how it failed: a failed stage does not stop the others."""
    print(f"[gpu_check] {name}", file=sys.stderr, flush=True)
    fresh_memory(check.device)
    start = time.perf_counter()
    try:
        made = fn()
    except Exception as e:  # noqa: BLE001 - the row records it and the next stage runs
        traceback.print_exc(file=sys.stderr)
        message = " ".join(str(e).split())[:160]
        made = Row(name, status=f"failed: {type(e).__name__}: {message}")
        del e
    for row in made if isinstance(made, list) else [made]:
        rows.append(row)
        print(f"[gpu_check] {row.stage}: {row.status}" + (f", {row.seconds:.4g} s/{row.per}" if row.seconds else "")
              + f" ({time.perf_counter() - start:.1f} s with setup)", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- extraction


def shard_batches(data: Path, ckpt, batch_tokens: int) -> tuple[list, int]:
    """(every train shard's ``ShardBatches`` as extraction builds them, their forward tokens: the rows' scored
    lengths)."""
    from tokweight.pipeline.extract.prepare import ShardBatches, encode, read_samples
    from tokweight.pipeline.data.shards import resolve_shards, shard_name

    root, paths = resolve_shards(data / "train")
    shards, tokens = [], 0
    for path in paths:
        name = shard_name(root, path)
        encoded = list(encode(read_samples(path, name, None), ckpt.vocab, ckpt.model.cfg.block_size, name, None))
        tokens += sum(e.scored_length for e in encoded)
        shards.append(ShardBatches.build(name, encoded, batch_tokens))
    return shards, tokens


@torch.inference_mode()
def bare_forward(model, inputs) -> list[torch.Tensor]:
    """What extraction cannot do without: the inputs to the device, the backbone's hidden states, and the head on
    the states that predict S in extraction's chunks; no log-softmax, nothing read back."""
    from tokweight.pipeline.extract.score import LOGIT_CHUNK_ELEMENTS

    device = next(model.parameters()).device
    inputs = inputs.to(device)
    hidden = model.hidden(inputs.input_ids)  # (B, L, d)
    hidden_s = hidden.reshape(-1, hidden.shape[-1]).index_select(0, inputs.positions)  # (N, d)
    chunk = max(1, LOGIT_CHUNK_ELEMENTS // model.cfg.vocab_size)
    return [model.head(h) for h in hidden_s.split(chunk)]


def extraction(check: Check, rounds: int = 3) -> list[Row]:
    """Extraction's scoring loop (``score_shard``: inputs to the device, forward, head on S, float32 b, entropy and
    top-1, back to the host, scattered into the part's table) against the bare forward over the same batches, both
    over every train shard, in alternating rounds (median); the first round is the warm-up."""
    from tokweight.pipeline.models.backbone import load_backbone
    from tokweight.pipeline.extract.config import ExtractConfig
    from tokweight.pipeline.extract.score import ScoreInputs, score_shard
    from tokweight.pipeline.tokens.templates import Batch, Template

    ckpt = load_backbone(check.model, device=check.device, dtype=check.dtype, template=Template("chat"))
    model = ckpt.model.eval()
    shards, tokens = shard_batches(check.data, ckpt, ExtractConfig("", "", "").batch_tokens)
    inputs = [ScoreInputs.of(Batch.of(arrays)) for rows in shards for _, arrays in rows.batches]

    def bare():
        for i in inputs:
            bare_forward(model, i)  # the logits dropped as each batch ends: memory as extraction's

    def scoring():
        for rows in shards:
            score_shard(rows, model, check.device, lambda n: None)

    passes = {"bare": bare, "scoring": scoring}
    times = {name: [] for name in passes}
    for r in range(rounds + 1):
        for name in passes if r % 2 == 0 else reversed(list(passes)):
            seconds = window_seconds(check.device, lambda f: f(), [passes[name]])
            if r:
                times[name].append(seconds)
    flops = counted_flops(lambda f: f(), [passes["bare"]])
    median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    ratio = median["bare"] / median["scoring"]
    per = f"pass ({len(inputs)} batches)"
    return [check.measured("extract: bare forward, head on S", median["bare"], per, tokens, flops),
            check.measured("extract: scoring loop", median["scoring"], per, tokens, flops,
                           note=f"{ratio:.2f} of the bare forward (target >= 0.9)")]


# ---------------------------------------------------------------- training


def train_config(check: Check, out: str, policy: str = "precomputed", checkpoint: Path | None = None,
                 data: Path | None = None, store: Path | None = None, batch: int | None = None,
                 grad_checkpointing: bool = False, length_groups: int | None = None, merge_passes: bool | None = None,
                 **groups):
    """A run's TrainConfig as `tokweight train` builds it, one start, no periodic validation, a step cap far off
    (the learning rate stays at its value), a shuffle buffer of a few batches (it fills before the first batch,
    outside every timed window, and changes no step's cost)."""
    from tokweight.training.config.components import CVAEConfig
    from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

    batch = batch or check.batch
    io = IOConfig(checkpoint=str(checkpoint or check.model), data=str(data or check.data),
                  store=str(store or check.store), out=str(check.out / out), num_workers=0, shuffle_buffer=4 * batch,
                  device=str(check.device), dtype=check.dtype, grad_checkpointing=grad_checkpointing,
                  length_groups=length_groups, merge_passes=merge_passes)
    groups.setdefault("cvae", CVAEConfig(k=check.k))
    groups.setdefault("optim", OptimConfig(steps=10 ** 6, batch_size=batch, starts=1))
    return TrainConfig(io, loss=LossConfig(policy=policy), log=LogConfig(grad_diag_every=0, eval_every=0), **groups)


def fed_batches(state, n: int) -> list[tuple[object, int]]:
    """The run's first ``n`` training batches on its device, each with its tokens (the z-free sequences')."""
    from tokweight.training.loop.stream import TrainStream

    stream, fed = TrainStream(state.spec, 0, 1).batches(0), []
    for _ in range(n):
        batch = next(stream)
        fed.append((batch.to(state.device), int((batch.last_pos + 1).sum())))
    stream.close()
    return fed


def timed_steps(check: Check, state, cfg, name: str, warmup: int, steps: int, note: str = "") -> Row:
    """Steady-state seconds per ``train_step`` (unlogged: no host sync) over ``steps`` batches after ``warmup``,
    its tokens/s, and the FLOPs counted over the same batches stepped once more."""
    from tokweight.training.loop.step import train_step

    fed = fed_batches(state, warmup + steps)
    step = lambda item: train_step(state, item[0], cfg, logged=False)
    seconds = steady_seconds(check.device, step, fed, warmup)
    tokens = sum(t for _, t in fed[warmup:]) / steps  # per step
    batch = cfg.optim.batch_size
    note = f"batch {batch} of {tokens / batch:.0f} tokens" + (f"; {note}" if note else "")
    row = check.measured(name, seconds, "step", tokens, None, note)
    flops = counted_flops(step, fed[warmup:]) / steps
    checkpointed = " (FLOPs include the recomputed forward)" if cfg.io.grad_checkpointing else ""
    return replace(row, tflops=flops / seconds / 1e12, mfu=check.mfu(flops, seconds), note=note + checkpointed)


def training(check: Check, name: str, keep: bool = False, warmup: int | None = None, steps: int | None = None,
             **kwargs) -> Row:
    """A run set up as `tokweight train` sets it up, timed over ``steps`` steps after ``warmup`` (default: the
    check's); ``keep``: its state and config are kept for the resume stage."""
    from tokweight.pipeline.ranks import Ranks
    from tokweight.training.loop.setup import setup

    cfg = train_config(check, **kwargs)
    state = setup(cfg, Ranks(), announce=False)
    row = timed_steps(check, state, cfg, name, warmup or check.warmup, steps or check.steps)
    if keep:  # for resume, and the planner's comparison: the peak, and the batch's tokens per example
        check.kept.update(full=(state, cfg), full_peak=row.peak_gib, full_tokens=round(row.tokens_per_s *
                          row.seconds / cfg.optim.batch_size))
    return row


def resume(check: Check, name: str) -> Row:
    """The full run's checkpoint written at its step, its state dropped, and the run set up again from it (model,
    optimizer and RNG states), then one step: a resume's two costs, each timed (the write synchronized first)."""
    from tokweight.pipeline.ranks import Ranks
    from tokweight.training.loop.callbacks import checkpoint
    from tokweight.training.loop.faults import NO_HOOKS
    from tokweight.training.loop.run_dir import write_config
    from tokweight.training.loop.step import train_step
    from tokweight.training.loop.setup import setup

    if "full" not in check.kept:
        raise RuntimeError("the full fine-tune stage left no run to resume")
    state, cfg = check.kept.pop("full")
    Path(cfg.io.out).mkdir(parents=True, exist_ok=True)
    write_config(cfg)
    synchronize(check.device)
    start = time.perf_counter()
    checkpoint(state, cfg, NO_HOOKS)
    saved, at = time.perf_counter() - start, state.progress.step
    del state
    fresh_memory(check.device)
    start = time.perf_counter()
    state = setup(cfg, Ranks(), announce=False)
    synchronize(check.device)
    loaded = time.perf_counter() - start
    if state.progress.step != at:
        raise RuntimeError(f"resumed at step {state.progress.step}, checkpointed at {at}")
    batch, _ = fed_batches(state, 1)[0]
    train_step(state, batch, cfg, logged=False)
    synchronize(check.device)
    return Row(name, saved + loaded, "write + set-up", peak_gib=peak_gib(check.device),
               note=f"checkpoint write {saved:.1f} s, set-up from it {loaded:.1f} s, at step {at}; a step after it ran")


def starts(check: Check, name: str, n: int, start_steps: int) -> Row:
    """`tokweight train --starts n` in this process (``train.run``): each start trained ``start_steps`` and
    validated, the best continued 2 steps more and validated on the whole val split. Whole-run wall time: starts
    differ from one run in their set-ups and validations, which a step time leaves out."""
    from tokweight.training.loop import train
    from tokweight.training.config.train import OptimConfig

    optim = OptimConfig(steps=start_steps + 2, batch_size=check.batch, starts=n, start_steps=start_steps,
                        start_steps_max=start_steps)
    cfg = train_config(check, out=f"run-starts{n}", optim=optim)
    start = time.perf_counter()
    result = train.run(cfg)
    synchronize(check.device)
    wall = time.perf_counter() - start
    steps = n * start_steps + 2
    return Row(name, wall, "run", peak_gib=peak_gib(check.device),
               note=f"{steps} steps and {n + 1} validations, start {result['start']['seed']} chosen; "
                    f"{wall / steps:.3g} s per step with everything")


# ---------------------------------------------------------------- eval and generate


def trained_run(check: Check, run: str):
    """(config, model in eval mode, vocabulary, state.json) of RUN as eval and generate load it (weights in the
    check's dtype, as their ``--dtype``)."""
    from tokweight.training.loop.run_dir import load_run

    run_dir = check.out / run
    if not (run_dir / "checkpoint" / "state.json").is_file():
        raise RuntimeError(f"{run_dir} has no checkpoint (the resume stage writes it)")
    return load_run(run_dir, str(check.device), check.dtype)


def evaluation(check: Check, name: str, run: str = "run-full") -> Row:
    """Eval's scoring pass (``validation.evaluate_pass``: the K decoders, q, b from the store, the records read
    back) over the val split, batch by batch, under bfloat16 autocast where the check trains in it."""
    from tokweight.training.objective.baselines import make_baseline
    from tokweight.training.loop.batches import StreamSpec, TrainBatch
    from tokweight.pipeline.data.splits import split_urls
    from tokweight.training.config.components import WeightingParams
    from tokweight.training.evaluation.evaluate import eval_baseline
    from tokweight.training.objective.schedules import Schedule
    from tokweight.training.loop.stream import EvalStream, loader
    from tokweight.training.evaluation.validation import Scoring, evaluate_pass

    tcfg, model, vocab, meta = trained_run(check, run)
    urls = split_urls(str(check.data), "val")
    policy, store, _ = eval_baseline(tcfg.loss.policy, tcfg.io, meta, vocab, urls, str(check.data), "val")
    params = WeightingParams(tcfg.loss.eps, tcfg.loss.eps_inv, meta.get("dataset_mean_b"))
    scoring = Scoring(make_baseline(policy, None), tcfg.loss, params, tcfg.cvae, tcfg.optim.seed,
                      Schedule.of(tcfg).at(meta["step"] - 1))
    spec = StreamSpec(urls=urls, vocab=vocab, slots=tcfg.cvae.slots, block_size=model.backbone.cfg.block_size,
                      batch_size=check.eval_batch, store=store, root=str(check.data),
                      on_bad_sample=tcfg.io.on_bad_sample)
    fed = [(b.to(check.device), int((b.last_pos + 1).sum()))
           for b in loader(EvalStream(spec), 0) if isinstance(b, TrainBatch)]

    def scored(item):
        with torch.autocast(check.device.type, dtype=torch.bfloat16, enabled=check.dtype == "bfloat16"):
            evaluate_pass(model, [item[0]], scoring, check.device)

    items = fed if len(fed) > 1 else fed * 2  # the first batch warms up
    seconds = steady_seconds(check.device, scored, items, 1)
    timed = items[1:]
    tokens = sum(t for _, t in timed) / len(timed)
    flops = counted_flops(scored, timed) / len(timed)
    return check.measured(name, seconds, f"batch of {check.eval_batch}", tokens, flops,
                          note=f"timed batches: {len(timed)}")


def generation(check: Check, name: str, temperature: float, run: str = "run-full") -> Row:
    """Generate's decode (``decode.decode_ids`` with the key/value cache) of every prompt under every latent value,
    sampled at ``temperature``; tokens/s counts the token ids it generated (up to each row's end token)."""
    from tokweight.training.decoding.decode import decode_ids, latent_values, picker, prompt_maker

    tcfg, model, vocab, meta = trained_run(check, run)
    if model.latent.kind != "discrete":
        raise RuntimeError(f"{run} has a continuous latent; the generate stage decodes a discrete run's K values")
    make = prompt_maker(vocab, model.conditioning.slots)
    prompts = [make(x) for x in check.prompts]
    z, slot_ids = latent_values(model, None)

    def decode(chunk):
        return decode_ids(model, chunk, z, slot_ids, vocab.end_id, check.max_new_tokens, picker(temperature, 0))

    decoded = []
    decode(prompts[: max(1, len(prompts) // 8)])  # warm-up
    seconds = window_seconds(check.device, lambda chunk: decoded.append(decode(chunk)), [prompts])
    tokens = sum(len(row) for row in decoded[0])
    flops = counted_flops(decode, [prompts])  # the same draws: the picker's seed
    return check.measured(name, seconds, f"decode of {len(prompts)} x {len(z)}",
                          tokens, flops, note=f"{tokens} token ids, at most {check.max_new_tokens} per row")


# ---------------------------------------------------------------- the planner


def planner(check: Check, name: str) -> Row:
    """The planner's predicted training peak for the full fine-tune's configuration against that stage's measured
    ``torch.cuda.max_memory_allocated``. This is the one place the check calls the planner
    (``tokweight.training.plan.estimate``: ``plan(PlanConfig(...), search=False).train.peak``, bytes)."""
    try:
        from tokweight.training.plan import estimate as plan
        from tokweight.training.config import plan as plan_config
    except ImportError:
        return Row(name, status="skipped: planner not available (tokweight.training.plan.estimate)")
    if check.kept.get("full_peak") is None:
        return Row(name, status="skipped: no measured peak (the full fine-tune stage failed, or not on a GPU)")
    from tokweight.training.config.components import CVAEConfig

    measured, seq_len = check.kept["full_peak"], check.kept["full_tokens"]
    cfg = plan_config.PlanConfig(model=str(check.model), k=check.k, batch_size=check.batch, seq_len=seq_len,
                                 dtype=check.dtype, cvae=CVAEConfig(k=check.k))
    predicted = plan.plan(cfg, search=False).train.peak / 2 ** 30
    ratio = predicted / measured
    return Row(name, peak_gib=measured, status="ok" if abs(ratio - 1) <= 0.1 else "off target",
               note=f"planned {predicted:.2f} GiB at sequence length {seq_len}, {ratio:.2f} of measured "
                    "(target within 10%)")


# ---------------------------------------------------------------- one rank of the 2-rank stage


def ddp_rank(args: argparse.Namespace) -> None:
    """Under torchrun: the full fine-tune's steps on this rank's GPU, DistributedDataParallel over NCCL (gloo on
    the CPU), as `tokweight train` runs them; rank 0 prints its row, per-rank batch ``--batch``."""
    from tokweight.pipeline.ranks import Ranks
    from tokweight.training.loop.setup import setup

    backend = "nccl" if args.device.startswith("cuda") else "gloo"
    ranks = Ranks(timeout_s=300.0, backend=backend)
    device = ranks.device(args.device)
    check = Check(out=Path(args.out), model=Path(args.model), data=Path(args.data), store=Path(args.store),
                  device=device, dtype=args.dtype, batch=args.batch, k=args.k, warmup=args.warmup, steps=args.steps,
                  peak=peak_tflops(device, args.peak_tflops), eval_batch=1, max_new_tokens=1, prompts=[])
    cfg = train_config(check, out="run-ddp")
    try:
        state = setup(cfg, ranks, announce=False)
        row = timed_steps(check, state, cfg, f"full, {ranks.world} ranks (DDP, {backend})", args.warmup,
                          args.steps, "per rank; tokens/s and TFLOP/s per rank")
        if ranks.is_main:
            print("GPU_CHECK_ROW " + json.dumps(asdict(row)), flush=True)
    finally:
        ranks.close()


def main() -> None:
    ap = argparse.ArgumentParser(description="One rank of scripts/gpu_check.py's 2-rank stage (run by that script "
                                             "under torchrun); run scripts/gpu_check.py itself.")
    for name in ("--out", "--model", "--data", "--store"):
        ap.add_argument(name, required=True)
    ap.add_argument("--device", default="cuda", help="cuda: each rank's GPU, over NCCL; cpu: gloo")
    ap.add_argument("--dtype", default="bfloat16")
    for name in ("--batch", "--k", "--warmup", "--steps"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ddp_rank(ap.parse_args())


if __name__ == "__main__":
    main()
