"""One CVAE cell: its TrainConfig (through the recipe check), its key, train + evaluate -> record; and the
runner that takes a list of cells through a process pool. The one cell cache of every job.

A cell is reused when runs/<setting>-<key>/cell.json names its key, which hashes the resolved train
config without its paths, the base fingerprint it was trained from, the data's key and the
evaluation; an interrupted cell's run resumes (training.loop.train). The record holds every number any
job reads of the cell, so no job reads the run directory's files besides it. A cell's run directory is
locked while it trains, so two jobs on one root that share a cell train it once: the second waits, then
reuses its record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path

from tokweight.report.tables import fixed
from tokweight.store.durable import write_json_atomic
from tokweight.store.lock import StoreLock
from tokweight.training.config.use import OUTCOMES
from tokweight.experiments.artefacts import LOCK_WAIT_S, Echo, Prepared, key_of, read_json
from tokweight.experiments.recipes import with_recipe
from tokweight.training.config.train import IOConfig, LossConfig, OptimConfig

METRICS = ("mi", "strategy_mi", "kl", "strategy_nmi", "control_accuracy", "recon_uniform", "recon", "active_units")
"""Per-cell numbers: mi (exact, discrete only), strategy_mi (exact I(z; strategy), discrete only), kl,
strategy_nmi, control_accuracy (decode-per-latent), recon_uniform (token-mean NLL under E_q, comparable
across weightings), recon (the cell's own weighted reconstruction), active_units (continuous only).
All on the test split; nats."""
DIAGNOSTICS = ("l_t0_spread_init", "l_t0_spread_end")
"""Per-cell training diagnostics (training batches, nats): the spread over k of l_t at the example's most
surprising token at step 0 and at the last logged step (training.evaluation.metrics.informative_token_spread)."""
CONTROL = ("exact_match", "chance_exact_match", "first_token_match", "chance_first_token_match")
"""Decode-per-latent against each example's own reference y: the rate under its matched latent value, and chance
(the same examples under the other values); training.evaluation.verdict.reference_control. The user task's control."""
PATH_FIELDS = ("checkpoint", "data", "store", "baseline_checkpoint", "out")  # io's paths: not part of a cell's key

Loss = tuple[tuple[str, object], ...]
"""LossConfig fields as (name, value) pairs."""
CELL_LOSS_FIELDS = ("weighting", "policy", "beta")
"""The LossConfig fields every cell sets itself (``train_config``), which its ``Loss`` pairs cannot."""
Overrides = tuple[tuple[str, object], ...]
"""Dotted TrainConfig fields as (name, value) pairs, e.g. ("cvae.latent_init_norm", 0.7)."""


@dataclass(frozen=True)
class CellBudget:
    """How long each CVAE cell trains and how much of it is evaluated."""

    steps: int = OptimConfig.steps
    """CVAE optimizer steps (train's cap by default)."""
    batch_size: int = OptimConfig.batch_size
    """CVAE batch size."""
    lr: float = OptimConfig.lr
    """CVAE learning rate."""
    starts: int | None = OptimConfig.starts
    """Initialisations compared after ``OptimConfig.start_steps`` (train's ``--starts``)."""
    decode_examples: int = 128
    """Test examples decoded per latent value for the control accuracy."""
    beta_warmup_steps: int = LossConfig.beta_warmup_steps
    """> 0: beta rises linearly from 0 to the cell's beta over this many steps; 0: constant beta."""
    dtype: str = IOConfig.dtype
    """The forward's dtype in training and eval (train's ``--dtype``: "auto" is bfloat16 on CUDA, float32 elsewhere)."""
    report_to: tuple[str, ...] = ()
    """Trackers each cell reports its training, eval's verdict and its figures to (train's ``--report-to``); not
    part of a cell's key."""

    def __post_init__(self):
        if min(self.steps, self.batch_size) < 1 or self.decode_examples < 1 or not self.lr > 0:
            raise ValueError("need steps, batch_size, decode_examples >= 1 and lr > 0")
        if self.beta_warmup_steps < 0:
            raise ValueError("beta_warmup_steps must be >= 0")


def starts_run(budget: CellBudget, latent: str = "discrete") -> int:
    """The starts a cell on ``budget`` trains, as train resolves them: one where the cap is no more than
    ``OptimConfig.start_steps``."""
    from tokweight.training.config.train import default_starts

    starts = budget.starts if budget.starts is not None else default_starts(latent)
    return starts if budget.steps > OptimConfig.start_steps else 1


def budget_line(cells: int, budget: CellBudget, latent: str = "discrete") -> str:
    """"N cells x up to S steps x R starts": a job's budget, steps capped (a run stops once it converges)."""
    starts = starts_run(budget, latent)
    return f"{cells} cells x up to {budget.steps} steps x {starts} start{'s' if starts > 1 else ''}"


@dataclass(frozen=True)
class CellPlan:
    """What every cell of one job shares."""

    k: int
    """Values of the discrete latent (the task's number of strategies)."""
    prefix_slots: int
    """Latent slots of the prefix pathway."""
    budget: CellBudget
    """Steps and evaluation size."""
    recipe: str
    """Name of a recipe (tokweight/presets/recipes/): how every cell makes its latent learnable."""
    loss: Loss = ()
    """LossConfig fields every cell sets besides weighting, policy and beta (the mixing weight lambda, the
    anchor term): how the decoder is kept whole, not what is compared."""


@dataclass(frozen=True)
class Cell:
    """One CVAE training run: what is compared, and its seed."""

    setting: str
    latent: str
    cond: str
    weighting: str
    beta: float
    seed: int
    group: str = "grid"
    """"grid" (discrete), "continuous", "cond" (z pathways), "sweep" or "own": which table it belongs to."""
    arm: str | None = None
    """The user task's name of the compared objective: the weighting and its repair; None in the synthetic jobs."""
    loss: Loss = ()
    """The arm's LossConfig fields, on top of the plan's."""
    overrides: Overrides = ()
    """Dotted TrainConfig fields on top of the recipe's: a setting compared (scripts/demo_variants.py --norms)."""

    @property
    def label(self) -> str:
        return f"{self.setting} {self.latent} {self.cond} {self.weighting} beta={self.beta:g} seed={self.seed}"

    @property
    def columns(self) -> dict:
        """Its columns in a job's cells.csv: the arm where there is one, what is compared, the arm's loss and remedy
        fields."""
        axes = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("arm", "loss", "overrides")}
        return ({} if self.arm is None else {"arm": self.arm}) | axes | dict(self.loss) | dict(self.overrides)


def train_config(cell: Cell, prep: Prepared, plan: CellPlan, run_dir: Path):
    """The cell's axes (latent, K, pathway, weighting, beta, seed) on the budget, then the recipe's overrides
    and the cell's own by ``with_recipe``: a recipe says how to train, the cell what is compared."""
    from tokweight.training.config.components import CVAEConfig
    from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

    b = plan.budget
    cfg = TrainConfig(
        io=IOConfig(checkpoint=str(prep.base), data=str(prep.data), store=str(prep.store), out=str(run_dir),
                    num_workers=0, dtype=b.dtype),
        cvae=CVAEConfig(latent=cell.latent, k=plan.k, cond=cell.cond,
                        slots=plan.prefix_slots if cell.cond == "prefix" else 1),
        loss=LossConfig(weighting=cell.weighting, policy="precomputed", beta=cell.beta,
                        beta_warmup_steps=b.beta_warmup_steps,
                        **(dict(plan.loss) | dict(cell.loss))),
        optim=OptimConfig(steps=b.steps, starts=b.starts, batch_size=b.batch_size, lr=b.lr, seed=cell.seed),
        log=LogConfig(grad_diag_every=b.steps, ckpt_every=b.steps, report_to=b.report_to))
    return with_recipe(cfg, plan.recipe, dict(cell.overrides))


def cell_spec(tcfg, prep: Prepared, decode_examples: int) -> dict:
    """What makes a cell the same cell: its whole resolved train config but the paths, its base model, its data
    and its evaluation."""
    train = tcfg.to_json()
    train["io"] = {k: v for k, v in train["io"].items() if k not in PATH_FIELDS}
    train["log"] = {k: v for k, v in train["log"].items() if k != "report_to"}
    return {"train": train, "base_fingerprint": prep.fingerprint, "data": prep.data_key,
            "eval": {"split": "test", "decode_examples": decode_examples}}


def cell_key(tcfg, prep: Prepared, decode_examples: int) -> str:
    return key_of(cell_spec(tcfg, prep, decode_examples))


def init_gradients(run_dir: Path) -> dict:
    """grad_recon / grad_kl of the posterior head at step 0 (training.evaluation.metrics.posterior_gradient_norms), the
    decoder's token-mean NLL at step 0 (how much the z pathway's init costs it), and the decoder's response to z
    at the most surprising token (l_t0_spread) at step 0 and the last logged step."""
    from tokweight.training.loop.run_dir import read_metrics

    train = [r for r in read_metrics(run_dir) if "loss" in r]
    first = next((r for r in train if r.get("step") == 0 and "grad_recon" in r), {})
    return {"grad_recon_init": first.get("grad_recon"), "grad_kl_init": first.get("grad_kl"),
            "nll_init": first.get("recon_uniform"), "l_t0_spread_init": first.get("l_t0_spread"),
            "l_t0_spread_end": train[-1].get("l_t0_spread") if train else None}


def tell_waiting(message: str) -> None:
    """What a cell waiting for another job's lock prints: it runs in a pool worker, which has no echo."""
    print(message, flush=True)


def run_cell(cell: Cell, prep: Prepared, plan: CellPlan, root: Path) -> tuple[dict, bool]:
    """(the cell's record, reused). Trains (or resumes) and evaluates unless a record with its key exists."""
    probe = train_config(cell, prep, plan, Path())
    key = cell_key(probe, prep, plan.budget.decode_examples)
    run_dir = root / "runs" / f"{cell.setting}-{key}"
    with StoreLock(run_dir, wait_s=LOCK_WAIT_S, waiting=tell_waiting):
        done = read_json(run_dir / "cell.json")
        if done is not None and done.get("key") == key:  # the key holds the base fingerprint
            return done, True
        record = {"key": key, "init_fingerprint": prep.fingerprint, "run": run_dir.name,
                  **train_and_evaluate(replace(probe, io=replace(probe.io, out=str(run_dir))), prep,
                                       plan.budget.decode_examples)}
        write_json_atomic(run_dir / "cell.json", record)
    return record, False


STATUSES = OUTCOMES[:2] + ("collapsed at convergence", "not converged by the cap")
"""What a cell ended as: eval's verdict where z is used; where it is not, whether training had converged (the
stop rule ended it) or the step cap did, which says "train longer", not "collapsed". "Used" is eval's word
(decoding moves with z), not "kept" (exact MI >= KEPT_FRACTION log K), which a partial code is not."""


def cell_status(outcome: str, stop_reason: str | None) -> str:
    """One of STATUSES from eval's outcome and the run's stop reason ("converged" or "step cap")."""
    if outcome != OUTCOMES[2]:
        return outcome
    return STATUSES[2] if stop_reason == "converged" else STATUSES[3]


def train_and_evaluate(tcfg, prep: Prepared, decode_examples: int) -> dict:
    """Train the run, evaluate it on the test split: the record's numbers."""
    from tokweight.commands.tracking import log_eval, log_run_figures, main_rank
    from tokweight.training.config.use import EvalConfig
    from tokweight.training.evaluation.evaluate import run_eval
    from tokweight.training.loop.train import run as train, run_trackers

    start = time.perf_counter()
    trackers = run_trackers(tcfg, main_rank())
    try:
        trained = train(tcfg, trackers=trackers)  # refuses a run directory trained from another checkpoint
        evaluated = run_eval(EvalConfig(run=tcfg.io.out, data=str(prep.data), split="test",
                                        decode_examples=decode_examples, dtype=tcfg.io.dtype))
        log_run_figures(trackers, tcfg.io.out)
        log_eval(trackers, evaluated)
    finally:
        trackers.close()
    metrics, free = evaluated["metrics"], evaluated["decode"].get("label_free", {})
    reference = evaluated["decode"].get("reference", {})
    stop = trained.get("stop", {}).get("reason")
    return {**{m: metrics.get(m) for m in METRICS if m != "control_accuracy"},
            "outcome": evaluated["z_used"]["outcome"], "stop": stop,
            "status": cell_status(evaluated["z_used"]["outcome"], stop), "own_exact_match": free.get("own_exact_match"),
            "base_exact_match": free.get("base_exact_match"), "best_of_k_exact_match": free.get("best_of_k_exact_match"),
            "nll_token_mean": metrics.get("nll_token_mean"), "base_nll_token_mean": metrics.get("base_nll_token_mean"),
            "control_accuracy": evaluated["decode"].get("control_accuracy"),
            "coverage": evaluated["decode"].get("coverage"), "strategy_accuracy": metrics.get("strategy_accuracy"),
            "decode_strategy_mi": evaluated["decode"].get("decode_strategy_mi"),
            "values_one_strategy": len(evaluated["values"]["trusted"]),
            "usage_perplexity": metrics.get("usage_perplexity"), "val_mi": trained.get("mi"),
            **init_gradients(Path(tcfg.io.out)), "train_wall_s": trained["train_wall_s"],
            "wall_s": time.perf_counter() - start, **{m: reference.get(m) for m in CONTROL},
            "control_above_chance": reference.get("above_chance"),
            "likelihood_log_ratio": evaluated["likelihood"].get("log_ratio"),
            "likelihood_above_chance": evaluated["likelihood"].get("above_chance"),
            "z_used": evaluated["z_used"]["used"]}


# ---------------------------------------------------------------- many cells


def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)  # each cell process gets one core; more threads oversubscribe the machine


def _run_cell_args(args: tuple) -> tuple[dict, bool]:
    return run_cell(*args)


def cell_pool(workers: int):
    """A forkserver pool of ``workers`` one-thread processes; None for one worker (cells run in this process)."""
    if workers < 2:
        return None
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    return ProcessPoolExecutor(workers, mp_context=get_context("forkserver"), initializer=_one_torch_thread)


@dataclass
class Progress:
    """Wall time of the fresh cells so far, for an ETA of the rest at ``parallel`` cells at a time."""

    total: int
    parallel: int
    fresh_s: float = 0.0
    fresh_n: int = 0

    def took(self, i: int, record: dict, reused: bool) -> str:
        """"reused" or the cell's seconds, then the ETA after cell ``i`` (1-based)."""
        if not reused:
            self.fresh_s, self.fresh_n = self.fresh_s + record["wall_s"], self.fresh_n + 1
        took = "reused" if reused else f"{record['wall_s']:.0f} s"
        if not self.fresh_n or i == self.total:
            return took
        return f"{took}; ETA {self.fresh_s / self.fresh_n * (self.total - i) / self.parallel / 60:.1f} min"


def each_cell(work: list[tuple], jobs: int = 1) -> Iterator[tuple[int, tuple, dict, bool, str]]:
    """(i, args, record, reused, took) per cell, in ``work``'s order: ``run_cell(*args)`` for each, ``jobs`` at
    a time (each in its own process, one torch thread; 1: in this process); ``took`` is "reused" or the cell's
    seconds, and the ETA of the rest (Progress)."""
    parallel = max(1, min(jobs, len(work)))
    pool, progress = cell_pool(parallel), Progress(len(work), parallel)
    try:
        results = pool.map(_run_cell_args, work) if pool else map(_run_cell_args, work)
        for i, (args, (record, reused)) in enumerate(zip(work, results), 1):
            yield i, args, record, reused, progress.took(i, record, reused)
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)


def strategy_line(cell: Cell, record: dict) -> str:
    """A synthetic cell's progress line: its MI, KL, NMI, control against the true strategy and recon."""
    return (f"{cell.label}: MI {fixed(record['mi'])} KL {fixed(record['kl'])} NMI {fixed(record['strategy_nmi'])} "
            f"control {fixed(record['control_accuracy'])} recon {fixed(record['recon_uniform'])}")


def run_cells(cells: list[Cell], prepared: dict[str, Prepared], plan: CellPlan, root: Path, echo: Echo,
              jobs: int = 1, line: Callable[[Cell, dict], str] = strategy_line) -> list[dict]:
    """Every cell (``each_cell``), rows and progress lines (``line``) in cell order; one row per cell. Cells
    are independent and seeded, so a cell's record does not depend on ``jobs``."""
    work = [(cell, prepared[cell.setting], plan, root) for cell in cells]
    rows = []
    for i, (cell, prep, _, _), record, reused, took in each_cell(work, jobs):
        echo(f"[cell {i}/{len(cells)}] {line(cell, record)} ({took})")
        rows.append({**cell.columns, "recipe": plan.recipe, **prep.stats_brief, **record, "reused": reused})
    return rows
