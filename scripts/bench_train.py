"""Training speed, side by side in one run (K = 4): a benchmark, not a test.

1. step time, precomputed vs frozen (same batches, alternating rounds, medians);
   docs/contract.md §6 target: precomputed / frozen <= (3K+3)/(3K+4) + 0.02;
2. memory of each policy: parameters held (model + frozen copy), and the peak of live CPU
   allocations within one step from torch.profiler (profile_memory=True); process RSS is
   no use here: about 0.5 GB of runtime hides a model of under 1 MiB;
3. join overhead per step: reading the train stream with the store join minus without,
   per batch (medians of alternating rounds, load average beside), as a share of a precomputed step;
4. one batched forward over K copies vs K forwards of B rows (forward + backward);
5. the shared x prefix vs K + 1 full passes (``CVAE.share_prefix``), K = 2, 4, 8: step time
   (alternating steps, medians) and peak memory of one step of each. Target at K = 4:
   shared <= 0.75x full, the gain growing with K;
6. (the output head on S against full logits: scripts/bench_head.py);
7. the query pathway's step (its K + 1 passes whole) against the prefix's (x's prefix shared), K = 4;
8. a step without waste: a non-logging step of the default recipe at K = 4 against the sum of its passes' bare
   forward-backward (the backbone and the head on S of the z-free pass, the K copies and the prior's prefix, each
   run and backpropagated alone; target <= 1.15), the padding share of the tokens those passes compute (target
   <= 5%): the batches whole, length-bucketed, and the same batches in length groups (``io.length_groups`` as on a
   GPU), with the grouped step's time against the whole batch's on this CPU; the z-free pass and the copies as one
   forward (``io.merge_passes`` as on a GPU) against the two, same batches; and the host syncs of a non-logging
   step (``tests/support/sync_guard.py``; target 0).

    python scripts/bench_train.py [--work DIR] [--steps N] [--only-pathways | --only-lean]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from functools import partial
from itertools import islice
from pathlib import Path

import torch

from tokweight.training.config.train import GPU_LENGTH_GROUPS

K = 4


def prepare(work: Path) -> tuple[Path, Path, Path]:
    from tokweight.pipeline.extract.config import ExtractConfig
    from tokweight.pipeline.extract.extract import run as extract
    from tokweight.config_files import preset_config
    from tokweight.pipeline.data.config import SynthConfig
    from tokweight.pipeline.data.synth import write_dataset
    from tokweight.training.config.base import BaseTrainConfig
    from tokweight.training.loop.train_base import run as train_base

    data, ckpt, store = work / "data", work / "base", work / "store"
    if not (data / "dataset.json").exists():
        write_dataset(preset_config(SynthConfig, "synth", "default", n_train=2000, n_val=200, n_test=200,
                                    shard_size=500), data)
    if not (ckpt / "fingerprint.json").exists():
        train_base(BaseTrainConfig(data=str(data), out=str(ckpt), steps=100, eval_every=100))
    extract(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(store), progress=False))
    return data, ckpt, store


def make_state(data, ckpt, store, work, policy, batch_size, k=K, cond="prefix"):
    """(the run's state, its config) after setup; through the prefix unless ``cond`` says otherwise (cases 1-5
    measure what sharing x's prefix and the store save, which the prefix pathway allows; None: the default)."""
    from tokweight.pipeline.ranks import Ranks
    from tokweight.training.config.components import CVAEConfig
    from tokweight.training.loop.setup import setup
    from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

    cfg = TrainConfig(io=IOConfig(checkpoint=str(ckpt), data=str(data), store=str(store),
                                  out=str(work / f"run-{policy}-{cond or 'default'}"), num_workers=0),
                      cvae=CVAEConfig(k=k, cond=cond), loss=LossConfig(policy=policy),
                      optim=OptimConfig(batch_size=batch_size, steps=10**6), log=LogConfig(grad_diag_every=0))
    return setup(cfg, Ranks()), cfg


def batches(state, n):
    from tokweight.training.loop.stream import TrainStream

    return list(islice(TrainStream(state.spec, 0, 1).batches(0), n))


def step_time(run, batch) -> float:
    """Seconds of one training step of ``run`` (state, config) on ``batch``."""
    from tokweight.training.loop.step import train_step

    state, cfg = run
    t = time.perf_counter()
    train_step(state, batch, cfg, logged=False)
    return time.perf_counter() - t


def bench_steps(data, ckpt, store, work, steps, batch_size) -> dict:
    runs = {p: make_state(data, ckpt, store, work, p, batch_size) for p in ("precomputed", "frozen")}
    fed = batches(runs["precomputed"][0], steps)  # joined batches; frozen ignores their b
    for p in runs:  # warm-up
        step_time(runs[p], fed[0])
    times = {p: [] for p in runs}
    for batch in fed:  # alternate, so drifts of a noisy machine hit both alike
        for p in runs:
            times[p].append(step_time(runs[p], batch))
    med = {p: statistics.median(v) for p, v in times.items()}
    return {"step_s": med, "ratio": med["precomputed"] / med["frozen"], "target": (3 * K + 3) / (3 * K + 4) + 0.02,
            "memory": bench_memory(runs, fed[1])}


def held_mib(state) -> float:
    """Parameters and buffers a policy keeps: the CVAE, plus the frozen copy under 'frozen'."""
    modules = [state.model] + ([state.baseline.model] if hasattr(state.baseline, "model") else [])
    return sum(t.numel() * t.element_size() for m in modules for t in [*m.parameters(), *m.buffers()]) / 2**20


def step_peak_mib(run, batch) -> float:
    """Peak of live CPU allocations during one step: torch.profiler(profile_memory=True), each
    op's self allocations (frees negative) summed in start order; relative to the step's start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step_time(run, batch)
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak / 2**20


def bench_memory(runs: dict, batch) -> dict:
    return {p: {"held_mib": held_mib(run[0]), "step_peak_mib": step_peak_mib(run, batch)} for p, run in runs.items()}


JOIN_BATCHES = 100
"""Batches read per join round: about 1.6 passes over the 2000-example train split, so that the
shuffle buffer's read-ahead (256 examples and a shard) is a small part of what is timed."""


def read_s_per_batch(spec, n) -> float:
    """Seconds per batch of a fresh train stream (its store view opened, parts read and parsed anew)."""
    from tokweight.training.loop.stream import TrainStream

    t = time.perf_counter()
    for _ in islice(TrainStream(spec, 0, 1).batches(0), n):
        pass
    return (time.perf_counter() - t) / n


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())  # 1, 5, 15 min


def bench_join(state, rounds=5) -> dict:
    """The train stream read with the store join and without, in alternating rounds (medians), per batch;
    the load average (1, 5, 15 min) is taken before and after the rounds."""
    specs = {"with_join": state.spec, "without": replace(state.spec, store=None)}
    load_before = load_average()
    times = {name: [] for name in specs}
    for _ in range(rounds):
        for name, spec in specs.items():
            times[name].append(read_s_per_batch(spec, JOIN_BATCHES))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {"read_s_per_batch_with_join": med["with_join"], "read_s_per_batch_without": med["without"],
            "join_s_per_batch": med["with_join"] - med["without"], "batches": JOIN_BATCHES, "rounds": rounds,
            "load_before": load_before, "load_after": load_average()}


def bench_copies(state, batch, reps=20) -> dict:
    model = state.model
    B = len(batch)
    ids = batch.zcond.input_ids.repeat_interleave(K, 0).scatter(
        1, batch.slot_pos.repeat_interleave(K, 0), model.latent.latent_ids.repeat(B)[:, None])

    def batched():
        model.backbone(ids)[0].float().logsumexp(-1).sum().backward()

    def separate():
        for k in range(K):
            one = batch.zcond.input_ids.scatter(1, batch.slot_pos, int(model.latent.latent_ids[k]))
            model.backbone(one)[0].float().logsumexp(-1).sum().backward()

    fns = {"one_batched_forward_s": batched, "k_forwards_s": separate}
    times = {name: [] for name in fns}
    for rep in range(reps + 1):  # alternating rounds; round 0 warms up
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            if rep:
                times[name].append(time.perf_counter() - t)
    out = {name: statistics.median(ts) for name, ts in times.items()}
    out["k_forwards_over_batched"] = out["k_forwards_s"] / out["one_batched_forward_s"]
    return out


SHARED_PREFIX_KS = (2, 4, 8)
PATHWAYS = ("query", "prefix")


def alternating_medians(steps_of: dict, n: int) -> dict:
    """{name: median seconds} of ``steps_of[name](i)`` for i = 1..n, the names taken in turn at each i (so drifts
    of a noisy machine hit them alike), after each has run i = 0 to warm up."""
    times = {name: [] for name in steps_of}
    for i in range(n + 1):
        for name, take in steps_of.items():
            took = take(i)
            if i:
                times[name].append(took)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_shared_prefix(data, ckpt, store, work, steps, batch_size) -> dict:
    """{K: step seconds and one step's peak MiB, shared prefix and full passes}: one model per K, the
    same batches, each step taken both ways in turn (the model moves on by both steps alike)."""
    out = {}
    for k in SHARED_PREFIX_KS:
        run = make_state(data, ckpt, store, work, "precomputed", batch_size, k)
        fed = batches(run[0], steps + 1)
        def step(share: bool, i: int) -> float:
            run[0].model.share_prefix = share
            return step_time(run, fed[i])

        med = alternating_medians({share: partial(step, share) for share in (True, False)}, steps)
        peaks = {}
        for share in med:
            run[0].model.share_prefix = share
            peaks[share] = step_peak_mib(run, fed[0])
        out[k] = {"shared_s": med[True], "full_s": med[False], "ratio": med[True] / med[False],
                  "shared_peak_mib": peaks[True], "full_peak_mib": peaks[False]}
    return out


def bench_pathways(data, ckpt, store, work, steps, batch_size) -> dict:
    """Step seconds at K = 4 through the query pathway (its K + 1 passes whole: z offsets x's queries too) and
    through the prefix (x's prefix shared), each on its own batches of the same examples, steps alternating."""
    runs = {cond: make_state(data, ckpt, store, work, "precomputed", batch_size, K, cond) for cond in PATHWAYS}
    fed = {cond: batches(run[0], steps + 1) for cond, run in runs.items()}
    med = alternating_medians({cond: lambda i, c=cond: step_time(runs[c], fed[c][i]) for cond in runs}, steps)
    return {"step_s": med, "query_over_prefix": med["query"] / med["prefix"],
            "prefix_shares": runs["prefix"][0].model.shares_prefix, "query_shares": runs["query"][0].model.shares_prefix}


def print_pathways(result: dict, steps: int, batch_size: int, load_before: str) -> None:
    print(f"z pathways, K={K} (median of {steps} alternating steps, batch {batch_size}): query "
          f"{result['step_s']['query'] * 1e3:.1f} ms vs prefix {result['step_s']['prefix'] * 1e3:.1f} ms = "
          f"{result['query_over_prefix']:.3f} (x's prefix shared: prefix {result['prefix_shares']}, query "
          f"{result['query_shares']}; load average {load_before} before, {load_average()} after)")


def print_shared_prefix(result: dict, steps: int, batch_size: int, load_before: str) -> None:
    for k, r in result.items():
        print(f"shared x prefix, K={k} (median of {steps} alternating steps, batch {batch_size}): "
              f"{r['shared_s'] * 1e3:.1f} ms vs full passes {r['full_s'] * 1e3:.1f} ms = {r['ratio']:.3f}; "
              f"step peak {r['shared_peak_mib']:.1f} vs {r['full_peak_mib']:.1f} MiB")
    print(f"  (target at K=4: <= 0.75, the gain growing with K; load average {load_before} before, "
          f"{load_average()} after)")


def bare_passes(model, batch):
    """One callable running the step's passes alone, each forward then its own backward: the z-free pass (its
    states, the head on S without gradients, a backward from the states the posterior reads), the K copies (their
    states and the head on S, backpropagated) and, where z reaches the prefix, the prior's prefix (its states at
    <z>, the K latent tokens' logits, backpropagated): the work a step cannot do without."""
    from tokweight.pipeline.models.head import nll_over_s

    bb, free, cond, widths = model.backbone, batch.zfree, batch.zcond, batch.widths
    B, C = len(batch), model.latent.copies
    rows = torch.arange(B)
    z, slot_ids = model.latent.decoder_inputs(torch.zeros(B, C))
    rep = lambda t: t.repeat_interleave(C, 0)

    def run():
        hidden = bb.hidden(free.input_ids)
        with torch.no_grad():
            nll_over_s(bb, hidden, free.logit_pos, free.targets, free.mask, count=free.s_tokens)
        hidden[rows, batch.last_pos].sum().backward()
        ids, kwargs = model.conditioning.decoder_inputs(bb, rep(cond.input_ids), rep(batch.slot_pos), z, slot_ids)
        hidden = bb.hidden(ids, **kwargs)
        nll_over_s(bb, hidden, rep(cond.logit_pos), rep(cond.targets), rep(cond.mask), count=C * cond.s_tokens
                   ).sum().backward()
        if model.conditioning.modulates_prefix:
            hidden = bb.hidden(cond.input_ids[:, : widths.prefix + 1])
            bb.head(hidden[rows, batch.z_pos], model.latent.prior_tokens).sum().backward()
        model.zero_grad(set_to_none=True)

    return run


def padding_share(batch, copies: int, shares_prefix: bool, modulates_prefix: bool, merged: bool = False
                  ) -> tuple[int, int]:
    """(tokens the step's passes compute, of which padding): the z-free pass and the copies over their widths
    (past the shared prefix when it is shared, which then runs once; ``merged``, in one forward: the z-free rows
    over the copies' width too), and the prior's prefix where z reaches it; a batch in length groups, summed over
    its groups (each padded to its own longest)."""
    if batch.groups is not None:
        counts = [padding_share(part, copies, shares_prefix, modulates_prefix, merged) for part in batch.groups.parts]
        return sum(c for c, _ in counts), sum(p for _, p in counts)
    z_pos = batch.z_pos.tolist()
    free = (batch.last_pos + 1).tolist()
    cond = (batch.zcond.input_ids != 0).sum(1).tolist()  # <pad> is 0, no token of a sequence
    B, w = len(batch), batch.widths
    if shares_prefix:
        free_width = max(w.free_suffix, w.cond_suffix) if merged else w.free_suffix
        computed = B * w.prefix + B * free_width + copies * B * w.cond_suffix
        real = sum(z_pos) + sum(f - z for f, z in zip(free, z_pos)) + copies * sum(c - z for c, z in zip(cond, z_pos))
    else:
        widths = batch.zfree.input_ids.shape[1], batch.zcond.input_ids.shape[1]
        computed = B * (max(widths) if merged else widths[0]) + copies * B * widths[1]
        real = sum(free) + copies * sum(cond)
    if modulates_prefix:
        computed += B * (w.prefix + 1)
        real += sum(z + 1 for z in z_pos)
    return computed, computed - real


LENGTH_BUCKETS = 16
"""``IOConfig.length_buckets`` for case 8's bucketed padding share: batches drawn and bucketed at a time."""


def bench_lean_step(data, ckpt, store, work, steps, batch_size) -> dict:
    """Case 8: the default recipe's non-logging step at K = 4 against the sum of its passes' bare
    forward-backward (alternating, medians), the padding share over the timed batches, and the host syncs of one
    guarded step."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.sync_guard import HostSyncs
    from tokweight.training.loop.step import train_step
    from tokweight.training.loop.stream import TrainStream

    run = make_state(data, ckpt, store, work, "precomputed", batch_size, K, cond=None)
    state, cfg = run
    fed = batches(state, steps + 1)
    bare = [bare_passes(state.model, batch) for batch in fed]

    def bare_time(i: int) -> float:
        t = time.perf_counter()
        bare[i]()
        return time.perf_counter() - t

    med = alternating_medians({"step": lambda i: step_time(run, fed[i]), "bare": bare_time}, steps)
    model = state.model
    counts = [padding_share(b, model.latent.copies, model.shares_prefix, model.conditioning.modulates_prefix)
              for b in fed]
    bucketed = list(islice(TrainStream(replace(state.spec, length_buckets=LENGTH_BUCKETS), 0, 1).batches(0),
                           steps + 1))
    counts_bucketed = [padding_share(b, model.latent.copies, model.shares_prefix, model.conditioning.modulates_prefix)
                       for b in bucketed]
    grouped = list(islice(TrainStream(replace(state.spec, length_groups=GPU_LENGTH_GROUPS), 0, 1).batches(0),
                          steps + 1))  # the same batches as ``fed``, each in length groups
    assert [b.keys for b in grouped] == [b.keys for b in fed]
    counts_grouped = [padding_share(b, model.latent.copies, model.shares_prefix, model.conditioning.modulates_prefix)
                      for b in grouped]
    med_grouped = alternating_medians({"whole": lambda i: step_time(run, fed[i]),
                                       "grouped": lambda i: step_time(run, grouped[i])}, steps)
    counts_merged, counts_gpu = ([padding_share(b, model.latent.copies, model.shares_prefix,
                                                model.conditioning.modulates_prefix, merged=True) for b in batches]
                                 for batches in (fed, grouped))

    def merged_time(i: int) -> float:
        model.merge_passes = True
        try:
            return step_time(run, fed[i])
        finally:
            model.merge_passes = False

    med_merged = alternating_medians({"separate": lambda i: step_time(run, fed[i]), "merged": merged_time}, steps)
    with HostSyncs() as syncs:
        train_step(state, fed[0], cfg, logged=False)
    with HostSyncs() as syncs_grouped:
        train_step(state, grouped[0], cfg, logged=False)
    model.merge_passes = True
    with HostSyncs() as syncs_merged:
        train_step(state, grouped[0], cfg, logged=False)
    model.merge_passes = False
    share = lambda counts: sum(p for _, p in counts) / sum(c for c, _ in counts)
    return {"step_s": med["step"], "bare_s": med["bare"], "ratio": med["step"] / med["bare"],
            "cond": model.conditioning.mode, "shares_prefix": model.shares_prefix,
            "padding_share": share(counts), "padding_share_bucketed": share(counts_bucketed),
            "padding_share_grouped": share(counts_grouped),
            "grouped_over_whole": med_grouped["grouped"] / med_grouped["whole"],
            "padding_share_merged": share(counts_merged), "padding_share_merged_grouped": share(counts_gpu),
            "merged_over_separate": med_merged["merged"] / med_merged["separate"],
            "host_syncs": len(syncs.found), "host_syncs_grouped": len(syncs_grouped.found),
            "host_syncs_merged_grouped": len(syncs_merged.found)}


def print_lean_step(result: dict, steps: int, batch_size: int, load_before: str) -> None:
    print(f"step without waste, default recipe ({result['cond']} pathway, x's prefix shared: "
          f"{result['shares_prefix']}), K={K}, batch {batch_size}, median of {steps} alternating: non-logging step "
          f"{result['step_s'] * 1e3:.1f} ms vs its passes' bare forward-backward {result['bare_s'] * 1e3:.1f} ms = "
          f"{result['ratio']:.3f} (target <= 1.15); padding {result['padding_share']:.2%} of the tokens computed, "
          f"{result['padding_share_bucketed']:.2%} with length_buckets={LENGTH_BUCKETS}, "
          f"{result['padding_share_grouped']:.2%} with length_groups={GPU_LENGTH_GROUPS} (the same batches; target <= "
          f"5%); the grouped step / the whole batch's step {result['grouped_over_whole']:.3f} (medians of {steps} "
          f"alternating, this CPU); the z-free pass and the copies in one forward / in two "
          f"{result['merged_over_separate']:.3f} (the same batches, medians of {steps} alternating, this CPU; padding "
          f"{result['padding_share_merged']:.2%}, in length groups {result['padding_share_merged_grouped']:.2%}: a "
          f"GPU's defaults); host syncs in a non-logging step: {result['host_syncs']}, grouped "
          f"{result['host_syncs_grouped']}, grouped in one forward {result['host_syncs_merged_grouped']} (target 0); "
          f"load average {load_before} before, {load_average()} after")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=None)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--only-pathways", action="store_true", help="only case 7 (the query pathway's step vs the prefix's)")
    ap.add_argument("--only-lean", action="store_true", help="only case 8 (a step without waste)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_train_"))
    data, ckpt, store = prepare(work)
    for only, name, bench, show in ((args.only_lean, "lean_step", bench_lean_step, print_lean_step),
                                    (args.only_pathways, "pathways", bench_pathways, print_pathways)):
        if only:
            load_before = load_average()
            measured = bench(data, ckpt, store, work, args.steps, args.batch_size)
            show(measured, args.steps, args.batch_size, load_before)
            print(json.dumps({name: measured}, default=float))
            return
    steps = bench_steps(data, ckpt, store, work, args.steps, args.batch_size)
    print(f"step time (median of {args.steps}, batch {args.batch_size}, K={K}): precomputed "
          f"{steps['step_s']['precomputed'] * 1e3:.1f} ms, frozen {steps['step_s']['frozen'] * 1e3:.1f} ms, "
          f"ratio {steps['ratio']:.3f} (target <= {steps['target']:.4f})")
    mem = steps.pop("memory")
    print("memory (torch.profiler, one step): " + ", ".join(
        f"{p} step peak {m['step_peak_mib']:.2f} MiB + held {m['held_mib']:.2f} MiB" for p, m in mem.items()))
    state, _ = make_state(data, ckpt, store, work, "precomputed", args.batch_size)
    join = bench_join(state)
    share = join["join_s_per_batch"] / steps["step_s"]["precomputed"]
    print(f"join overhead: {join['join_s_per_batch'] * 1e3:.2f} ms per batch "
          f"(read {join['read_s_per_batch_with_join'] * 1e3:.2f} ms with join, "
          f"{join['read_s_per_batch_without'] * 1e3:.2f} ms without; medians of {join['rounds']} alternating "
          f"rounds of {join['batches']} batches) = {share:.2%} of a precomputed step (target < 1%); load average "
          f"(1, 5, 15 min) before {join['load_before']}, after {join['load_after']}")
    copies = bench_copies(state, batches(state, 1)[0])
    print(f"K={K} copies, forward+backward: one batched {copies['one_batched_forward_s'] * 1e3:.1f} ms, "
          f"K separate {copies['k_forwards_s'] * 1e3:.1f} ms, ratio {copies['k_forwards_over_batched']:.2f}x")
    load_before = load_average()
    shared = bench_shared_prefix(data, ckpt, store, work, args.steps, args.batch_size)
    print_shared_prefix(shared, args.steps, args.batch_size, load_before)
    load_before = load_average()
    pathways = bench_pathways(data, ckpt, store, work, args.steps, args.batch_size)
    print_pathways(pathways, args.steps, args.batch_size, load_before)
    load_before = load_average()
    lean = bench_lean_step(data, ckpt, store, work, args.steps, args.batch_size)
    print_lean_step(lean, args.steps, args.batch_size, load_before)
    print(json.dumps({"steps": steps, "memory": mem, "join": join, "copies": copies, "shared_prefix": shared,
                      "pathways": pathways, "lean_step": lean}, default=float))


if __name__ == "__main__":
    main()
