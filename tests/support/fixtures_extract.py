"""Session-scoped data, checkpoints and a reference store for the extraction and store tests."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tokweight.pipeline.models.checkpoint import load_checkpoint, save_checkpoint
from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run
from tokweight.config_files import preset_config
from tokweight.pipeline.data.config import SynthConfig
from tokweight.pipeline.data.synth import write_dataset
from tokweight.training.config.base import BaseTrainConfig
from tokweight.training.loop.train_base import run as train_base


@dataclass(frozen=True)
class World:
    data: Path  # tiny preset: train 4 shards, val 1, test 1, 128 samples each
    ckpt: Path  # 30-step base model
    ckpt_other: Path  # the same model with one bias nudged: another fingerprint
    store: Path  # a finished Parquet store of ckpt over data (do not modify: copy it)

    def config(self, store: Path, **overrides) -> ExtractConfig:
        """In-process reading unless overridden: a reader process costs ~2 s to start, per run."""
        return ExtractConfig(**{"checkpoint": str(self.ckpt), "data": str(self.data), "store": str(store),
                                "progress": False, "reader_process": False, **overrides})


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("extract")
    write_dataset(preset_config(SynthConfig, "synth", "tiny", seed=0), root / "data")
    train_base(preset_config(BaseTrainConfig, "base", "tiny", data=str(root / "data"), out=str(root / "base"),
                             steps=30))
    ckpt = load_checkpoint(root / "base")
    with torch.no_grad():
        ckpt.model.ln_f.bias[0] += 1e-3
    save_checkpoint(root / "other", ckpt.model, ckpt.vocab)
    w = World(root / "data", root / "base", root / "other", root / "store")
    run(w.config(w.store))
    return w


def fp_dir(store: Path) -> Path:
    (directory,) = [p for p in Path(store).iterdir() if p.name.startswith("fingerprint=")]
    return directory


def part_bytes(store: Path) -> dict[str, bytes]:
    """Every committed part's bytes (Parquet stores), by name."""
    directory = fp_dir(store)
    manifest = json.loads((directory / "manifest.json").read_text())
    return {p["name"]: (directory / p["name"]).read_bytes() for p in manifest["parts"]}


def store_files(store: Path) -> dict[str, bytes]:
    """Every file of a store root by relative path (the lock file aside: it holds the last writer's pid)."""
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(Path(store).rglob("*"))
            if p.is_file() and p.name != ".lock"}


def writes_of_extraction(parts: int) -> dict[str, int]:
    """Durable writes (store.faults) of an extraction of ``parts`` parts into an empty store, 1-based: part i's
    bytes are write 2i + 1 (Parquet: one; a Zarr part counts one per file), its journal record 2i + 2, the
    manifest the last."""
    return {**{f"part-{i:05d}": 2 * i + 1 for i in range(parts)},
            **{f"record-{i:05d}": 2 * i + 2 for i in range(parts)}, "manifest": 2 * parts + 1}


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def write_raw_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A tar with exactly these members (name, payload), reproducible (mtime 0)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(payload), 0, 0o644
            tar.addfile(info, io.BytesIO(payload))
    return path


def sample_member(key: str, record) -> tuple[str, bytes]:
    payload = record if isinstance(record, bytes) else json.dumps(record).encode()
    return f"{key}.json", payload
