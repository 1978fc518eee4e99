"""What every synthetic experiment runs on, and its content-addressed cache: the T/(t0+1) settings, and per
setting synthetic data -> base model -> baseline store.

A TaskConfig holds the generator's and the base trainer's own configs, so every field they have is
settable here and hashed into the artefacts' keys. An artefact's directory is named by a key, a hash of
the canonical JSON of everything that determines it (its config with defaults, and the keys or
fingerprints of its inputs). Data is reused when its dataset.json records the same config; what is built on
it (base model, cells) is keyed by the data's content, its shards' sha256, so a generator field whose
default leaves the data as it was but reuses the base trained on the same
bytes. A base model is reused only when it loads (which checks its files against its fingerprint) with the
fingerprint recorded when it was built; the store by extract itself (a complete store for the fingerprint
does nothing).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from tokweight.config_files import preset_config
from tokweight.pipeline.data.config import SynthConfig
from tokweight.store.durable import write_json_atomic
from tokweight.store.lock import StoreLock
from tokweight.report.tables import fixed
from tokweight.training.config.base import BaseTrainConfig


@dataclass(frozen=True)
class Setting:
    """One T/(t0+1) setting: the synthetic generator's header and length knobs."""

    name: str
    """Label in tables and directory names ([a-z0-9-])."""
    header_len: int
    """Header tokens before s(x): t0 moves later and T grows by this much."""
    min_len: int
    """Shortest x; T = header_len + len(x) + trailer_len + 1."""
    max_len: int
    """Longest x."""
    trailer_len: int = 0
    """Trailer tokens after s(x): T grows by this much, t0 does not."""

    def __post_init__(self):
        if not self.name or not all(c.isalnum() or c == "-" for c in self.name):
            raise ValueError(f"setting name must be non-empty [a-z0-9-], got {self.name!r}")
        if min(self.header_len, self.trailer_len) < 0 or not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"setting {self.name}: need header_len, trailer_len >= 0 and 1 <= min_len <= max_len")


def base_schedule(steps: int) -> dict:
    """A base model's ``steps``, evaluated once at the last, with a warm-up of a tenth of them (at most 100)."""
    return {"steps": steps, "eval_every": steps, "warmup_steps": min(100, max(1, steps // 10))}


def base_model(steps: int, **fields) -> BaseTrainConfig:
    """A base-model config on ``base_schedule(steps)``; ``data`` and ``out`` are left empty, each setting fills
    in its own."""
    return BaseTrainConfig(data="", out="", **base_schedule(steps), **fields)


def coerce_nested(cfg, **types) -> None:
    """Nested config fields given as dicts (a config read back from JSON) become their dataclass."""
    for name, cls in types.items():
        if isinstance(getattr(cfg, name), dict):
            object.__setattr__(cfg, name, cls(**getattr(cfg, name)))


@dataclass(frozen=True)
class TaskConfig:
    """The data and the base model of every setting (shared by the experiment and the sweep; theirs is the
    preset file experiment/task.toml, ``synthetic_task``)."""

    settings: tuple[Setting, ...]
    """T/(t0+1) settings, smallest first; the last is 'the largest' for the z-pathway cells."""
    synth: SynthConfig = field(default_factory=SynthConfig)
    """The generator; each setting replaces its header_len, trailer_len, min_len and max_len. The discrete
    latent has K = len(synth.strategies)."""
    base: BaseTrainConfig = field(default_factory=lambda: BaseTrainConfig(data="", out=""))
    """The base model's training; each setting fills in data and out."""

    def __post_init__(self):
        object.__setattr__(self, "settings", tuple(s if isinstance(s, Setting) else Setting(**s)
                                                   for s in self.settings))
        coerce_nested(self, synth=SynthConfig, base=BaseTrainConfig)
        names = [s.name for s in self.settings]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"settings need distinct names, got {names}")
        if self.k < 2:
            raise ValueError("need at least two strategies (the latent has K = #strategies)")
        if self.base.k_max < self.k:
            raise ValueError(f"base.k_max = {self.base.k_max} latent tokens, but K = {self.k} strategies")

    @property
    def k(self) -> int:
        return len(self.synth.strategies)


def synthetic_task() -> TaskConfig:
    """The synthetic jobs' task: the three T/(t0+1) settings, their generator and base model
    (tokweight/presets/experiment/task.toml)."""
    return preset_config(TaskConfig, "experiment", "task")


def synth_config(task: TaskConfig, setting: Setting) -> SynthConfig:
    return replace(task.synth, header_len=setting.header_len, trailer_len=setting.trailer_len,
                   min_len=setting.min_len, max_len=setting.max_len)


def base_config(task: TaskConfig, data: Path, out: Path) -> BaseTrainConfig:
    return replace(task.base, data=str(data), out=str(out))


# ---------------------------------------------------------------- the cache

Echo = Callable[[str], None]


def key_of(obj) -> str:
    """12 hex digits of sha256 over canonical JSON; refuses what JSON cannot hold."""
    from tokweight.store.fingerprint import canonical_json  # torch: imported when a key is taken

    return hashlib.sha256(canonical_json(obj)).hexdigest()[:12]


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


@dataclass
class Prepared:
    """A setting's artefacts and what they measured."""

    setting: Setting
    data: Path | str  # a folder, or URLs (pipeline.data.urls)
    data_key: str
    base: Path
    fingerprint: str
    store: Path
    stats: dict  # ratio_true, ratio_inspect, base quality, ...

    @property
    def stats_brief(self) -> dict:
        """The columns every cell row carries: T/(t0+1) from the generator and from inspection."""
        return {"ratio_true": self.stats["ratio_true"], "ratio_inspect": self.stats["ratio_inspect"]}


def data_key(data: Path, shards: dict[str, list[Path]]) -> str:
    """A hash of every shard's split, path below ``data``, size and sha256: the dataset's content."""
    from tokweight.store.parts import sha256_path

    listing = {split: [[p.relative_to(data).as_posix(), *reversed(sha256_path(p))] for p in paths]
               for split, paths in shards.items()}
    return key_of(listing)


def prepare_data(task: TaskConfig, setting: Setting, root: Path) -> tuple[Path, str, dict, bool]:
    """(directory, content key, dataset.json, reused). The directory is named by the generator's config, the
    key is ``data_key`` of the shards it wrote."""
    from tokweight.pipeline.data.synth import config_dict, write_dataset

    cfg = synth_config(task, setting)
    spec = json.loads(json.dumps(config_dict(cfg)))  # as dataset.json records it
    path = root / "data" / f"{setting.name}-{key_of(spec)}"
    info = read_json(path / "dataset.json")
    reused = info is not None and info.get("config") == spec
    if not reused:
        info = write_dataset(cfg, path, overwrite=True)
    shards = {split.name: sorted(split.glob("*.tar")) for split in sorted(path.iterdir()) if split.is_dir()}
    return path, data_key(path, shards), info, reused


def base_key(task: TaskConfig, data_key: str) -> str:
    """The base config without its paths, and the data's key in place of its directory."""
    config = {k: v for k, v in asdict(task.base).items() if k not in ("data", "out", "report_to")}
    return key_of({**config, "data": data_key})


def prepare_base(task: TaskConfig, setting: Setting, data: Path, data_key: str, root: Path) -> tuple[Path, dict, bool]:
    """(checkpoint directory, train-base result with fingerprint, reused)."""
    from tokweight.training.loop.train_base import run as train_base

    key = base_key(task, data_key)
    path = root / "base" / f"{setting.name}-{key}"
    done = read_json(path / "base_result.json")
    if done is not None and done.get("key") == key and loads_as(path, done["fingerprint"]):
        return path, done, True
    shutil.rmtree(path, ignore_errors=True)
    result = {"key": key, **train_base(base_config(task, data, path))}
    write_json_atomic(path / "base_result.json", result)
    return path, result, False


def loads_as(checkpoint: Path, fingerprint: str) -> bool:
    """Whether the checkpoint loads (its files match its own fingerprint) and is the one recorded."""
    from tokweight.pipeline.models.checkpoint import load_checkpoint

    try:
        return load_checkpoint(checkpoint).fingerprint == fingerprint
    except (FileNotFoundError, ValueError):
        return False  # damaged or replaced: train it again


def inspection_estimate(store: Path, fingerprint: str) -> dict:
    """The inspection's headline numbers for one fingerprint (store/sql/summary.sql)."""
    from tokweight.store.sql import connect, read_sql

    con = connect(store, [fingerprint])
    row = con.sql(read_sql("summary")).to_arrow_table().to_pylist()[0]
    return {"ratio_inspect": row["mean_amplification"], "ratio_true_store": row["mean_amplification_true"],
            "t0_share_exact": row["t0_share_exact"], "effective_tokens": row["mean_effective_tokens"],
            "mean_b": row["mean_b"], "ratio_if_z_removes_b": row["gain_ratio_if_z_removes_b"]}


ZCOND_TOLERANCE = 0.1
"""Nats per token the base may lose on the z-conditioned template against the z-free one before a setting is
flagged: a base can read the z-free template well and the z-conditioned one badly."""


def zcond_gap(stats: dict) -> float | None:
    """The base's val NLL on the z-conditioned template minus the z-free one; None for a base whose stats lack either."""
    zcond, zfree = stats.get("base_val_nll_zcond"), stats.get("base_val_nll")
    return None if zcond is None or zfree is None else zcond - zfree


def setting_stats(setting: Setting, info: dict, store: Path, base_result: dict) -> dict:
    """The settings table's row: T/(t0+1) by the generator and by inspection, and the base model's quality."""
    return {"setting": setting.name, "header_len": setting.header_len, "trailer_len": setting.trailer_len,
            "min_len": setting.min_len, "max_len": setting.max_len, "mean_T": info["stats"]["mean_T"],
            "mean_t0": info["stats"]["mean_t0"], "ratio_true": info["stats"]["mean_T_over_t0p1"],
            **inspection_estimate(store, base_result["fingerprint"]),
            "base_fingerprint": base_result["fingerprint"], "base_val_nll": base_result.get("val_nll"),
            "base_val_nll_zcond": base_result.get("val_nll_zcond"),
            "base_b_at_t0": base_result.get("b_at_t0"), "base_b_after_t0": base_result.get("b_after_t0"),
            "log_consistent_at_t0": base_result.get("log_consistent_at_t0"),
            "base_wall_s": base_result.get("wall_s")}


LOCK_WAIT_S = 24 * 3600.0
"""Seconds a job waits for another job on the same root that is preparing a setting or training a cell it
needs, then reuses what that job made: a day, in effect as long as it holds the lock (a lock dies with its
process). Finite, because extraction records its config as JSON."""


def prepare_setting(task: TaskConfig, setting: Setting, root: Path, echo: Echo) -> Prepared:
    """The setting's data, base model and store under ``root``, each reused when its key matches; one job at a
    time prepares a root (the others wait, then reuse what it made)."""
    from tokweight.pipeline.extract.config import ExtractConfig
    from tokweight.pipeline.extract.extract import run as extract

    start = time.perf_counter()
    with StoreLock(root, wait_s=LOCK_WAIT_S, waiting=echo):
        data, data_key, info, data_reused = prepare_data(task, setting, root)
        base, base_result, base_reused = prepare_base(task, setting, data, data_key, root)
        store = root / "store"
        extracted = extract(ExtractConfig(checkpoint=str(base), data=str(data), store=str(store), progress=False))
    stats = setting_stats(setting, info, store, base_result)
    reused = [name for name, r in (("data", data_reused), ("base", base_reused),
                                   ("store", extracted["nothing_to_do"])) if r]
    echo(f"[setting {setting.name}] T/(t0+1) = {stats['ratio_true']:.2f} (inspection: {stats['ratio_inspect']:.2f}); "
         f"base b at t0 {fixed(stats['base_b_at_t0'])} (Bayes {fixed(stats['log_consistent_at_t0'])}), after t0 "
         f"{fixed(stats['base_b_after_t0'])} nats; reused: {', '.join(reused) or 'nothing'} "
         f"({time.perf_counter() - start:.0f} s)")
    if (gap := zcond_gap(stats)) is not None and gap > ZCOND_TOLERANCE:
        echo(f"[setting {setting.name}] warning: the base model reads the z-conditioned template at "
             f"{stats['base_val_nll_zcond']:.3f} nats per token against {stats['base_val_nll']:.3f} z-free: it has not "
             f"learnt the template every CVAE decoder starts from, so every cell starts damaged; train the base longer")
    return Prepared(setting, data, data_key, base, base_result["fingerprint"], store, stats)


def prepare_all(task: TaskConfig, root: Path, echo: Echo, names: tuple[str, ...] = ()) -> dict[str, Prepared]:
    chosen = [s for s in task.settings if not names or s.name in names]
    return {s.name: prepare_setting(task, s, root, echo) for s in chosen}
