"""The content-addressed cache of each setting's artefacts: synthetic data -> base model -> baseline store.

An artefact's directory is named by a key, a hash of the canonical JSON of everything that
determines it (its config with defaults, and the keys or fingerprints of its inputs). Data
is reused when its dataset.json records the same config; a base model only when it loads
(which checks its files against its fingerprint) with the fingerprint recorded when it was
built; the store by extract itself (a complete store for the fingerprint does nothing).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from tokweight.report.tables import fixed
from tokweight.store.durable import write_json_atomic
from tokweight.store.fingerprint import canonical_json
from tokweight.training.experiments.task import Setting, TaskConfig, base_config, synth_config

Echo = Callable[[str], None]


def key_of(obj) -> str:
    """12 hex digits of sha256 over canonical JSON; refuses what JSON cannot hold."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()[:12]


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


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


def prepare_data(task: TaskConfig, setting: Setting, root: Path) -> tuple[Path, str, dict, bool]:
    """(directory, key, dataset.json, reused)."""
    from tokweight.pipeline.synth import write_dataset

    cfg = synth_config(task, setting)
    spec = json.loads(json.dumps(asdict(cfg)))
    key = key_of(spec)
    path = root / "data" / f"{setting.name}-{key}"
    info = read_json(path / "dataset.json")
    if info is not None and info.get("config") == spec:
        return path, key, info, True
    return path, key, write_dataset(cfg, path, overwrite=True), False


def base_key(task: TaskConfig, data_key: str) -> str:
    """The base config without its paths, and the data's key in place of its directory."""
    config = {k: v for k, v in asdict(task.base).items() if k not in ("data", "out")}
    return key_of({**config, "data": data_key})


def prepare_base(task: TaskConfig, setting: Setting, data: Path, data_key: str, root: Path) -> tuple[Path, dict, bool]:
    """(checkpoint directory, train-base result with fingerprint, reused)."""
    from tokweight.training.train_base import run as train_base

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
    from tokweight.pipeline.checkpoint import load_checkpoint

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


def setting_stats(setting: Setting, info: dict, store: Path, base_result: dict) -> dict:
    """The settings table's row: T/(t0+1) by the generator and by inspection, and the base model's quality."""
    return {"setting": setting.name, "header_len": setting.header_len, "min_len": setting.min_len,
            "max_len": setting.max_len, "mean_T": info["stats"]["mean_T"], "mean_t0": info["stats"]["mean_t0"],
            "ratio_true": info["stats"]["mean_T_over_t0p1"],
            **inspection_estimate(store, base_result["fingerprint"]),
            "base_fingerprint": base_result["fingerprint"], "base_val_nll": base_result.get("val_nll"),
            "base_b_at_t0": base_result.get("b_at_t0"), "base_b_after_t0": base_result.get("b_after_t0"),
            "log_consistent_at_t0": base_result.get("log_consistent_at_t0"),
            "base_wall_s": base_result.get("wall_s")}


def prepare_setting(task: TaskConfig, setting: Setting, root: Path, echo: Echo) -> Prepared:
    from tokweight.pipeline.extract import ExtractConfig
    from tokweight.pipeline.extract import run as extract

    start = time.perf_counter()
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
    return Prepared(setting, data, data_key, base, base_result["fingerprint"], store, stats)


def prepare_all(task: TaskConfig, root: Path, echo: Echo, names: tuple[str, ...] = ()) -> dict[str, Prepared]:
    chosen = [s for s in task.settings if not names or s.name in names]
    return {s.name: prepare_setting(task, s, root, echo) for s in chosen}
