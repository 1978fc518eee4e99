"""What attaches around ``step.train_step``: each a small callable ``(state, record) -> None`` run after every
step, in order (``train.fit``): the fault hooks, the metrics line, the periodic validation with the stop rule, the
checkpoint.

Rank 0 writes; validation and the checkpoint's RNG gather are collectives every rank takes part in.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from tokweight.training.loop.convergence import converged, observe, val_mi, val_objective
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.loop.engine import checkpoint_state
from tokweight.training.loop.faults import Hooks
from tokweight.training.loop.precision import autocast
from tokweight.training.loop.run_dir import append_metrics, metrics_size, save_checkpoint
from tokweight.training.loop.state import State, rng_states
from tokweight.training.loop.trackers import NO_TRACKERS, Trackers
from tokweight.training.evaluation.validation import Scoring, validate


class Faults:
    """The test's fault hooks (``faults.Hooks``): a kill between two steps."""

    def __init__(self, hooks: Hooks):
        self.hooks = hooks

    def __call__(self, state: State, record: dict | None) -> None:
        self.hooks.after_step(state.progress.step)


class MetricsLine:
    """The step's record (made on logged steps only) as a metrics.jsonl line and to the run's trackers (``prefix``
    before each series: a start's), and the progress bar."""

    def __init__(self, cfg, state: State, trackers: Trackers = NO_TRACKERS, prefix: str = ""):
        self.out, self.main = cfg.io.out, state.global_batch.rank == 0
        self.trackers, self.prefix = trackers, prefix
        self.bar = tqdm(total=cfg.optim.steps, initial=state.progress.step, desc="train", unit="step",
                        disable=not self.main, mininterval=1.0)

    def __call__(self, state: State, record: dict | None) -> None:
        self.bar.update(1)
        if self.main and record is not None:
            append_metrics(self.out, record)
            self.trackers.log_record(record, self.prefix)
            self.bar.set_postfix(loss=f"{record['loss']:.3f}", kl=f"{record['kl']:.3f}")

    def close(self) -> None:
        self.bar.close()


class PeriodicValidation:
    """Every ``eval_every`` steps a validation on the first ``eval_examples`` val examples, which the stop rule
    (``components.StopRule``, ``convergence.py``) reads from the step the objective settles until the learning rate
    starts to fall; then whether the run stops (``Progress.stop``)."""

    def __init__(self, cfg, trackers: Trackers = NO_TRACKERS, prefix: str = ""):
        self.cfg, self.trackers, self.prefix = cfg, trackers, prefix

    def __call__(self, state: State, record: dict | None) -> None:
        cfg, progress = self.cfg, state.progress
        step, every = progress.step, cfg.log.eval_every
        if every and step % every == 0 and step < cfg.optim.steps:
            metrics = validate_run(state, cfg, examples=cfg.log.eval_examples, trackers=self.trackers,
                                   prefix=self.prefix)
            if state.schedule.settled_from <= step < progress.decay_window(cfg.optim.steps, cfg.optim.lr_decay)[0]:
                # rank 0's reading on every rank: the ranks stop together even if their float sums differed
                progress.convergence = state.ranks.broadcast(observe(progress.convergence, cfg.optim.stop, step,
                                                                     val_objective(metrics, cfg.loss.beta),
                                                                     val_mi(metrics)))
                if converged(progress.convergence, cfg.optim.stop):
                    progress.converged_at = step
        progress.stop = progress.stop_reason(cfg.optim.steps, cfg.optim.lr_decay)


class Checkpoint:
    """RUN/checkpoint/ every ``ckpt_every`` steps, at the run's stop and at ``until`` (a start's end)."""

    def __init__(self, cfg, hooks: Hooks, until: int | None = None):
        self.cfg, self.hooks, self.until = cfg, hooks, until

    def __call__(self, state: State, record: dict | None) -> None:
        step = state.progress.step
        if step % self.cfg.log.ckpt_every == 0 or state.progress.stop or step == self.until:
            checkpoint(state, self.cfg, self.hooks)


def checkpoint(state: State, cfg, hooks: Hooks) -> None:
    """RUN/checkpoint/ at the run's step: what a resumed run needs to go on as if never stopped. Rank 0 writes it;
    every rank waits here until it is written, so no rank waits out the write inside the next step's collective."""
    main = state.global_batch.rank == 0
    rngs = state.ranks.gather(rng_states(state.device))  # a collective: every rank takes part
    if state.sharded or main:  # under FSDP a collective too
        tensors, opt_state = checkpoint_state(state.model, state.opt, state.sharded)
    if main:
        progress = state.progress
        meta = {"step": progress.step, **state.meta, "world": state.global_batch.world,
                "convergence": progress.convergence.to_json(), "converged_at": progress.converged_at,
                "metrics_bytes": metrics_size(cfg.io.out)}
        if state.clusters is not None:
            meta["clusters"] = state.clusters.to_json()
        if state.agreement is not None:
            meta["agreement"] = state.agreement.to_json()
        if state.label_values is not None:
            meta["label_values"] = state.label_values.to_json()
        rng = {f"{name}.{rank}": t for rank, states in enumerate(rngs) for name, t in states.items()}
        save_checkpoint(cfg.io.out, tensors, opt_state, state.spec.vocab, meta, rng, hooks.before_write)
        hooks.after_checkpoint(progress.step)
    state.ranks.barrier()


def validate_run(state: State, cfg, examples: int | None = None, trackers: Trackers = NO_TRACKERS,
                 prefix: str = "") -> dict:
    """``validation.validate`` on the val split, scored as the run trains; rank 0 logs it (to metrics.jsonl and
    ``trackers``)."""
    scoring = Scoring(state.baseline, cfg.loss, state.params, cfg.cvae, cfg.optim.seed,
                      state.schedule.at(state.progress.step - 1))  # q as the last step read it
    spec = replace(state.spec, urls=split_urls(cfg.io.data, "val"), batch_size=cfg.log.eval_batch_size)
    ranks = state.global_batch
    with autocast(cfg.io.dtype, state.device):  # in the forward's dtype, as the run trains
        metrics = validate(state.model, scoring, spec, split="val", step=state.progress.step, world=ranks.world,
                           device=state.device, log=Path(cfg.io.out) if ranks.rank == 0 else None,
                           examples=examples, sharded=state.sharded)
    state.progress.skips.merge(metrics.get("skipped_shards", {}))
    if ranks.rank == 0:
        trackers.log_record(metrics, prefix)
    return metrics
