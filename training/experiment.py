"""`tokweight experiment`: posterior collapse and its fix, end to end, as one table.

Per T/(t0+1) setting (the generator's header and length knobs): synthetic data -> the
entangled base model -> its baseline store, each built once; then a grid of CVAE cells
(weighting x beta x seed with a discrete latent of K = #strategies; the continuous latent
for uniform vs surprisal-share; surprisal-share under each z pathway at the largest
T/(t0+1)), each trained and evaluated on the test split with decode-per-latent.

Reuse: an artefact's directory is named by a key, a hash of the canonical JSON of
everything that determines it (its config with defaults, and the keys or fingerprints of
its inputs). A base model is reused only when it loads (which checks its files against
its fingerprint) with the fingerprint recorded when it was built; a cell only when its
record names the same key (which hashes the base fingerprint it was trained from); the store is
reused by extract itself (a complete store for the fingerprint does nothing).

Outputs in DIR: cells.csv (one row per cell and seed), results.csv and results.md (mean
± std over seeds), mi_vs_ratio.png, amplification.png, experiment_config.json.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import platform
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from pipeline.shards import write_json_atomic
from store.fingerprint import canonical_json

ALL_WEIGHTINGS = ("uniform", "sum", "surprisal-share", "inverse-surprisal", "example-inverse",
                  "distribution-rescale")
COND_MODES = ("token", "prefix", "layernorm")
METRICS = ("mi", "strategy_mi", "kl", "strategy_nmi", "control_accuracy", "recon_uniform", "recon", "active_units")
"""Per-cell numbers: mi (exact, discrete only), strategy_mi (exact I(z; strategy), discrete only), kl, strategy_nmi, control_accuracy (decode-per-latent),
recon_uniform (token-mean NLL under E_q, comparable across weightings), recon (the cell's own
weighted reconstruction), active_units (continuous only). All on the test split; nats."""
PATH_FIELDS = ("checkpoint", "data", "store", "baseline_checkpoint", "out")  # not part of a cell's key

Echo = Callable[[str], None]


# ---------------------------------------------------------------- configs


@dataclass(frozen=True)
class Setting:
    """One T/(t0+1) setting: the synthetic generator's header and length knobs."""

    name: str
    """Label in tables and directory names ([a-z0-9-])."""
    header_len: int
    """Header tokens before s(x): t0 moves later and T grows by this much."""
    min_len: int
    """Shortest x; T = header_len + len(x) + 1."""
    max_len: int
    """Longest x."""

    def __post_init__(self):
        if not self.name or not all(c.isalnum() or c == "-" for c in self.name):
            raise ValueError(f"setting name must be non-empty [a-z0-9-], got {self.name!r}")
        if self.header_len < 0 or not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"setting {self.name}: need header_len >= 0 and 1 <= min_len <= max_len")


# x of one fixed length per setting, so T is the same for every example. Measured here with
# 2 layers, d=64, 3000 steps: copy/reverse on 16 symbols stayed at 0.83 nats after t0 (and
# varying lengths of 7-9 at ~0.8); copy/rotate-left over 32 symbols is learnt (a constant
# offset, and few repeated symbols for the copy to confuse).
DEFAULT_SETTINGS = (Setting("h3-n5", 3, 5, 5), Setting("h1-n8", 1, 8, 8), Setting("h0-n16", 0, 16, 16))


@dataclass(frozen=True)
class TaskConfig:
    """The data and the base model of every setting (shared by the experiment and the sweep)."""

    settings: tuple[Setting, ...] = DEFAULT_SETTINGS
    """T/(t0+1) settings, smallest first; the last is 'the largest' for the z-pathway cells."""
    alphabet_size: int = 32
    """Data symbols."""
    strategies: tuple[str, ...] = ("copy", "rotate-left")
    """Generator strategies; the discrete latent has K = len(strategies)."""
    n_train: int = 8000
    """Train examples per setting."""
    n_val: int = 512
    """Val examples per setting."""
    n_test: int = 512
    """Test examples per setting (evaluation and decode-per-latent)."""
    shard_size: int = 1000
    """Examples per shard."""
    data_seed: int = 0
    """Seed of the generator and of the base model."""
    base_steps: int = 3000
    """Base-model optimizer steps."""
    base_lr: float = 2e-3
    """Base-model peak learning rate."""
    base_batch_size: int = 64
    """Base-model batch size."""
    base_n_layer: int = 2
    """Base-model layers."""
    base_n_head: int = 4
    """Base-model attention heads."""
    base_d_model: int = 64
    """Base-model width."""

    def __post_init__(self):
        object.__setattr__(self, "settings", tuple(s if isinstance(s, Setting) else Setting(**s)
                                                   for s in self.settings))
        object.__setattr__(self, "strategies", tuple(self.strategies))
        names = [s.name for s in self.settings]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"settings need distinct names, got {names}")
        if len(self.strategies) < 2:
            raise ValueError("need at least two strategies (the latent has K = #strategies)")

    @property
    def k(self) -> int:
        return len(self.strategies)


@dataclass(frozen=True)
class CellBudget:
    """How long each CVAE cell trains and how much of it is evaluated."""

    steps: int = 300
    """CVAE optimizer steps (a recipe may override)."""
    batch_size: int = 32
    """CVAE batch size (a recipe may override)."""
    lr: float = 1e-3
    """CVAE learning rate (a recipe may override)."""
    decode_examples: int = 128
    """Test examples decoded per latent value for the control accuracy."""

    def __post_init__(self):
        if min(self.steps, self.batch_size) < 1 or self.decode_examples < 1 or not self.lr > 0:
            raise ValueError("need steps, batch_size, decode_examples >= 1 and lr > 0")


def coerce_nested(cfg, **types) -> None:
    """Nested config fields given as dicts (a config read back from JSON) become their dataclass."""
    for name, cls in types.items():
        if isinstance(getattr(cfg, name), dict):
            object.__setattr__(cfg, name, cls(**getattr(cfg, name)))


@dataclass(frozen=True)
class ExperimentConfig:
    """The grid of `tokweight experiment` (QUICK shrinks it)."""

    out: str
    """Results directory; data/, base/, store/ and runs/ below it are reused across runs."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Data and base models."""
    weightings: tuple[str, ...] = ALL_WEIGHTINGS
    """Weightings of the discrete grid."""
    betas: tuple[float, ...] = (1.0, 0.3)
    """KL weights (RESEARCH-NOTES: below ~gain/I the weightings' optima differ; 1 can collapse all)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds of every cell (heads, data order, noise)."""
    continuous_weightings: tuple[str, ...] = ("uniform", "surprisal-share")
    """Weightings of the continuous-latent cells (empty: none)."""
    cond_modes: tuple[str, ...] = COND_MODES
    """z pathways for surprisal-share at the largest setting ("token" is the grid's own)."""
    prefix_slots: int = 2
    """Latent slots of the prefix pathway."""
    budget: CellBudget = field(default_factory=CellBudget)
    """Steps and evaluation size per cell."""
    recipe: str = "baseline"
    """Name in training.recipes.RECIPES whose TrainConfig overrides every cell; "baseline": none."""
    jobs: int = 1
    """Cells trained at once, each in its own process with one torch thread (no effect on any number)."""

    def __post_init__(self):
        coerce_nested(self, task=TaskConfig, budget=CellBudget)
        if self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs}")
        for name in ("weightings", "betas", "seeds", "continuous_weightings", "cond_modes"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        bad = [w for w in self.weightings + self.continuous_weightings if w not in ALL_WEIGHTINGS]
        bad += [c for c in self.cond_modes if c not in COND_MODES]
        if bad:
            raise ValueError(f"unknown weightings or z pathways: {bad}")
        if not self.weightings or not self.betas or not self.seeds:
            raise ValueError("weightings, betas and seeds must be non-empty")
        if any(not b >= 0 for b in self.betas) or self.prefix_slots < 1:
            raise ValueError("betas must be >= 0 and prefix_slots >= 1")


QUICK = dict(weightings=("uniform", "sum", "surprisal-share"), seeds=(0,), continuous_weightings=(),
             budget=CellBudget(steps=150))
"""--quick: one seed, three weightings, no continuous cells, half the steps; same data and base models."""


def quick(cfg: ExperimentConfig) -> ExperimentConfig:
    return replace(cfg, **QUICK)


# ---------------------------------------------------------------- recipes (training/recipes.py)


def load_recipe(name: str) -> dict:
    """TrainConfig overrides of recipe ``name`` (``training.recipes.RECIPES``; "baseline" is none)."""
    from training.recipes import RECIPES

    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r} (known: {', '.join(sorted(RECIPES))})")
    return dict(RECIPES[name])


# ---------------------------------------------------------------- keys and files


def key_of(obj) -> str:
    """12 hex digits of sha256 over canonical JSON; refuses what JSON cannot hold."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()[:12]


def write_config(path: Path, cfg, recipe: dict) -> None:
    """A job's resolved config (a dataclass) and its recipe's overrides, next to its outputs."""
    write_json_atomic(path, {"config": asdict(cfg), "recipe_overrides": recipe})


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


# ---------------------------------------------------------------- data, base model, store per setting


@dataclass
class Prepared:
    """A setting's artefacts and what they measured."""

    setting: Setting
    data: Path
    data_key: str
    base: Path
    fingerprint: str
    store: Path
    stats: dict  # ratio_true, ratio_inspect, base quality, ...

    @property
    def stats_brief(self) -> dict:
        """The columns every cell row carries: T/(t0+1) from the generator and from inspection."""
        return {"ratio_true": self.stats["ratio_true"], "ratio_inspect": self.stats["ratio_inspect"]}


def synth_config(task: TaskConfig, setting: Setting):
    from pipeline.synth import SynthConfig

    return SynthConfig(alphabet_size=task.alphabet_size, min_len=setting.min_len, max_len=setting.max_len,
                       strategies=task.strategies, header_len=setting.header_len, n_train=task.n_train,
                       n_val=task.n_val, n_test=task.n_test, shard_size=task.shard_size, seed=task.data_seed)


def prepare_data(task: TaskConfig, setting: Setting, root: Path) -> tuple[Path, str, dict, bool]:
    """(directory, key, dataset.json, reused)."""
    from pipeline.synth import write_dataset

    cfg = synth_config(task, setting)
    spec = json.loads(json.dumps(asdict(cfg)))
    key = key_of(spec)
    path = root / "data" / f"{setting.name}-{key}"
    info = read_json(path / "dataset.json")
    if info is not None and info.get("config") == spec:
        return path, key, info, True
    return path, key, write_dataset(cfg, path, overwrite=True), False


def base_config(task: TaskConfig, data: Path, out: Path):
    from training.train_base import BaseTrainConfig

    return BaseTrainConfig(data=str(data), out=str(out), steps=task.base_steps, lr=task.base_lr,
                           batch_size=task.base_batch_size, n_layer=task.base_n_layer, n_head=task.base_n_head,
                           d_model=task.base_d_model, k_max=max(8, task.k), eval_every=task.base_steps,
                           warmup_steps=min(100, max(1, task.base_steps // 10)), seed=task.data_seed)


def prepare_base(task: TaskConfig, setting: Setting, data: Path, data_key: str, root: Path) -> tuple[Path, dict, bool]:
    """(checkpoint directory, train-base result with fingerprint, reused)."""
    from training.checkpoint import load_checkpoint
    from training.train_base import run as train_base

    probe = asdict(base_config(task, data, Path()))
    key = key_of({**{k: v for k, v in probe.items() if k not in ("data", "out")}, "data": data_key})
    path = root / "base" / f"{setting.name}-{key}"
    done = read_json(path / "base_result.json")
    if done is not None and done.get("key") == key:
        try:
            if load_checkpoint(path).fingerprint == done["fingerprint"]:
                return path, done, True
        except (FileNotFoundError, ValueError):
            pass  # damaged or replaced: train it again
    shutil.rmtree(path, ignore_errors=True)
    result = {"key": key, **train_base(base_config(task, data, path))}
    write_json_atomic(path / "base_result.json", result)
    return path, result, False


def inspection_estimate(store: Path, fingerprint: str) -> dict:
    """The inspection's headline numbers for one fingerprint (store/sql/summary.sql)."""
    from store.sql import connect, read_sql

    con = connect(store, [fingerprint])
    row = con.sql(read_sql("summary")).to_arrow_table().to_pylist()[0]
    return {"ratio_inspect": row["mean_amplification"], "ratio_true_store": row["mean_amplification_true"],
            "t0_share_exact": row["t0_share_exact"], "effective_tokens": row["mean_effective_tokens"],
            "mean_b": row["mean_b"], "ratio_if_z_removes_b": row["gain_ratio_if_z_removes_b"]}


def prepare_setting(task: TaskConfig, setting: Setting, root: Path, echo: Echo) -> Prepared:
    from pipeline.extract import ExtractConfig, run as extract

    start = time.perf_counter()
    data, data_key, info, data_reused = prepare_data(task, setting, root)
    base, base_result, base_reused = prepare_base(task, setting, data, data_key, root)
    store = root / "store"
    extracted = extract(ExtractConfig(checkpoint=str(base), data=str(data), store=str(store), progress=False))
    stats = {"setting": setting.name, "header_len": setting.header_len, "min_len": setting.min_len,
             "max_len": setting.max_len, "mean_T": info["stats"]["mean_T"], "mean_t0": info["stats"]["mean_t0"],
             "ratio_true": info["stats"]["mean_T_over_t0p1"],
             **inspection_estimate(store, base_result["fingerprint"]),
             "base_fingerprint": base_result["fingerprint"], "base_val_nll": base_result.get("val_nll"),
             "base_b_at_t0": base_result.get("b_at_t0"), "base_b_after_t0": base_result.get("b_after_t0"),
             "log_consistent_at_t0": base_result.get("log_consistent_at_t0"),
             "base_wall_s": base_result.get("wall_s")}
    reused = [name for name, r in (("data", data_reused), ("base", base_reused),
                                   ("store", extracted["nothing_to_do"])) if r]
    echo(f"[setting {setting.name}] T/(t0+1) = {stats['ratio_true']:.2f} (inspection: {stats['ratio_inspect']:.2f}); "
         f"base b at t0 {_f(stats['base_b_at_t0'])} (Bayes {_f(stats['log_consistent_at_t0'])}), after t0 "
         f"{_f(stats['base_b_after_t0'])} nats; reused: {', '.join(reused) or 'nothing'} "
         f"({time.perf_counter() - start:.0f} s)")
    return Prepared(setting, data, data_key, base, base_result["fingerprint"], store, stats)


def prepare_all(task: TaskConfig, root: Path, echo: Echo, names: tuple[str, ...] = ()) -> dict[str, Prepared]:
    chosen = [s for s in task.settings if not names or s.name in names]
    return {s.name: prepare_setting(task, s, root, echo) for s in chosen}


# ---------------------------------------------------------------- cells


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
    """"grid" (discrete), "continuous", "cond" (z pathways) or "sweep": which table it belongs to."""

    @property
    def label(self) -> str:
        return f"{self.setting} {self.latent} {self.cond} {self.weighting} beta={self.beta:g} seed={self.seed}"


def experiment_cells(cfg: ExperimentConfig) -> list[Cell]:
    names = [s.name for s in cfg.task.settings]
    cells = [Cell(s, "discrete", "token", w, b, seed) for s in names for w in cfg.weightings
             for b in cfg.betas for seed in cfg.seeds]
    cells += [Cell(s, "continuous", "token", w, b, seed, "continuous") for s in names
              for w in cfg.continuous_weightings for b in cfg.betas for seed in cfg.seeds]
    cells += [Cell(names[-1], "discrete", c, "surprisal-share", b, seed, "cond") for c in cfg.cond_modes
              if c != "token" for b in cfg.betas for seed in cfg.seeds]
    return cells


def train_config(cell: Cell, prep: Prepared, k: int, prefix_slots: int, budget: CellBudget, recipe: dict,
                 run_dir: Path):
    """The cell's TrainConfig: budget defaults, then the recipe's overrides, then the cell's own axes
    (latent, K, pathway, weighting, beta value, seed): a recipe says how to train, the cell what is compared."""
    from training.cvae import CVAEConfig
    from training.schedules import BetaSchedule
    from training.train import TrainConfig

    overrides = dict(recipe)
    cvae = CVAEConfig(**{**overrides.pop("cvae", {}), "latent": cell.latent, "k": k, "cond": cell.cond,
                         "slots": prefix_slots if cell.cond == "prefix" else 1})
    beta = BetaSchedule(**{**overrides.pop("beta", {}), "beta": cell.beta})
    kwargs = dict(steps=budget.steps, batch_size=budget.batch_size, lr=budget.lr, num_workers=0,
                  grad_diag_every=budget.steps, ckpt_every=budget.steps, policy="precomputed")
    kwargs |= overrides
    kwargs |= dict(checkpoint=str(prep.base), data=str(prep.data), store=str(prep.store), out=str(run_dir),
                   cvae=cvae, beta=beta, weighting=cell.weighting, seed=cell.seed)
    try:
        return TrainConfig(**kwargs)
    except TypeError as e:  # a recipe naming a field this TrainConfig lacks
        raise ValueError(f"recipe overrides do not fit TrainConfig: {e}") from None


def cell_key(tcfg, prep: Prepared, decode_examples: int) -> str:
    train = {k: v for k, v in tcfg.to_json().items() if k not in PATH_FIELDS}
    return key_of({"train": train, "base_fingerprint": prep.fingerprint, "data": prep.data_key,
                   "eval": {"split": "test", "decode_examples": decode_examples}})


def init_gradients(run_dir: Path) -> dict:
    """grad_recon / grad_kl of the posterior head at step 0 (training.metrics.posterior_gradient_norms)."""
    from training.train import read_metrics

    for record in read_metrics(run_dir):
        if record.get("step") == 0 and "grad_recon" in record:
            return {"grad_recon_init": record["grad_recon"], "grad_kl_init": record["grad_kl"]}
    return {"grad_recon_init": None, "grad_kl_init": None}


def run_cell(cell: Cell, prep: Prepared, k: int, prefix_slots: int, budget: CellBudget, recipe: dict,
             root: Path) -> tuple[dict, bool]:
    """(the cell's record, reused). Trains (or resumes) and evaluates unless a record with its key exists."""
    from training.evaluate import EvalConfig, run_eval
    from training.train import run as train

    probe = train_config(cell, prep, k, prefix_slots, budget, recipe, Path())
    key = cell_key(probe, prep, budget.decode_examples)
    run_dir = root / "runs" / f"{cell.setting}-{key}"
    done = read_json(run_dir / "cell.json")
    if done is not None and done.get("key") == key:  # the key holds the base fingerprint
        return done, True
    start = time.perf_counter()
    trained = train(replace(probe, out=str(run_dir)))
    evaluated = run_eval(EvalConfig(run=str(run_dir), data=str(prep.data), split="test",
                                    decode_examples=budget.decode_examples))
    metrics = evaluated["metrics"]  # train refuses a run directory trained from another checkpoint
    record = {"key": key, "init_fingerprint": prep.fingerprint, "run": run_dir.name,
              **{m: metrics.get(m) for m in METRICS if m != "control_accuracy"},
              "control_accuracy": evaluated["decode"].get("control_accuracy"),
              "strategy_accuracy": metrics.get("strategy_accuracy"),
              "usage_perplexity": metrics.get("usage_perplexity"), "val_mi": trained.get("mi"),
              **init_gradients(run_dir), "train_wall_s": trained["train_wall_s"],
              "wall_s": time.perf_counter() - start}
    write_json_atomic(run_dir / "cell.json", record)
    return record, False


def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)  # each cell process gets one core; more threads oversubscribe (STACK-NOTES)


def _run_cell_args(args: tuple) -> tuple[dict, bool]:
    return run_cell(*args)


def run_cells(cells: list[Cell], prepared: dict[str, Prepared], k: int, prefix_slots: int, budget: CellBudget,
              recipe_name: str, root: Path, echo: Echo, jobs: int = 1) -> list[dict]:
    """Every cell, ``jobs`` at a time (each in its own process, one torch thread; 1: in this process),
    rows and progress lines in cell order, with the ETA from the fresh cells so far; one row per cell.
    Cells are independent and seeded, so a cell's record does not depend on ``jobs``."""
    recipe = load_recipe(recipe_name)
    work = [(cell, prepared[cell.setting], k, prefix_slots, budget, recipe, root) for cell in cells]
    pool = None
    if jobs > 1 and len(cells) > 1:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        pool = ProcessPoolExecutor(min(jobs, len(cells)), mp_context=get_context("forkserver"),
                                   initializer=_one_torch_thread)
    rows, fresh_s, fresh_n = [], 0.0, 0
    try:
        results = pool.map(_run_cell_args, work) if pool else map(_run_cell_args, work)
        for i, (cell, (record, reused)) in enumerate(zip(cells, results), 1):
            if not reused:
                fresh_s, fresh_n = fresh_s + record["wall_s"], fresh_n + 1
            left = fresh_s / fresh_n * (len(cells) - i) / max(1, min(jobs, len(cells))) / 60 if fresh_n else 0
            eta = f"; ETA {left:.1f} min" if fresh_n and i < len(cells) else ""
            took = "reused" if reused else f"{record['wall_s']:.0f} s"
            echo(f"[cell {i}/{len(cells)}] {cell.label}: MI {_f(record['mi'])} KL {_f(record['kl'])} "
                 f"NMI {_f(record['strategy_nmi'])} control {_f(record['control_accuracy'])} "
                 f"recon {_f(record['recon_uniform'])} ({took}{eta})")
            rows.append({**asdict(cell), "recipe": recipe_name, **prepared[cell.setting].stats_brief, **record,
                         "reused": reused})
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    return rows


def _f(v, digits: int = 3) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


# ---------------------------------------------------------------- aggregation


GROUP_KEYS = ("group", "setting", "latent", "cond", "weighting", "beta")


def mean_std(values: list) -> tuple[float | None, float | None]:
    """Mean and population std of the values that exist (None: no value)."""
    vals = [v for v in values if v is not None]
    return (float(np.mean(vals)), float(np.std(vals))) if vals else (None, None)


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per (group, setting, latent, pathway, weighting, beta): mean and std over seeds of METRICS."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in GROUP_KEYS), []).append(r)
    out = []
    for key, rs in groups.items():
        agg = {**dict(zip(GROUP_KEYS, key)), "recipe": rs[0]["recipe"], "ratio_true": rs[0]["ratio_true"],
               "ratio_inspect": rs[0]["ratio_inspect"], "n_seeds": len(rs),
               "seeds": ";".join(str(r["seed"]) for r in rs)}
        for m in METRICS:
            agg[f"{m}_mean"], agg[f"{m}_std"] = mean_std([r.get(m) for r in rs])  # cells older than a metric lack it
        out.append(agg)
    return out


def amplification(rows: list[dict], settings: dict[str, dict]) -> list[dict]:
    """Measured surprisal-share / uniform posterior-gradient norm at step 0 per setting, over the
    (beta, seed) pairs of discrete token cells (same seed: same heads and first batch), against
    the predicted T/(t0+1)."""
    grid = {(r["setting"], r["beta"], r["seed"], r["weighting"]): r for r in rows if r["group"] == "grid"}
    ratios: dict[str, list[float]] = {name: [] for name in settings}
    for (s, b, seed, w), uniform in grid.items():
        share = grid.get((s, b, seed, "surprisal-share"))
        if w == "uniform" and share and uniform["grad_recon_init"] and share["grad_recon_init"] is not None:
            ratios.setdefault(s, []).append(share["grad_recon_init"] / uniform["grad_recon_init"])
    out = []
    for name, stats in settings.items():
        mean, std = mean_std(ratios[name])
        out.append({"setting": name, "ratio_true": stats["ratio_true"], "ratio_inspect": stats["ratio_inspect"],
                    "effective_tokens": stats["effective_tokens"], "measured_mean": mean, "measured_std": std,
                    "pairs": len(ratios[name])})
    return out


# ---------------------------------------------------------------- files


def write_csv(path: Path, rows: list[dict]) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    tmp.replace(path)


def machine() -> str:
    import os

    import torch

    return (f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"torch {torch.__version__} with {torch.get_num_threads()} thread(s)")


def pm(row: dict, metric: str) -> str:
    mean, std = row.get(f"{metric}_mean"), row.get(f"{metric}_std")
    return "–" if mean is None else f"{mean:.3f} ± {std:.3f}"


def md_table(headers: list[str], lines: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                     + ["| " + " | ".join(line) + " |" for line in lines])


def header_lines(title: str, recipe: str, command: str | None, wall_s: float, task: TaskConfig,
                 cells: int, reused: int) -> list[str]:
    return [f"# {title}", "",
            f"- recipe: `{recipe}`", f"- command: `{command or '(library call)'}`", f"- machine: {machine()}",
            f"- wall time: {wall_s / 60:.1f} min; {cells} cells, {reused} reused from earlier runs",
            f"- task: strategies {', '.join(task.strategies)} (K = S = {task.k}, log S = {math.log(task.k):.3f} "
            f"nats), alphabet {task.alphabet_size}, {task.n_train} train / {task.n_test} test examples; "
            f"base model {task.base_n_layer} layers, d={task.base_d_model}, {task.base_steps} steps", ""]


def settings_table(settings: dict[str, dict]) -> str:
    lines = [[name, str(s["header_len"]), f"{s['min_len']}-{s['max_len']}", _f(s["mean_T"], 2), _f(s["mean_t0"], 2),
              _f(s["ratio_true"], 2), _f(s["ratio_inspect"], 2), _f(s["effective_tokens"], 2),
              f"{_f(s['base_b_at_t0'])} ({_f(s['log_consistent_at_t0'])})", _f(s["base_b_after_t0"]),
              _f(s["base_val_nll"])] for name, s in settings.items()]
    return md_table(["setting", "header", "len(x)", "mean T", "mean t0", "T/(t0+1) generator",
                     "T/(t0+1) inspection (t0_share)", "effective tokens", "base b at t0 (Bayes)",
                     "base b after t0", "base val NLL"], lines)


def render_results(cfg: ExperimentConfig, settings: dict[str, dict], agg: list[dict], amp: list[dict],
                   command: str | None, wall_s: float, n_cells: int, n_reused: int) -> str:
    ratio = {name: s["ratio_true"] for name, s in settings.items()}
    out = header_lines("tokweight experiment: results", cfg.recipe, command, wall_s, cfg.task, n_cells, n_reused)
    out += [f"Every number below is from this run: test split, mean ± population std over seeds "
            f"{', '.join(map(str, cfg.seeds))}; MI is the exact I(z; x,y) of the discrete posterior in nats "
            f"(log K = {math.log(cfg.task.k):.3f}); recon is the token-mean NLL under q (comparable across "
            f"weightings); control is the decode-per-latent control accuracy.", "",
            "## Settings", "", settings_table(settings), ""]
    grid = [r for r in agg if r["group"] == "grid"]
    for beta in cfg.betas:
        cells = {(r["weighting"], r["setting"]): r for r in grid if r["beta"] == beta}
        out += [f"## Discrete latent, beta = {beta:g}: MI (nats) by weighting and T/(t0+1)", "",
                md_table(["weighting"] + [f"{n} ({ratio[n]:.1f})" for n in settings],
                         [[w] + [pm(cells.get((w, n), {}), "mi") for n in settings] for w in cfg.weightings]), ""]
    long = sorted(grid, key=lambda r: (-r["beta"], ratio[r["setting"]], cfg.weightings.index(r["weighting"])))
    out += ["## Discrete latent: every metric", "",
            md_table(["beta", "setting", "T/(t0+1)", "weighting", "MI", "KL", "strategy NMI", "control", "recon"],
                     [[f"{r['beta']:g}", r["setting"], f"{r['ratio_true']:.2f}", r["weighting"], pm(r, "mi"),
                       pm(r, "kl"), pm(r, "strategy_nmi"), pm(r, "control_accuracy"), pm(r, "recon_uniform")]
                      for r in long]), ""]
    cont = sorted((r for r in agg if r["group"] == "continuous"), key=lambda r: (-r["beta"], ratio[r["setting"]]))
    if cont:
        out += ["## Continuous latent (NMI of k-means clusters of the posterior means)", "",
                md_table(["beta", "setting", "T/(t0+1)", "weighting", "KL", "active units", "strategy NMI",
                          "control", "recon"],
                         [[f"{r['beta']:g}", r["setting"], f"{r['ratio_true']:.2f}", r["weighting"], pm(r, "kl"),
                           pm(r, "active_units"), pm(r, "strategy_nmi"), pm(r, "control_accuracy"),
                           pm(r, "recon_uniform")] for r in cont]), ""]
    largest = cfg.task.settings[-1].name
    cond = [r for r in agg if r["setting"] == largest and r["latent"] == "discrete"
            and r["weighting"] == "surprisal-share" and r["group"] in ("grid", "cond") and r["cond"] in cfg.cond_modes]
    if any(r["group"] == "cond" for r in cond):
        cond.sort(key=lambda r: (-r["beta"], COND_MODES.index(r["cond"])))
        out += [f"## surprisal-share under each z pathway at the largest T/(t0+1) ({largest}, "
                f"{ratio[largest]:.2f})", "",
                md_table(["beta", "pathway", "MI", "KL", "strategy NMI", "control", "recon"],
                         [[f"{r['beta']:g}", r["cond"], pm(r, "mi"), pm(r, "kl"), pm(r, "strategy_nmi"),
                           pm(r, "control_accuracy"), pm(r, "recon_uniform")] for r in cond]), ""]
    out += ["## Gradient amplification at initialisation", "",
            "||d recon / d posterior head|| at step 0, surprisal-share over uniform, same seed (same heads, "
            "same first batch), against the predicted T/(t0+1).", "",
            md_table(["setting", "predicted T/(t0+1) (generator)", "inspection", "effective tokens",
                      "measured ratio", "pairs"],
                     [[a["setting"], _f(a["ratio_true"], 2), _f(a["ratio_inspect"], 2), _f(a["effective_tokens"], 2),
                       "–" if a["measured_mean"] is None else f"{a['measured_mean']:.2f} ± {a['measured_std']:.2f}",
                       str(a["pairs"])] for a in amp]), "",
            "![MI against T/(t0+1)](mi_vs_ratio.png)", "", "![gradient amplification](amplification.png)", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- plots (matplotlib's object API)


def figure(ncols: int, width: float = 5.0, height: float = 3.8):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def plot_mi_vs_ratio(agg: list[dict], cfg: ExperimentConfig):
    """Exact MI against T/(t0+1), one line per weighting (discrete, token pathway), one panel per beta."""
    fig, axes = figure(len(cfg.betas))
    for ax, beta in zip(axes, cfg.betas):
        for w in cfg.weightings:
            rows = sorted((r for r in agg if r["group"] == "grid" and r["beta"] == beta and r["weighting"] == w),
                          key=lambda r: r["ratio_true"])
            ax.errorbar([r["ratio_true"] for r in rows], [r["mi_mean"] for r in rows],
                        yerr=[r["mi_std"] for r in rows], marker="o", capsize=3, label=w)
        ax.axhline(math.log(cfg.task.k), color="grey", ls=":", lw=1, label="log K")
        ax.set(xscale="log", xlabel="T/(t0+1) (generator)", ylabel="exact MI (nats)",
               title=f"beta = {beta:g}, recipe {cfg.recipe}")
        ax.legend(fontsize=7)
    return fig


def plot_amplification(amp: list[dict], recipe: str):
    """Measured gradient ratio at init against predicted T/(t0+1), with the line measured = predicted."""
    fig, (ax,) = figure(1, width=5.5)
    # log axes: a zero ratio (e.g. an E-step recipe trains the posterior head by distillation,
    # so its reconstruction gradient there is 0) has no place on them; the table still shows it
    pts = [a for a in amp if a["measured_mean"] is not None and a["measured_mean"] > 0]
    ax.errorbar([a["ratio_true"] for a in pts], [a["measured_mean"] for a in pts],
                yerr=[a["measured_std"] for a in pts], marker="o", ls="none", capsize=3, label="measured")
    for a in pts:
        ax.annotate(a["setting"], (a["ratio_true"], a["measured_mean"]), fontsize=7)
    if pts:
        lo = min(min(a["ratio_true"], a["measured_mean"]) for a in pts)
        hi = max(max(a["ratio_true"], a["measured_mean"]) for a in pts)
        ax.plot([lo, hi], [lo, hi], color="grey", ls=":", label="measured = predicted")
        ax.set(xscale="log", yscale="log")
    else:
        ax.text(0.5, 0.5, "no positive ratio to show", ha="center", transform=ax.transAxes)
    ax.set(xlabel="predicted T/(t0+1)", ylabel="grad norm ratio, surprisal-share / uniform",
           title=f"posterior gradient at init ({recipe})")
    ax.legend(fontsize=7)
    return fig


# ---------------------------------------------------------------- the job


def run(cfg: ExperimentConfig, echo: Echo = print, command: str | None = None) -> dict:
    """Build or reuse every artefact, run every cell, write the results; returns the paths and tables."""
    start = time.perf_counter()
    root = Path(cfg.out)
    root.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe(cfg.recipe)  # fails before any work on an unknown recipe
    write_config(root / "experiment_config.json", cfg, recipe)
    cells = experiment_cells(cfg)
    echo(f"[experiment] {len(cfg.task.settings)} settings, {len(cells)} cells of {cfg.budget.steps} steps, "
         f"recipe {cfg.recipe}")
    prepared = prepare_all(cfg.task, root, echo)
    rows = run_cells(cells, prepared, cfg.task.k, cfg.prefix_slots, cfg.budget, cfg.recipe, root, echo, cfg.jobs)
    settings = {name: p.stats for name, p in prepared.items()}
    agg = aggregate(rows)
    amp = amplification(rows, settings)
    wall = time.perf_counter() - start
    write_csv(root / "cells.csv", rows)
    write_csv(root / "results.csv", agg)
    write_csv(root / "amplification.csv", [{"recipe": cfg.recipe, **a} for a in amp])
    write_csv(root / "settings.csv", [{"recipe": cfg.recipe, **s} for s in settings.values()])
    plot_mi_vs_ratio(agg, cfg).savefig(root / "mi_vs_ratio.png", dpi=110)
    plot_amplification(amp, cfg.recipe).savefig(root / "amplification.png", dpi=110)
    (root / "results.md").write_text(render_results(cfg, settings, agg, amp, command, wall, len(rows),
                                                    sum(r["reused"] for r in rows)))
    echo(f"[experiment] done in {wall / 60:.1f} min: {root / 'results.md'}")
    return {"results": agg, "cells": rows, "settings": settings, "amplification": amp, "wall_s": wall}
