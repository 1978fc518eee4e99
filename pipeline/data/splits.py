"""A dataset's splits: the shards of ``data/<split>/`` for a local dataset, of the URLs whose names begin with
``<split>/`` for one by URL, and the root shards are named relative to (``data_root``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterable

from tokweight.pipeline.data.shards import dataset_json, resolve_shards, shard_name
from tokweight.pipeline.data.urls import is_url_data


@lru_cache(maxsize=8)
def data_root(data: str) -> str:
    """What shards of ``data`` are named relative to: a local dataset itself, or the root of its URLs."""
    return resolve_shards(data)[0] if is_url_data(data) else data


def split_urls(data: str | Path, split: str) -> tuple[str, ...]:
    """Shard paths of split ``split`` of dataset ``data`` (``data/<split>/``); ValueError listing the splits there are.

    The splits are the subfolders that hold shards, and those dataset.json lists (convert
    lists a split a small file left empty). A folder with no such subfolder (shards at its
    top, as convert wrote before it split) or a glob is every split at once. URLs split
    alike by the first folder of their names (``.../train/shard-000000.tar``, ``.../val/...``).
    """
    if is_url_data(data):
        return _split_of_urls(data, split)
    root = Path(data)
    subdirs = [d.name for d in root.iterdir() if d.is_dir() and any(d.rglob("*.tar"))] if root.is_dir() else []
    if not subdirs:
        return tuple(str(p) for p in resolve_shards(data)[1])
    _check_split(data, split, subdirs)
    return tuple(str(p) for p in resolve_shards(root / split)[1])


def _check_split(data: str | Path, split: str, found: Iterable[str]) -> None:
    """ValueError unless ``split`` is among the splits found or those dataset.json lists."""
    listed = (dataset_json(data) or {}).get("splits", {})
    names = sorted({*listed, *found}, key=lambda name: ({"train": 0, "val": 1, "test": 2}.get(name, 3), name))
    if split not in names:
        raise ValueError(f"{data} has no split {split!r}: its splits are {', '.join(names)}; pass one of them")


def _split_of_urls(data: str | Path, split: str) -> tuple[str, ...]:
    root, urls = resolve_shards(data)
    folders = {url: name.split("/")[0] for url in urls if "/" in (name := shard_name(root, url))}
    if not folders:
        return tuple(urls)
    _check_split(data, split, folders.values())
    chosen = tuple(url for url, folder in folders.items() if folder == split)
    if not chosen:
        raise FileNotFoundError(f"no shard URLs of split {split!r} in {data}: dataset.json lists it, but it is empty")
    return chosen
