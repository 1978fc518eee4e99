"""The store side of a training or eval stream: which store rows a stream joins (``StoreRef``), one shard's rows
(``stored_shard``), the join by key (``join_store``), each row's checks against its sample (``checked_b``) and the
one rule for bad samples (``BadSamples``). A sample and its row that disagree raise ``StoreMismatchError``, naming
the key, the shard, both fingerprints and ``REMEDY``."""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.urls import is_url
from tokweight.pipeline.tokens.vocab import Vocab, checkpoint_vocab


class StoreMismatchError(ValueError):
    """A sample and the baseline store disagree; the message names key, shard, fingerprints and ``REMEDY``."""


REMEDY = "extract a fresh store for this checkpoint and data (tokweight extract --store NEW_DIR)"



@dataclass(frozen=True)
class StoreRef:
    """Which store rows to join, and the fingerprint they must have been computed with."""

    root: str
    """Store root (holding ``fingerprint=<fp>/`` folders)."""
    fingerprint: str
    """The baseline checkpoint's fingerprint; the store must hold exactly this one."""

    def open(self, vocab: Vocab | None = None):
        from tokweight.store.baseline_store import BaselineStore

        store = BaselineStore(self.root)
        found = store.fingerprints()
        if self.fingerprint not in found:
            raise StoreMismatchError(
                f"store {self.root} holds fingerprints {found or '(none)'}, not the baseline checkpoint's "
                f"{self.fingerprint}: its b was computed by another model (extract it for this checkpoint)")
        view = store.open(self.fingerprint)
        if not view.manifest.get("complete", False):
            raise StoreMismatchError(f"store {view.dir} is incomplete (manifest complete=false): finish extraction")
        if vocab is not None and list(view.vocab_tokens()) != list(checkpoint_vocab(vocab).tokens):
            raise StoreMismatchError(f"store {view.dir} was written with another vocabulary than the checkpoint's")
        return view


def shards_without_rows(view, urls: Iterable[str]) -> list[str]:
    """The shards that have no rows in the store view (never extracted, or changed since); a shard that
    extraction skipped whole is not missing: the streams skip it too."""
    return [url for url in urls if not view.has_rows_for(url) and view.skipped_whole(url) is None]


def extract_command(checkpoint: str, data: str, store: str) -> str:
    """The command that adds the missing shards' rows to the store (committed parts are kept)."""
    return f"tokweight extract --checkpoint {checkpoint} --data {shlex.quote(str(data))} --store {store}"


@dataclass(frozen=True)
class StoredShard:
    """What the store holds for one input tar: its rows by key, and what extraction skipped in it."""

    rows: dict[str, dict]  # key -> {"T", "b", "target_id"}
    skipped: dict[str, str]  # key -> the reason extraction left it out for
    whole: str | None  # why extraction skipped the whole tar (then no rows); None: it has a part
    where: str  # the store and both fingerprints, for errors
    digest: tuple[int, str] | None = None  # (size, sha256) a URL's bytes must have: those its part was made of


def stored_shard(view, url: str, fingerprint: str) -> StoredShard:
    """The store's side of one tar (a whole part loaded at once); StoreMismatchError if no input has its content."""
    where = f"store {view.dir} (store fingerprint {view.fingerprint}, baseline {fingerprint})"
    try:
        whole = view.skipped_whole(url)
        if whole is not None:
            return StoredShard({}, {}, whole, where)
        rows = view.rows_for_shard(url)
        skipped = view.skipped_keys(url)
        entry = view.input_for_shard(url) if is_url(url) else None
    except KeyError as e:
        raise StoreMismatchError(f"shard {url} has no part in {where}: {e}") from None
    _refuse_nonfinite_b(rows, url, where)
    return StoredShard(rows, skipped, None, where, None if entry is None else (entry["size"], entry["sha256"]))


def _refuse_nonfinite_b(rows: dict[str, dict], shard: str, where: str) -> None:
    """StoreMismatchError naming the first key whose stored b holds NaN or inf: one vectorised test of the
    shard's rows; they are searched one by one only to name the key."""
    if rows and not np.isfinite(np.concatenate([row["b"] for row in rows.values()])).all():
        key = next(key for key, row in rows.items() if not np.isfinite(row["b"]).all())
        raise StoreMismatchError(f"stored b of key {key!r} in shard {shard} holds NaN or inf, in {where}; {REMEDY}")


class BadSamples:
    """One shard's bad samples in a training or eval stream, as one error handler.

    A sample that extraction skipped (``recorded``: key -> reason, from the manifest) is left
    out whatever the policy and counted under extraction's reason, so both stages count the
    same; any other bad sample raises, naming the shard, or under policy 'skip' is counted.
    """

    def __init__(self, shard: str, policy: str, recorded: dict[str, str] | None = None):
        self.shard, self.policy, self.recorded = shard, policy, recorded or {}
        self.counts: Counter = Counter()  # reason -> samples left out

    def __call__(self, error: SampleError) -> None:
        reason = self.recorded.get(error.key)
        if reason is None and self.policy == "error":
            raise error.located(shard=self.shard)
        self.counts[reason or error.reason] += 1

    def skipped_at_extraction(self, key: str) -> bool:
        """Whether a sample without a stored row is one extraction left out (then it is counted)."""
        if key not in self.recorded:
            return False
        self.counts[self.recorded[key]] += 1
        return True


def join_store(items: Iterable[tuple[str, Sample]], stored: StoredShard, bad: BadSamples) -> Iterator[tuple]:
    """Stage (one shard): (url, Sample) -> (url, Sample, row), by key. A sample without a row is one that
    extraction skipped (left out, counted) or a StoreMismatchError."""
    for url, sample in items:
        row = stored.rows.get(sample.key)
        if row is not None:
            yield url, sample, row
        elif not bad.skipped_at_extraction(sample.key):
            raise StoreMismatchError(f"key {sample.key!r} of shard {bad.shard} has no row in {stored.where}; {REMEDY}")


def checked_b(row: dict, targets: list[int], key: str, shard: str, fingerprints) -> np.ndarray:
    """The row's b, (T,) float32 nats, once its T, echoed S token ids and length are the sample's."""
    problem = _misalignment(row, targets)
    if problem is not None:
        raise StoreMismatchError(f"{problem}: key {key!r} in shard {shard} (store fingerprint {fingerprints[0]}, "
                                 f"baseline {fingerprints[1]}); {REMEDY}")
    return row["b"]


def _misalignment(row: dict, targets: list[int]) -> str | None:
    """What differs between a stored row and the sample's S targets, or None. Compared as Python lists:
    np.array_equal and np.isfinite on every row cost more than the rest of the join (a shard's b is
    tested for NaN at once, ``_refuse_nonfinite_b``)."""
    if row["T"] != len(targets):
        return f"stored T={int(row['T'])} but the sample has T={len(targets)}"
    if row["target_id"].tolist() != targets:
        return f"stored S token ids {row['target_id'].tolist()} != the sample's {targets}"
    if len(row["b"]) != len(targets):
        return f"stored b has shape {row['b'].shape}, the sample T={len(targets)}"
    return None
