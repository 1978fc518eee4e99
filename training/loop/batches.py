"""Training data: WebDataset shards -> (store join) -> encoded examples -> TrainBatch.

A stream is a chain of generator stages, each ``Iterator[A] -> Iterator[B]``; the first
three run per shard (``shard_examples``):

    shard url  -> (url, Sample)                       pipeline.data.shards.iter_shard (a URL fetched once, its
                                                      bytes checked against the store's sha256)
               -> (url, Sample, stored row | None)    join_store: by (__url__, __key__), before any shuffle
               -> Example                             encode: templates, T and echoed-id checks
               -> Example (shuffled)                  shuffle (seeded)
               -> Example (in runs of similar length) bucketed (training, where asked; seeded)
               -> TrainBatch                          batched + collate_examples

Bad samples follow one rule in every stage (``BadSamples``): what extraction skipped, as the
store's manifest records it (a tar skipped whole, or keys per reason), is skipped here too,
whatever the stream's policy; any other bad sample raises a SampleError naming its key and
the shard (relative to the dataset root, as extraction names it), or under the policy
'skip' is left out. Skips are counted per shard and reason (``pipeline.data.errors.Skips``).

The training stream over these stages (lanes, ranks, workers) is ``stream.py``.
"""

from __future__ import annotations

import random
import shlex
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import dataset_json, iter_shard, resolve_shards, shard_name
from tokweight.pipeline.tokens.templates import Batch, Layout, check_length, collate, s_targets, template_ids, to_device
from tokweight.pipeline.extract.config import Retry
from tokweight.pipeline.data.urls import ShardChangedError, fetch, is_url, is_url_data
from tokweight.pipeline.tokens.vocab import Vocab, checkpoint_vocab


class StoreMismatchError(ValueError):
    """A sample and the baseline store disagree; the message names key, shard, fingerprints and ``REMEDY``."""


REMEDY = "extract a fresh store for this checkpoint and data (tokweight extract --store NEW_DIR)"


# ---------------------------------------------------------------- store side


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


# ---------------------------------------------------------------- examples


@dataclass(frozen=True)
class Example:
    """One sample in both templates; ``b`` (T,) float32 nats over S when joined with the store."""

    key: str
    url: str
    zfree: tuple[int, ...]
    zcond: tuple[int, ...]  # latent slots hold a placeholder, written per copy by the CVAE
    layout: Layout  # of the z-conditioned sequence; its ``zfree`` is the z-free one
    strategy: str | None
    t0: int | None
    b: np.ndarray | None = field(default=None, compare=False)


def encode(items: Iterable[tuple], vocab: Vocab, slots: int, block_size: int,
           fingerprints: tuple[str, str] | None = None, on_error: BadSamples | None = None) -> Iterator[Example]:
    """(url, Sample[, row]) -> Example, checking T and the echoed S token ids of every stored row.

    fingerprints: (store, baseline) named in errors. on_error: gets an unknown symbol or a too-long
    sequence (None: they raise); errors name its shard, else the url.
    """
    placeholder = [vocab.latent_id(0)] * slots
    for url, sample, *row in items:
        try:
            zfree, free_layout = template_ids(vocab, sample.x, sample.y, key=sample.key)
            zcond, layout = template_ids(vocab, sample.x, sample.y, placeholder, key=sample.key)
            check_length(len(zcond), block_size, key=sample.key)
        except SampleError as error:
            if on_error is None:
                raise
            on_error(error)
            continue
        b = None
        if row and row[0] is not None:
            shard = url if on_error is None else on_error.shard
            b = _checked_b(row[0], s_targets(zfree, free_layout), sample.key, shard, fingerprints)
        yield Example(sample.key, url, tuple(zfree), tuple(zcond), layout, sample.strategy, sample.t0, b)


def _checked_b(row: dict, targets: list[int], key: str, shard: str, fingerprints) -> np.ndarray:
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


@dataclass(frozen=True)
class Widths:
    """Where a step slices its batch, as host ints counted from the examples when the batch is built, so that
    the step reads nothing back from the device (SPEC §6: a step that does not log makes no host sync)."""

    prefix: int  # the longest shared prefix <bos> <x> x </x>, the tokens before <z>: max z_pos
    free_suffix: int  # the longest z-free sequence past its prefix: max(len(zfree) - z_pos)
    cond_suffix: int  # the longest z-conditioned sequence past its prefix: max(len(zcond) - z_pos)

    @classmethod
    def of(cls, examples: Sequence[Example]) -> Widths:
        z_pos = [ex.layout.z_pos for ex in examples]
        return cls(max(z_pos), max(len(ex.zfree) - z for ex, z in zip(examples, z_pos)),
                   max(len(ex.zcond) - z for ex, z in zip(examples, z_pos)))


@dataclass(frozen=True)
class TrainBatch:
    """A batch in both templates. Per-token tensors are (B, T_max) over S.

    zfree, zcond: templates.Batch (input_ids, logit_pos, targets, mask; s_tokens); same targets and mask.
    z_pos:     (B,) position before the first slot in zcond (<z>): its logits are the discrete prior
    slot_pos:  (B, M) positions of the latent slots in zcond
    last_pos:  (B,) last position of the z-free sequence (<eos>, the template's tail): the posterior reads it
    b:         (B, T_max) float32 nats over S from the store, 0 where masked; None without a store
    t0:        (B,) long ground-truth t0, -1 where unknown
    widths:    host ints: where a step slices the tensors (``Widths``)
    """

    zfree: Batch
    zcond: Batch
    z_pos: torch.Tensor
    slot_pos: torch.Tensor
    last_pos: torch.Tensor
    b: torch.Tensor | None
    t0: torch.Tensor
    keys: tuple[str, ...]
    urls: tuple[str, ...]
    strategies: tuple[str | None, ...]
    widths: Widths

    def __len__(self) -> int:
        return len(self.keys)

    def to(self, device) -> "TrainBatch":
        """The batch on ``device``. To a GPU through pinned host memory, without blocking: the host goes on
        queueing the step's kernels while the copies run, and nothing waits for them but those kernels."""
        move = lambda t: None if t is None else to_device(t, device)
        return TrainBatch(self.zfree.to(device), self.zcond.to(device), move(self.z_pos), move(self.slot_pos),
                          move(self.last_pos), move(self.b), move(self.t0), self.keys, self.urls, self.strategies,
                          self.widths)


def collate_examples(examples: Sequence[Example]) -> TrainBatch:
    layouts = [ex.layout for ex in examples]
    zfree = collate([ex.zfree for ex in examples], [lay.zfree for lay in layouts])
    zcond = collate([ex.zcond for ex in examples], layouts)
    b = stored_b(examples, zfree.mask.shape) if all(ex.b is not None for ex in examples) else None
    return TrainBatch(
        zfree=zfree, zcond=zcond,
        z_pos=torch.tensor([lay.z_pos for lay in layouts]),
        slot_pos=torch.tensor([list(lay.slot_positions) for lay in layouts]),
        last_pos=torch.tensor([len(ex.zfree) - 1 for ex in examples]),
        b=b, t0=torch.tensor([-1 if ex.t0 is None else ex.t0 for ex in examples]),
        keys=tuple(ex.key for ex in examples), urls=tuple(ex.url for ex in examples),
        strategies=tuple(ex.strategy for ex in examples), widths=Widths.of(examples))


def stored_b(examples: Sequence[Example], shape: tuple[int, int]) -> torch.Tensor:
    """(B, T_max) float32 nats over S, 0 past each row's T: rows copied in numpy, one tensor made at the end
    (a tensor per row cost ten times more)."""
    b = np.zeros(shape, dtype=np.float32)
    for i, ex in enumerate(examples):
        b[i, : len(ex.b)] = ex.b
    return torch.from_numpy(b)


# ---------------------------------------------------------------- generic stages


def shuffle(items: Iterable, buffer: int, rng: random.Random) -> Iterator:
    """Reservoir shuffle with a seeded rng; buffer <= 1 passes items through."""
    pool = []
    for item in items:
        if len(pool) < buffer:
            pool.append(item)
            continue
        i = rng.randrange(buffer)
        yield pool[i]
        pool[i] = item
    rng.shuffle(pool)
    yield from pool


def bucketed(items: Iterable[Example], batch: int, batches: int, rng: random.Random) -> Iterator[Example]:
    """Stage: the examples in runs of ``batch`` of similar lengths. ``batches`` runs' worth are taken at a time,
    sorted (stably) by the z-conditioned sequence's length and then the prefix's (<z>'s position), cut into runs
    of ``batch``, and the runs handed out in an order drawn from ``rng``; a consumer that takes ``batch`` examples
    at a time gets one run, whose sequences pad to about one length. Every example is handed out once; a finite
    stream's last take may be short."""
    it = iter(items)
    while pool := list(islice(it, batch * batches)):
        pool.sort(key=lambda ex: (len(ex.zcond), ex.layout.z_pos))
        runs = [pool[i: i + batch] for i in range(0, len(pool), batch)]
        rng.shuffle(runs)
        for run in runs:
            yield from run


def batched(items: Iterable[Example], batch_size: int, *, partial: bool) -> Iterator[TrainBatch]:
    it = iter(items)
    while chunk := list(islice(it, batch_size)):
        if len(chunk) < batch_size and not partial:
            return
        yield collate_examples(chunk)


# ---------------------------------------------------------------- datasets (picklable, built inside workers)


@dataclass(frozen=True)
class StreamSpec:
    """What a loader worker needs to rebuild its stream (plain, picklable values)."""

    urls: tuple[str, ...]
    vocab: Vocab
    slots: int
    block_size: int
    batch_size: int
    store: StoreRef | None = None
    seed: int = 0
    shuffle_buffer: int = 256
    length_buckets: int = 0  # a training lane's batches drawn at a time and bucketed by length (``bucketed``); 0: off
    lanes: int = 1
    root: str | None = None  # the dataset (its root, or the --data that gave its URLs) shards are named relative to
    on_bad_sample: str = "error"  # a bad sample the store does not record as skipped: "error" or "skip"
    retry: Retry = Retry()  # how a URL that fails transiently is retried

    def __post_init__(self):
        if self.on_bad_sample not in ("error", "skip"):
            raise ValueError(f"on_bad_sample must be 'error' or 'skip', got {self.on_bad_sample!r}")


def open_store(spec: StreamSpec):
    return None if spec.store is None else spec.store.open(spec.vocab)


def shard_label(spec: StreamSpec, view, url: str) -> str:
    """The shard's name in errors and counts, as extraction names it: its path relative to ``spec.root``;
    without a root, the store's name for it (relative to the root extraction read); else the url."""
    try:
        if spec.root is not None:
            return shard_name(data_root(spec.root), url)
        if view is not None:
            return view.input_for_shard(url)["name"]
    except (ValueError, KeyError):  # not below the root, or not in the store (joining it raises)
        pass
    return url


@lru_cache(maxsize=8)
def data_root(data: str) -> str:
    """What shards of ``data`` are named relative to: a local dataset itself, or the root of its URLs."""
    return resolve_shards(data)[0] if is_url_data(data) else data


def read_bytes(spec: StreamSpec, url: str, stored: StoredShard | None) -> tuple[bytes | None, int]:
    """(a URL's bytes, fetched once, or None for a local tar; the shard's size). A URL whose bytes are not
    those its stored part was made of is a StoreMismatchError naming it."""
    if not is_url(url):
        return None, Path(url).stat().st_size
    try:
        fetched = fetch(url, spec.retry, None if stored is None else stored.digest)
    except ShardChangedError as error:
        raise StoreMismatchError(f"{error}; its stored rows are not this shard's: {REMEDY}") from None
    return fetched.data, fetched.size


def shard_examples(spec: StreamSpec, view, url: str, name: str) -> tuple[list[Example], dict[str, int], int]:
    """One shard (``name``: its ``shard_label``) read, joined with the store (``view``, None without one) and
    encoded: (its examples in file order, the samples left out per reason, the shard's bytes). A bad sample
    raises SampleError, or is skipped (``BadSamples``); a URL that cannot be read raises FetchError."""
    stored = None if view is None else stored_shard(view, url, spec.store.fingerprint)
    if stored is not None and stored.whole is not None:
        return [], {stored.whole: 1}, 0
    data, size = read_bytes(spec, url, stored)
    bad = BadSamples(name, spec.on_bad_sample, None if stored is None else stored.skipped)
    samples = iter_shard(url, on_error=bad, name=name, data=data)  # (url, Sample); bad samples go to ``bad``
    try:
        examples = list(_encoded(spec, view, stored, bad, samples))
    except SampleError as error:  # a truncated tar raises whatever the handler says
        if error.reason != "truncated-shard" or spec.on_bad_sample == "error":
            raise
        return [], {error.reason: 1}, size
    return examples, dict(bad.counts), size


def kept_samples(spec: StreamSpec, n: int) -> list[Sample]:
    """The split's first ``n`` samples that the streams keep (``shard_examples``' rule, so never one that
    extraction or the policy skipped), in shard order: what evaluation decodes."""
    view, kept = open_store(spec), []
    for url in spec.urls:
        if len(kept) >= n:
            break
        examples, _, _ = shard_examples(spec, view, url, shard_label(spec, view, url))
        keys = {ex.key for ex in examples}
        if keys:  # read again for the samples themselves: bad ones are known to be left out
            samples = iter_shard(url, on_error=lambda error: None, retry=spec.retry)
            kept += [s for _, s in samples if s.key in keys][: n - len(kept)]
    return kept


def _encoded(spec: StreamSpec, view, stored: StoredShard | None, bad: BadSamples, items) -> Iterator[Example]:
    if stored is None:
        return encode(items, spec.vocab, spec.slots, spec.block_size, on_error=bad)
    fps = (view.fingerprint, spec.store.fingerprint)
    return encode(join_store(items, stored, bad), spec.vocab, spec.slots, spec.block_size, fps, bad)


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
