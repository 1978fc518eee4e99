"""Stage one: per-token baselines b_t of a frozen checkpoint, once, into a fingerprinted store.

Per input shard, a stream of generator stages:

    read_samples   tar -> Sample, in shard order (bad samples raise or are counted)
    encode         Sample -> Encoded: z-free ids, layout, position in the shard
    bucket         Encoded -> batches of similar length (pipeline.bucketing)
    score          batch -> (Encoded, Scores): b, entropy, top-1 over S, float32
    part_table     scores back in shard order -> one PART_SCHEMA table -> one part

Reading and encoding (``load_shard``) run one shard ahead in a background thread
(``prefetch``), so tar parsing overlaps the forward pass when a core is free.

and around it the store protocol (SPEC §4, notes/store_contract.md): rank 0 takes the
store lock and plans (which parts are already on disk with a matching sha256, which are
to be written, under which names); each rank writes its shards' parts (temp name, fsync,
rename) and a journal record per part; rank 0 commits the manifest last. An exception
commits nothing; re-running resumes from the journal.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import torch
from tqdm import tqdm
from webdataset.tariterators import base_plus_ext

from pipeline.bucketing import bucket
from pipeline.errors import SampleError
from pipeline.ranks import RankFailed, Ranks
from pipeline.samples import Sample
from pipeline.shards import iter_shard, resolve_shards, scan_shard, shard_name
from pipeline.templates import (TEMPLATE_VERSION, Batch, Layout, check_length, collate, gather_s, token_surprisal,
                                zfree_ids)
from pipeline.vocab import Vocab
from store.derived import DERIVED_SCALARS, derived_columns
from store.lock import StoreLock
from store.manifest import (TOOL, check_schema_version, fingerprint_dir, part_index, part_name, read_manifest,
                            read_records, record_path, skipped_totals, stats, tool_version, write_json_atomic)
from store.parts import TMP_SUFFIX, part_format, remove_path, sha256_path, write_part
from store.schema import PART_SCHEMA, SCHEMA_VERSION
from training.checkpoint import Checkpoint, load_checkpoint
from training.model import GPT

POLICIES = ("error", "skip")


@dataclass(frozen=True)
class ExtractConfig:
    checkpoint: str
    """Checkpoint directory of the frozen z-free (entangled) base model."""
    data: str
    """Dataset directory (every *.tar below it) or a glob of shards."""
    store: str
    """Store root; parts go to STORE/fingerprint=<checkpoint fingerprint>/."""
    format: str = "parquet"
    """Part format: "parquet" (one row per example, list columns) or "zarr" (flat values + offsets)."""
    batch_tokens: int = 16384
    """Computed tokens per forward batch (batch size x padded length), a memory/speed knob only."""
    device: str = "cpu"
    """Torch device; under torchrun with "cuda" each rank uses cuda:LOCAL_RANK."""
    on_bad_sample: str = "error"
    """"error": stop at the first bad sample or truncated shard, naming shard and key;
    "skip": leave it out and count it per reason in the part entry and the manifest."""
    lock_wait_s: float = 0.0
    """Seconds to wait for another extract holding this store's lock; 0 fails at once."""
    progress: bool = True
    """Show a tqdm bar with tokens/s (S tokens)."""

    def __post_init__(self):
        part_format(self.format)  # raises on an unknown format
        if self.batch_tokens < 1:
            raise ValueError(f"batch_tokens must be >= 1, got {self.batch_tokens}")
        if self.on_bad_sample not in POLICIES:
            raise ValueError(f"on_bad_sample must be one of {POLICIES}, got {self.on_bad_sample!r}")
        if self.lock_wait_s < 0:
            raise ValueError(f"lock_wait_s must be >= 0, got {self.lock_wait_s}")


# ---------------------------------------------------------------- stages


@dataclass(frozen=True)
class Encoded:
    index: int  # position among the shard's kept samples: the row order of the part
    sample: Sample
    ids: list[int]  # z-free template ids
    layout: Layout

    @property
    def scored_length(self) -> int:
        """Tokens the model must see: up to the last position whose logits predict S (not </y> <eos>)."""
        return self.layout.s_logit_positions()[-1] + 1


@dataclass(frozen=True)
class Scores:
    """One example's per-token outputs over S, each (T,)."""

    b: np.ndarray  # float32 nats, -log p(y_t | x, y_<t)
    entropy: np.ndarray  # float32 nats, entropy of the next-token distribution
    top1: np.ndarray  # bool, the target is the argmax
    target_id: np.ndarray  # int32, echoed S token ids


ErrorHandler = Callable[[SampleError], None] | None


def _wds_key(name: str) -> str:
    return base_plus_ext(name)[0]


def tar_keys(names: list[str]) -> tuple[int, dict[str, str]]:
    """(samples in the tar, {dotted key: the key WebDataset makes of it}) from member names.

    A sample is a ``<key>.json`` member (keyed by the name minus ".json"), or a group of
    other members that has no json. WebDataset cuts names at the first dot, so
    ``k.1.json`` would silently become a member "1.json" of sample "k": such keys are
    found here, from the names, before WebDataset regroups them.
    """
    names = [n for n in names if not Path(n).name.startswith("__")]
    json_keys = {n[: -len(".json")] for n in names if n.endswith(".json")}
    grouped = {_wds_key(n) for n in names if n.endswith(".json")}
    others = {_wds_key(n) for n in names if not n.endswith(".json")} - grouped
    dotted = {k: _wds_key(k + ".json") for k in sorted(json_keys) if "." in Path(k).name}
    return len(json_keys) + len(others), dotted


def read_samples(path: Path, shard: str, on_error: ErrorHandler, names: list[str] | None = None) -> Iterator[Sample]:
    """Stage: one shard's valid samples in file order (shards.iter_shard does the per-sample checks).

    names: the tar's member names if the caller has scanned it already (``scan_shard``).
    """
    names = scan_shard(path) if names is None else names
    _, dotted = tar_keys(names)
    for key in dotted:
        error = SampleError("bad-key", "key contains '.', which WebDataset splits on", key=key, shard=shard)
        if on_error is None:
            raise error
        on_error(error)
    residue = set(dotted.values())  # what WebDataset makes of a dotted key: reported above already

    def forward(error: SampleError) -> None:
        if not (error.reason == "missing-field" and error.key in residue):
            on_error(error)

    for _, sample in iter_shard(path, on_error=None if on_error is None else forward, names=names):
        yield sample


def encode(samples: Iterable[Sample], vocab: Vocab, block_size: int, shard: str,
           on_error: ErrorHandler) -> Iterator[Encoded]:
    """Stage: samples -> z-free ids; unknown symbols and too-long sequences are bad samples."""
    index = 0
    for sample in samples:
        try:
            ids = zfree_ids(vocab, sample.x, sample.y, key=sample.key)
            check_length(len(ids), block_size, key=sample.key)
        except SampleError as error:
            error = error.located(shard=shard)
            if on_error is None:
                raise error from None
            on_error(error)
            continue
        yield Encoded(index, sample, ids, Layout(len(sample.x), len(sample.y)))
        index += 1


@torch.inference_mode()
def score_batch(model: GPT, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(b, entropy, top1), each (B, T_max) over S; 0 / False where masked.

    Logits go to float32 before the log-softmax whatever the model's dtype. The input is
    cut after the last position that predicts S: the tail (</y> <eos>) changes nothing.
    """
    length = int(batch.logit_pos.max()) + 1
    logits, _ = model(batch.input_ids[:, :length])
    logits_s = gather_s(logits, batch.logit_pos).float()  # (B, T_max, V)
    b = token_surprisal(logits_s, batch.targets, batch.mask)  # (B, T_max) nats
    log_p = logits_s.log_softmax(dim=-1)
    entropy = -(log_p.exp() * log_p).sum(dim=-1).masked_fill(~batch.mask, 0.0)  # (B, T_max) nats
    top1 = (logits_s.argmax(dim=-1) == batch.targets) & batch.mask
    return b, entropy, top1


def score(batches: Iterable[list[Encoded]], model: GPT, device: torch.device, shard: str,
          on_tokens: Callable[[int], None]) -> Iterator[tuple[Encoded, Scores]]:
    """Stage: batches -> (Encoded, Scores) per example, in batch order. Never yields NaN or inf."""
    for items in batches:
        batch = collate([e.ids for e in items], [e.layout for e in items])
        b, entropy, top1 = (t.cpu().numpy() for t in score_batch(model, batch.to(device)))
        finite = np.isfinite(b) & np.isfinite(entropy)  # masked positions hold 0
        if not finite.all():
            bad = items[int(np.argwhere(~finite)[0, 0])].sample.key
            raise FloatingPointError(f"non-finite surprisal or entropy for key {bad!r} in shard {shard!r}: "
                                     "the checkpoint is broken; nothing was written")
        targets = batch.targets.numpy().astype(np.int32)
        for row, item in enumerate(items):
            T = item.layout.T
            yield item, Scores(b[row, :T], entropy[row, :T], top1[row, :T], targets[row, :T])
        on_tokens(sum(e.layout.T for e in items))


def prefetch(items: Iterable, depth: int = 1) -> Iterator:
    """Stage: the same stream, produced by a background thread up to ``depth`` items ahead.

    Reading and parsing tars is Python (it holds the GIL) while the forward pass runs in
    torch kernels (they release it), so the two overlap. An exception of the producer is
    raised here, at the item where it happened; leaving early stops the producer.
    """
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def put(entry) -> None:
        while not stop.is_set():
            try:
                return slots.put(entry, timeout=0.1)
            except queue.Full:
                continue

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                put((item, None))
            put((end, None))
        except BaseException as error:  # handed to the consumer, raised there
            put((None, error))

    worker = threading.Thread(target=produce, name="extract-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item, error = slots.get()
            if error is not None:
                raise error
            if item is end:
                return
            yield item
    finally:
        stop.set()
        worker.join(timeout=10)


def _flat_list(values: list[np.ndarray], offsets: pa.Array, value_type: pa.DataType) -> pa.Array:
    flat = np.concatenate(values) if values else np.zeros(0)
    return pa.ListArray.from_arrays(offsets, pa.array(flat, type=value_type))


def part_table(shard: str, rows: list[tuple[Encoded, Scores]]) -> pa.Table:
    """Rows (any order) -> one PART_SCHEMA table in shard order."""
    rows = sorted(rows, key=lambda r: r[0].index)
    T = np.array([e.layout.T for e, _ in rows], dtype=np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(T)]).astype(np.int32))
    b = np.concatenate([s.b for _, s in rows]) if rows else np.zeros(0, np.float32)
    derived = derived_columns(b, T)  # cumsum_b and the per-example sums, float64
    columns = {
        "key": pa.array([e.sample.key for e, _ in rows], type=pa.string()),
        "shard": pa.array([shard] * len(rows), type=pa.string()),
        "T": pa.array(T),
        "b": pa.ListArray.from_arrays(offsets, pa.array(b, type=pa.float32())),
        "target_id": _flat_list([s.target_id for _, s in rows], offsets, pa.int32()),
        "entropy": _flat_list([s.entropy for _, s in rows], offsets, pa.float32()),
        "top1": _flat_list([s.top1 for _, s in rows], offsets, pa.bool_()),
        "cumsum_b": pa.ListArray.from_arrays(offsets, pa.array(derived["cumsum_b"], type=pa.float32())),
        **{name: pa.array(derived[name]) for name in DERIVED_SCALARS},
        "strategy": pa.array([e.sample.strategy for e, _ in rows], type=pa.string()),
        "t0": pa.array([e.sample.t0 for e, _ in rows], type=pa.int32()),
    }
    return pa.Table.from_pydict(columns, schema=PART_SCHEMA)


# ---------------------------------------------------------------- one shard -> one part


@dataclass(frozen=True)
class InputShard:
    path: Path
    name: str  # relative to the data root, e.g. "train/shard-000000.tar"
    size: int
    sha256: str

    def entry(self, samples: int | None, part: str | None) -> dict:
        return {"name": self.name, "size": self.size, "sha256": self.sha256, "samples": samples, "part": part}


@dataclass(frozen=True)
class Task:
    """An input shard and the part it maps to; ``rank`` is the rank that writes it if needed."""

    shard: InputShard
    part: str
    rank: int


@dataclass
class LoadedShard:
    """A shard read and encoded (or found truncated, under 'skip'), ready for the model."""

    task: Task
    encoded: list[Encoded]  # file order
    skipped: Counter  # bad samples per reason
    in_tar: int  # samples in the tar: rows + skipped (a duplicate's extra copies are not samples)
    truncated: bool = False


def load_shard(task: Task, vocab: Vocab, block_size: int, policy: str) -> LoadedShard:
    """Read and encode one shard. A truncated tar raises, or under 'skip' is marked whole."""
    skipped: Counter = Counter()
    on_error = None if policy == "error" else (lambda e: skipped.update([e.reason]))
    name = task.shard.name
    try:
        names = scan_shard(task.shard.path)
        samples = read_samples(task.shard.path, name, on_error, names)  # stream: Sample, file order
        encoded = list(encode(samples, vocab, block_size, name, on_error))  # Encoded, file order
    except SampleError as error:
        if error.reason != "truncated-shard" or policy == "error":
            raise
        return LoadedShard(task, [], skipped, 0, truncated=True)
    in_tar, _ = tar_keys(names)
    accounted = len(encoded) + sum(n for r, n in skipped.items() if r != "duplicate-key")
    if accounted != in_tar:
        raise RuntimeError(f"shard {name!r}: {in_tar} samples in the tar but {len(encoded)} read + "
                           f"{accounted - len(encoded)} skipped; refusing to write a part that lacks samples")
    return LoadedShard(task, encoded, skipped, in_tar)


def extract_part(loaded: LoadedShard, ckpt: Checkpoint, cfg: ExtractConfig, directory: Path, device: torch.device,
                 on_tokens: Callable[[int], None]) -> dict:
    """Score a loaded shard, write its part and journal record; returns the record {"input", "part"}.

    A truncated tar under the 'skip' policy gives no part: the input is recorded as
    skipped (whole) so that it is never mistaken for a short shard.
    """
    task, skipped, in_tar = loaded.task, loaded.skipped, loaded.in_tar
    if loaded.truncated:
        return {"input": {**task.shard.entry(None, None), "skipped": "truncated-shard"}, "part": None}
    batches = bucket(loaded.encoded, cfg.batch_tokens, lambda e: e.scored_length)  # list[Encoded], by length
    scored = score(batches, ckpt.model, device, task.shard.name, on_tokens)  # (Encoded, Scores), by length
    table = part_table(task.shard.name, list(scored))  # file order again
    written = write_part(table, directory / task.part, cfg.format)
    part = {"name": task.part, "input": task.shard.name, **written, "rows": len(table),
            "tokens": int(np.sum(table.column("T").to_numpy())),
            "b_sum": float(np.sum(table.column("b_sum").to_numpy())),
            "sum_example_mean_b": sum_example_mean_b(table), "skipped": dict(sorted(skipped.items()))}
    record = {"input": task.shard.entry(in_tar, task.part), "part": part, "fingerprint": ckpt.fingerprint,
              "schema_version": SCHEMA_VERSION}
    write_json_atomic(record_path(directory, task.part), record)
    return record


def sum_example_mean_b(table: pa.Table) -> float:
    """Sum over rows of mean_t b_t (float64): divided by rows, the dataset mean of per-example means."""
    if not len(table):
        return 0.0
    return float(np.sum(table.column("b_sum").to_numpy() / table.column("T").to_numpy()))


# ---------------------------------------------------------------- planning (rank 0, under the lock)


@dataclass
class Plan:
    tasks: list[Task]  # parts to write, each with its rank
    done: list[dict] = field(default_factory=list)  # records {"input", "part"} of this run's inputs already on disk
    carried: list[dict] = field(default_factory=list)  # committed records of inputs not in this run
    committed: bool = False  # every input of this run is in the committed manifest and verified


def hash_inputs(root: Path, paths: list[Path]) -> list[InputShard]:
    shards = []
    for path in paths:
        sha, size = sha256_path(path)
        shards.append(InputShard(path, shard_name(root, path), size, sha))
    seen: dict[tuple, str] = {}
    for s in shards:
        if (s.size, s.sha256) in seen:
            raise ValueError(f"shards {seen[(s.size, s.sha256)]!r} and {s.name!r} have identical content; "
                             "a store matches shards by content, so each input must be distinct")
        seen[(s.size, s.sha256)] = s.name
    return shards


def _committed_records(manifest: dict | None) -> list[dict]:
    if manifest is None:
        return []
    parts = {p["name"]: p for p in manifest["parts"]}
    return [{"input": e, "part": parts.get(e["part"])} for e in manifest["inputs"]]


def _intact(directory: Path, record: dict | None) -> bool:
    """The record's part exists and hashes to what the record says (or the record is a whole-shard skip)."""
    if record is None:
        return False
    if record["part"] is None:
        return record["input"].get("skipped") is not None
    path = directory / record["part"]["name"]
    return path.exists() and sha256_path(path)[0] == record["part"]["sha256"]


def make_plan(directory: Path, shards: list[InputShard], fmt: str, world: int) -> Plan:
    """Which of this run's shards still need a part, and under which name.

    Part names depend only on the committed manifest and this run's inputs (never on
    what an interrupted run finished), so a resumed run, or a run with another number
    of ranks, names every part the same way. Shard i of the run goes to rank i % world.
    """
    manifest = read_manifest(directory)
    if manifest is not None:
        check_schema_version(manifest, directory)
    if manifest is not None and manifest["format"] != fmt:
        raise ValueError(f"{directory} holds {manifest['format']} parts; extract with --format {manifest['format']} "
                         "or into another store")
    committed = {(r["input"]["size"], r["input"]["sha256"]): r for r in _committed_records(manifest)}
    journal = {(r["input"]["size"], r["input"]["sha256"], r["part"]["name"]): r for r in read_records(directory)}
    next_index = 1 + max((part_index(r["part"]["name"]) for r in committed.values() if r["part"]), default=-1)
    suffix = part_format(fmt).suffix
    plan = Plan(tasks=[], committed=True)
    for i, shard in enumerate(shards):
        record = committed.get((shard.size, shard.sha256))
        if record is not None:
            name = record["input"]["part"]
        else:
            plan.committed = False
            name = part_name(next_index, suffix)
            next_index += 1
            record = journal.get((shard.size, shard.sha256, name))
        if _intact(directory, record):
            plan.done.append(record)
        else:
            plan.committed = False
            plan.tasks.append(Task(shard, name, rank=i % world))
    ours = {(s.size, s.sha256) for s in shards}
    plan.carried = [r for key, r in committed.items() if key not in ours]
    return plan


def remove_temporaries(directory: Path) -> None:
    """Leftovers of a killed writer (under the lock nobody else writes them)."""
    for path in directory.glob(f"*{TMP_SUFFIX}"):
        remove_path(path)


# ---------------------------------------------------------------- commit (rank 0)


def build_manifest(ckpt: Checkpoint, cfg: ExtractConfig, data_root: Path, records: list[dict]) -> dict:
    inputs = sorted((r["input"] for r in records), key=lambda e: (e["part"] is None, e["part"] or "", e["name"]))
    parts = sorted((r["part"] for r in records if r["part"] is not None), key=lambda p: p["name"])
    return {
        "tool": TOOL, "tool_version": tool_version(), "schema_version": SCHEMA_VERSION,
        "fingerprint": ckpt.fingerprint, "format": cfg.format, "dtype": "float32", "units": "nats",
        "template_version": TEMPLATE_VERSION,
        "checkpoint": {"path": str(Path(cfg.checkpoint).resolve()), "fingerprint": ckpt.fingerprint,
                       "model_config": ckpt.model.cfg.to_json()},
        "vocab": {"tokens": list(ckpt.vocab.tokens)},
        "data_root": str(data_root.resolve()),
        "inputs": inputs,
        "parts": parts,
        "skipped": skipped_totals(parts, inputs),
        "stats": stats(parts),
        "complete": True,  # written only once every input of the run has a part or a recorded skip
        "extract_config": asdict(cfg),
    }


def commit(directory: Path, manifest: dict) -> None:
    write_json_atomic(directory / "manifest.json", manifest)
    for entry in manifest["parts"]:  # the journal is folded into the manifest now
        record_path(directory, entry["name"]).unlink(missing_ok=True)


# ---------------------------------------------------------------- run


def _device(cfg: ExtractConfig, ranks: Ranks) -> torch.device:
    if cfg.device == "cuda" and ranks.world > 1:
        return torch.device(f"cuda:{ranks.local_rank}")
    return torch.device(cfg.device)


def _plan_on_rank0(cfg: ExtractConfig, directory: Path, ranks: Ranks, lock: StoreLock):
    """(data_root, shards, plan) from rank 0, or the exception it raised, on every rank."""
    result = None
    if ranks.is_main:
        try:
            lock.acquire()
            remove_temporaries(directory)
            root, paths = resolve_shards(cfg.data)
            shards = hash_inputs(root, paths)
            result = (root, shards, make_plan(directory, shards, cfg.format, ranks.world))
        except Exception as e:  # every rank must learn that there is no plan
            result = e
    return ranks.broadcast(result)


def _write_parts(plan: Plan, ckpt: Checkpoint, cfg: ExtractConfig, directory: Path, ranks: Ranks) -> list[dict]:
    device = _device(cfg, ranks)
    ckpt.model.to(device).eval()
    mine = [t for t in plan.tasks if t.rank == ranks.rank]
    bar = tqdm(desc=f"extract[{ranks.rank}]" if ranks.world > 1 else "extract", unit="tok", unit_scale=True,
               disable=not cfg.progress, position=ranks.rank, mininterval=0.5)
    records = []
    loaded = prefetch(load_shard(t, ckpt.vocab, ckpt.model.cfg.block_size, cfg.on_bad_sample) for t in mine)
    try:
        for shard in loaded:  # the next shard is read while this one is scored
            records.append(extract_part(shard, ckpt, cfg, directory, device, bar.update))
            bar.set_postfix(parts=f"{len(records)}/{len(mine)}")
    finally:
        loaded.close()
        bar.close()
    return records


def run(cfg: ExtractConfig) -> dict:
    """Extract (or finish extracting) the store for ``cfg.checkpoint`` over ``cfg.data``; returns a summary."""
    t_start = time.perf_counter()
    ranks = Ranks()
    try:
        ckpt = load_checkpoint(cfg.checkpoint)
        directory = fingerprint_dir(cfg.store, ckpt.fingerprint)
        if ranks.is_main:
            directory.mkdir(parents=True, exist_ok=True)
        lock = StoreLock(directory, wait_s=cfg.lock_wait_s)
        try:
            planned = _plan_on_rank0(cfg, directory, ranks, lock)
            if isinstance(planned, Exception):
                if ranks.is_main:
                    raise planned
                raise RankFailed(f"rank 0 could not plan the extraction: {planned}")
            data_root, shards, plan = planned
            if plan.committed:
                return {"fingerprint": ckpt.fingerprint, "store": str(directory), "rank": ranks.rank,
                        "nothing_to_do": True, "parts_written": 0, "parts_reused": len(plan.done)}
            try:
                outcome = ("ok", _write_parts(plan, ckpt, cfg, directory, ranks))
            except Exception as e:
                outcome = ("error", f"{type(e).__name__}: {e}")
                ranks.gather(outcome)  # the other ranks learn of it and stop at the same point
                raise
            outcomes = ranks.gather(outcome)
            failed = [(r, msg) for r, (status, msg) in enumerate(outcomes) if status == "error"]
            if failed:
                raise RankFailed("; ".join(f"rank {r} failed: {msg}" for r, msg in failed))
            written = [rec for _, recs in outcomes for rec in recs]
            if ranks.is_main:
                commit(directory, build_manifest(ckpt, cfg, data_root, plan.carried + plan.done + written))
        finally:
            lock.release()
        manifest = read_manifest(directory) if ranks.is_main else None
        wall = time.perf_counter() - t_start
        tokens = sum(r["part"]["tokens"] for r in written if r["part"])
        summary = {"fingerprint": ckpt.fingerprint, "store": str(directory), "rank": ranks.rank, "nothing_to_do": False,
                   "parts_written": len(written), "parts_reused": len(plan.done), "wall_s": round(wall, 3),
                   "tokens_written": tokens, "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None}
        if manifest is not None:
            summary |= {"stats": manifest["stats"], "skipped": manifest["skipped"]}
        return summary
    finally:
        ranks.close()
