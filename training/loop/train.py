"""Stage two: train a CVAE from the entangled checkpoint with a weighted reconstruction.

setup (``setup.py``) -> fit -> validate. ``run(cfg)`` is the whole job (``config.train.TrainConfig``, one group per
component); the CLI only builds the config. ``fit`` is a loop of ``step.train_step`` with the callbacks of
``callbacks.py`` after each step (metrics line, validation and the stop rule, checkpoint). With several starts,
``run`` is an outer loop: each start trained and validated (``starts.compare_starts``), then the best continued.
Outputs in RUN/ (``run_dir.py``): config.json (the resolved TrainConfig), metrics.jsonl (one line per logged
step and per validation, then the final validation and the stop line), checkpoint/ (safetensors model,
optimizer and RNG states, state.json, vocab.json; replaced atomically), and resume from it; with several
starts also starts/seed-S/ (each start's run directory) and starts.json (the choice).

``--steps`` is a cap: once its periodic validations say the run converged (``convergence.py``) it ends
earlier, after the learning rate's fall to 0 that ends every run (``schedules.lr_decay_window``), and it
says why it stopped (``"stop"`` in its result and metrics.jsonl's last line). A resumed run ends bitwise
where the uninterrupted run ends (CPU, same threads): the checkpoint holds the model, the optimizer, every
rank's RNG, the stop rule's state and the step it said the run converged; the data
stream is fast-forwarded to the checkpoint's step (``stream.TrainStream.batches``); the
schedules, the E-step and the continuous latent's noise are functions of the step.

Data parallel (torchrun; gloo on CPU, NCCL on GPUs): the global batch of N * B examples is drawn from
``lanes`` sample streams, each rank reading only its own lanes' shards (``stream.TrainStream``); torch's
DistributedDataParallel averages the gradients in buckets overlapped with the backward, or FSDP2 shards the model
per transformer block (``IOConfig.shard``, ``engine.py``), and the terms that couple a batch's examples are
computed over the global batch (``global_batch.py``), so N ranks with batch B step like one process with batch
N * B and the same lanes. Rank 0 writes everything.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from tokweight.pipeline.data.errors import Skips
from tokweight.pipeline.ranks import Ranks, resolve_device
from tokweight.training.loop.callbacks import (Checkpoint, Faults, MetricsLine, PeriodicValidation, checkpoint,
                                               validate_run)
from tokweight.training.loop.faults import NO_HOOKS, Hooks
from tokweight.training.loop.run_dir import append_metrics, committed_checkpoint, read_metrics, write_config
from tokweight.training.loop.starts import compare_starts, continued, read_starts, seeded, start_dir
from tokweight.training.loop.state import Progress, State
from tokweight.training.loop.step import train_step
from tokweight.training.loop.stream import TrainStream
from tokweight.training.loop.trackers import NO_TRACKERS, Trackers, open_trackers, require
from tokweight.training.loop.setup import setup
from tokweight.training.config.train import TrainConfig

# ---------------------------------------------------------------- fit


def logged_step(progress: Progress, cfg: TrainConfig) -> bool:
    """Whether the step ``progress.step`` (0-based) writes a metrics line: every log_every-th, the run's last,
    and the posterior-gradient diagnostic's steps."""
    step, every = progress.step, cfg.log.grad_diag_every
    return ((step + 1) % cfg.log.log_every == 0
            or step + 1 == progress.decay_window(cfg.optim.steps, cfg.optim.lr_decay)[1]
            or bool(every and step % every == 0))


def fit(state: State, cfg: TrainConfig, hooks: Hooks = NO_HOOKS, until: int | None = None,
        trackers: Trackers = NO_TRACKERS, prefix: str = "") -> int:
    """Train from the state's step until the stop rule or the step cap says stop, or to step ``until``; the
    bytes of shards and store parts this rank's training stream read. The callbacks run after every step; the
    metrics lines and validations go to ``trackers`` too (``prefix`` before each series: a start's)."""
    progress, ranks = state.progress, state.global_batch
    progress.stop = progress.stop_reason(cfg.optim.steps, cfg.optim.lr_decay)
    if progress.stop:
        return 0
    stream = TrainStream(state.spec, ranks.rank, ranks.world)
    batches = stream.batches(cfg.io.num_workers, start=progress.step)
    log = MetricsLine(cfg, state, trackers, prefix)
    callbacks = (Faults(hooks), log, PeriodicValidation(cfg, trackers, prefix), Checkpoint(cfg, hooks, until))
    batch = None
    try:
        while not progress.stop and (until is None or progress.step < until):
            batch = next(batches).to(state.device)
            record = train_step(state, batch, cfg, logged_step(progress, cfg))
            for callback in callbacks:
                callback(state, record)
    except torch.cuda.OutOfMemoryError as error:  # one line: the batch that fits, as `tokweight plan` finds it
        from tokweight.training.plan.estimate import out_of_memory

        raise out_of_memory(cfg, ranks.world, batch.zfree.input_ids.shape[1] if batch else 0, state.device) from error
    finally:
        log.close()
        progress.skips.merge(stream.skips)
    return stream.bytes_read


def stop_record(state: State, cfg: TrainConfig) -> dict:
    """Why the run stopped, where, its best validation's step (None if none was counted), the rule and the
    steps [start, end) over which the learning rate fell to 0."""
    progress = state.progress
    rule = cfg.optim.stop.describe(cfg.log.eval_every, cfg.log.eval_examples, cfg.loss.beta,
                                   state.schedule.settled_from)
    return {"reason": progress.stop, "step": progress.step, "best_step": progress.convergence.best_step,
            "rule": rule, "lr_decay": list(progress.decay_window(cfg.optim.steps, cfg.optim.lr_decay))}


def train_to_end(state: State, cfg: TrainConfig, hooks: Hooks, trackers: Trackers = NO_TRACKERS) -> dict:
    """``fit`` to the run's stop, then the final validation on the whole val split and the stop line:
    ``run``'s result."""
    ranks = state.ranks
    Path(cfg.io.out).mkdir(parents=True, exist_ok=True)
    if ranks.is_main:
        write_config(cfg)
    t0 = time.perf_counter()
    bytes_read = fit(state, cfg, hooks, trackers=trackers)
    wall = time.perf_counter() - t0
    metrics = validate_run(state, cfg, trackers=trackers)
    stop = stop_record(state, cfg)
    if ranks.is_main:
        append_metrics(cfg.io.out, {"stop": stop})
        trackers.log_record({"stop": stop})
    skips = Skips()
    for shards in ranks.gather(state.progress.skips.shards):  # the ranks read disjoint train shards
        skips.merge(shards)
    return {**metrics, "stop": stop, "train_wall_s": wall, "input_bytes_read": ranks.gather(bytes_read),
            **skips.to_json()}


# ---------------------------------------------------------------- the job


def run(cfg: TrainConfig, hooks: Hooks = NO_HOOKS, trackers: Trackers | None = None) -> dict:
    """The whole job; the result holds the final validation's metrics, ``stop`` (``stop_record``), the
    training wall time, ``input_bytes_read``: each rank's bytes of shards and store parts read by its
    training stream (a resumed run's fast-forward included), and, if any sample was left out, ``skipped``
    and ``skipped_shards``: every rank's train and val streams'. With ``optim.starts`` > 1 and a cap above
    ``optim.start_steps`` the starts are trained and compared first (``starts.py``), the best goes on,
    and ``start`` says which. ``hooks``: faults a test injects. ``trackers``: where rank 0 reports besides
    metrics.jsonl (a start's series under ``start-<seed>/``); None: those ``cfg.log.report_to`` names, opened and
    closed here (``run_trackers``)."""
    cfg.estep.check_harden(cfg.cvae.k)
    backend = "nccl" if resolve_device(cfg.io.device).startswith("cuda") else "gloo"
    ranks = Ranks(timeout_s=cfg.io.collective_timeout_s, backend=backend)
    own, trackers = trackers is None, trackers or NO_TRACKERS
    try:
        if own:
            trackers = run_trackers(cfg, ranks.is_main)
        if not (cfg.optim.starts > 1 and cfg.optim.steps > cfg.optim.start_steps):
            return train_to_end(setup(cfg, ranks), cfg, hooks, trackers)
        chosen_before = "seed" in read_starts(Path(cfg.io.out))  # then no start announces the job
        fitted: dict = {}  # the first fresh start's cluster centres, the same for every start
        made = compare_starts(cfg, ranks, lambda seed, until, announce:
                              train_start(cfg, seed, until, ranks, hooks, announce, fitted, trackers))
        chosen = continued(cfg, made)
        fresh = ranks.broadcast(not (committed_checkpoint(Path(cfg.io.out)) / "state.json").is_file())
        state = setup(chosen, ranks, continue_from=start_dir(cfg, made["seed"]), announce=chosen_before)
        if fresh and state.progress.stop_reason(chosen.optim.steps, chosen.optim.lr_decay):  # the start stopped
            checkpoint(state, chosen, hooks)  # during the rounds and trains no more: its checkpoint is RUN's
        if fresh and ranks.is_main:  # the start's lines RUN/metrics.jsonl goes on from, as the run's own series
            for record in read_metrics(cfg.io.out):
                trackers.log_record(record)
        return train_to_end(state, chosen, hooks, trackers) | {"start": made}
    finally:
        if own:
            trackers.close()
        # a sharded model's reference cycles hold the process group: collected before the group goes, not at the
        # interpreter's exit, where a rank can abort (docs/reference.md, "Scale-out")
        gc.collect()
        ranks.close()


def run_trackers(cfg: TrainConfig, main: bool) -> Trackers:
    """The trackers ``cfg.log.report_to`` names, on rank 0 (``main``), with the resolved configuration as their
    hyperparameters; a resumed run's go on from its checkpoint's step. Every rank checks that their extras are
    installed, so that all of them stop on a missing one."""
    for name in cfg.log.report_to:
        require(name)
    if not (main and cfg.log.report_to):
        return NO_TRACKERS
    saved = committed_checkpoint(Path(cfg.io.out)) / "state.json"
    trackers = open_trackers(cfg.log.report_to, cfg.io.out,
                             json.loads(saved.read_text())["step"] if saved.is_file() else None)
    trackers.log_hparams(cfg.to_json())
    return trackers


def train_start(cfg: TrainConfig, seed: int, until: int, ranks: Ranks, hooks: Hooks, announce: bool, fitted: dict,
                trackers: Trackers = NO_TRACKERS) -> dict:
    """One start: the whole run's config from ``seed``, trained (or resumed) to step ``until`` (its validations and
    stop rule go as in a run from that seed) and checkpointed there; its metrics on the whole val split (the
    reconstruction E_q[R], the KL, the exact MI), from which RUN/starts.json keeps the reconstruction, the
    objective and the exact MI (the start's metrics.jsonl is cut back to its checkpoint when the next round
    resumes it). ``fitted`` carries the cluster centres from one start to the next (``setup``'s)."""
    start = replace(seeded(cfg, seed), io=replace(cfg.io, out=str(start_dir(cfg, seed))))
    state = setup(start, ranks, announce=announce, fitted=fitted.get("clusters"))
    fitted.setdefault("clusters", state.clusters)
    if state.progress.step > until:
        raise ValueError(f"{start.io.out} is at step {state.progress.step}, past the round's {until}: "
                         f"{cfg.io.out}/starts.json has lost its rounds; use a new --out")
    Path(start.io.out).mkdir(parents=True, exist_ok=True)
    if ranks.is_main:
        write_config(start)
    prefix = f"start-{seed}/"
    fit(state, start, hooks, until=until, trackers=trackers, prefix=prefix)
    return validate_run(state, start, trackers=trackers, prefix=prefix)
