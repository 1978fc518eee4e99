"""Stage one: per-token baselines b_t of a frozen checkpoint, once, into a fingerprinted store.

Per input shard, a stream of stages:

    read_samples   tar (a local file, or a URL's bytes fetched once) -> Sample, in shard order
                   (bad samples raise or are counted)
    drop_later_occurrences   Sample -> Sample: keys an earlier shard of the run has are duplicates
    encode         Sample -> Encoded: z-free ids, layout, position in the shard (rows tokenized in batches)
    ShardBatches   Encoded -> batches of similar length (pipeline.data.bucketing), collated (numpy)
    score_shard    batches -> b, entropy, top-1 over S, float32, scattered back to shard (score.py)
                   order, + the derived columns (store.derived) -> one PART_SCHEMA table
    extract_part   table -> one part (temp name, fsync, rename) + its journal record (store.writer)

The first four (``prepare_shard``, ``pipeline.extract.prepare``: no torch) run in a reader process
(``pipeline.extract.reader``), started before the checkpoint loads, one or two shards ahead where a
spare CPU makes that pay (``reader_pays``), so that the Python of reading does not compete with the
forward pass for the GIL, else in this process; rows it rendered once are checked against the per-row
rendering here (``TokenizerVocab.verify``) before the shard is scored; parts are written by a
background thread while the next shard is scored.

and around it the store protocol (docs/contract.md §4), written through ``store.writer.StoreWriter``:
rank 0 takes the store lock and plans (``pipeline.extract.plan``: which parts are already
on disk with a matching sha256, which are to be written, under which names); each rank
writes its shards' parts (temp name, fsync, rename) and a journal record per part; rank 0
commits the manifest last. An exception commits nothing; re-running resumes from the journal.
Keys must be unique across shards: local tars are checked before anything is read, URLs as
they are read and again before the commit (``pipeline.extract.plan``).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import torch
from tqdm import tqdm

from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.models.checkpoint import Checkpoint
from tokweight.pipeline.models.dtypes import resolve_dtype
from tokweight.pipeline.extract.plan import (Plan, Task, cross_shard_duplicates, later_occurrences, make_plan,
                                            run_inputs, skip_duplicates, url_duplicates, where)
from tokweight.pipeline.extract.prepare import PreparedShard, prepare_shard
from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.reader import (ReaderProcess, busy_cpus, cpus_per_process, gc_frozen, reader_pays,
                                              reader_threads)
from tokweight.pipeline.ranks import RankFailed, Ranks, rank_device, resolve_device
from tokweight.pipeline.data.urls import is_url_data
from tokweight.pipeline.tokens.templates import TEMPLATE_VERSION, template_option
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.store.lock import StoreLock
from tokweight.store.manifest import Manifest, Provenance, Record
from tokweight.store.resume import remove_temporaries
from tokweight.store.writer import InputShard, StoreWriter, refuse_identical

from tokweight.pipeline.extract.score import score_shard

# ---------------------------------------------------------------- one shard -> one part


def wants_reader(cfg: ExtractConfig) -> bool:
    """Whether this run starts a reader process (before it knows its tasks): ``cfg.reader_process``, or where it
    is None (the default) whether a reader pays here now (``reader_pays``: CPUs, torch threads, device, load)."""
    if cfg.reader_process is not None:
        return cfg.reader_process
    return reader_pays(_device_type(cfg), cpus_per_process(), torch.get_num_threads(), busy_cpus())


def uses_reader_process(cfg: ExtractConfig, tasks: int) -> bool:
    """Whether ``tasks`` shards are read by a reader process: never for one (it is read here at once); else
    ``wants_reader``."""
    return tasks >= 2 and wants_reader(cfg)


def _device_type(cfg: ExtractConfig) -> str:
    return torch.device(resolve_device(cfg.device)).type


def start_reader(cfg: ExtractConfig) -> ReaderProcess | None:
    """A reader process started now, before the checkpoint loads (its start overlaps that), where the run may use
    one; its tokenizer takes the CPUs the forward leaves."""
    if not wants_reader(cfg):
        return None
    return ReaderProcess(reader_threads(_device_type(cfg), cpus_per_process(), torch.get_num_threads()))


def offer_vocab(reader: ReaderProcess | None, ckpt: Checkpoint, cfg: ExtractConfig) -> ReaderProcess | None:
    """The reader process, given what it prepares shards with (the vocabulary without transformers), or None
    (closed) where the vocabulary needs transformers to read (a chat template rendered per row)."""
    if reader is None:
        return None
    vocab = ckpt.vocab.for_reader() if hasattr(ckpt.vocab, "for_reader") else ckpt.vocab
    if vocab is None:
        reader.close()
        return None
    reader.prepare(_preparing(vocab, ckpt.model.cfg.block_size, cfg))
    return reader


def _preparing(vocab, block_size: int, cfg: ExtractConfig) -> Callable[[Task], PreparedShard]:
    return partial(prepare_shard, vocab=vocab, block_size=block_size, policy=cfg.on_bad_sample,
                   batch_tokens=cfg.batch_tokens, retry=cfg.retry)


def prepared_shards(tasks: list[Task], vocab: Vocab, block_size: int, cfg: ExtractConfig,
                    reader: ReaderProcess | None = None) -> Iterator[PreparedShard]:
    """Stage: the rank's tasks, prepared, in order: here, or the first here and the others by the reader process
    (``offer_vocab``) as it sends them; URLs' keys checked across the rank's shards."""
    prepare = _preparing(vocab, block_size, cfg)
    prepared = read_ahead(tasks, prepare, reader) if reader is not None and len(tasks) >= 2 else map(prepare, tasks)
    if tasks and tasks[0].shard.url is not None:
        prepared = unique_across_shards(prepared, prepare, cfg.on_bad_sample)
    yield from prepared


def read_ahead(tasks: list[Task], prepare: Callable[[Task], PreparedShard], reader: ReaderProcess
               ) -> Iterator[PreparedShard]:
    """The first task prepared here while the reader process starts on the others, then those as it sends them."""
    rest = reader.read(tasks[1:])
    yield prepare(tasks[0])
    yield from rest


def unique_across_shards(prepared: Iterator[PreparedShard], prepare: Callable[[Task], PreparedShard],
                         policy: str) -> Iterator[PreparedShard]:
    """Stage (URLs, whose keys are known only once read): a key that an earlier shard of this rank holds
    raises (``later_occurrences``), or under 'skip' the shard is read again (``prepare``) leaving it out:
    rare, and its bytes must not have changed. Keys of other ranks' shards are checked before the commit."""
    first: dict[str, str] = {}  # key -> the first shard (as ``where`` names it) that holds it
    try:
        for shard in prepared:
            keys = [] if shard.rows is None else shard.rows.keys
            later = later_occurrences(first, where(shard.task.shard), keys, policy)
            if later:
                shard = prepare(replace(shard.task, duplicates={**shard.task.duplicates, **later}))
            yield shard
    finally:
        getattr(prepared, "close", lambda: None)()


def extract_part(prepared: PreparedShard, table: pa.Table | None, writer: StoreWriter) -> Record:
    """Write a scored shard's part and its journal record; returns the record.

    A truncated tar under the 'skip' policy gives no part: the input is recorded as
    skipped (whole) so that it is never mistaken for a short shard.
    """
    task = prepared.task
    if table is None:
        return Record(task.shard.entry(None, None, skipped="truncated-shard"), None)
    return writer.write_part(table, task.shard.entry(prepared.in_tar, task.part), prepared.skipped,
                             prepared.skipped_keys)


def provenance(ckpt: Checkpoint, cfg: ExtractConfig, data_root: Path | str) -> Provenance:
    root = data_root if isinstance(data_root, str) else str(data_root.resolve())  # a root URL, or a folder
    return Provenance(template_version=TEMPLATE_VERSION, checkpoint_path=str(Path(cfg.checkpoint).resolve()),
                      model_config=ckpt.model.cfg.to_json(), vocab=tuple(ckpt.vocab.tokens),
                      data_root=root, extract_config=asdict(cfg),
                      template=ckpt.vocab.template.to_json())


# ---------------------------------------------------------------- run


def parts_in(records: list[Record]) -> int:
    """Parts among the records, counted as `store ls` counts them: an input skipped whole has none."""
    return sum(r.part is not None for r in records)


def _plan_on_rank0(cfg: ExtractConfig, directory: Path, ranks: Ranks, lock: StoreLock):
    """(data_root, shards, plan) from rank 0, or the exception it raised, on every rank."""
    result = None
    if ranks.is_main:
        try:
            lock.acquire()
            remove_temporaries(directory)
            root, shards = run_inputs(cfg.data)
            urls = is_url_data(cfg.data)
            plan = make_plan(directory, shards, cfg.format, ranks.world, cfg.retry if urls else None)
            if not plan.committed and not urls:  # keys unique across every rank's shards: one check, here
                plan.tasks = skip_duplicates(plan.tasks, cross_shard_duplicates(shards, cfg.on_bad_sample))
            result = (root, shards, plan)
        except Exception as e:  # every rank must learn that there is no plan
            result = e
    return ranks.broadcast(result)


def _unique_urls(records: list[Record], ckpt: Checkpoint, cfg: ExtractConfig, writer: StoreWriter,
                 device: torch.device) -> list[Record]:
    """This run's records, checked before the commit (rank 0, URLs): two inputs of identical content are
    refused, and a key that an earlier shard's part holds too raises (``url_duplicates``), or under 'skip'
    the later shard is extracted again here without it (read again: its bytes must not have changed)."""
    refuse_identical(r.input for r in records)
    later = url_duplicates(writer.directory, cfg.format, records, cfg.on_bad_sample)
    redone = {}
    for record in (r for r in records if r.input.name in later):
        source = record.input
        shard = InputShard(None, source.name, source.size, source.sha256, source.url)
        task = Task(shard, source.part, 0, later[source.name])
        prepared = prepare_shard(task, ckpt.vocab, ckpt.model.cfg.block_size, cfg.on_bad_sample, cfg.batch_tokens,
                                 cfg.retry)
        table = score_shard(prepared.rows, ckpt.model, device, lambda tokens: None)
        redone[source.name] = extract_part(prepared, table, writer)
    return [redone.get(r.input.name, r) for r in records]


def rank_tasks(plan: Plan, ranks: Ranks) -> list[Task]:
    return [t for t in plan.tasks if t.rank == ranks.rank]


def _write_parts(plan: Plan, ckpt: Checkpoint, cfg: ExtractConfig, writer: StoreWriter, ranks: Ranks,
                 reader: ReaderProcess | None) -> list[Record]:
    """Score this rank's shards; each part is written by a background thread while the next shard is scored."""
    device = ranks.device(cfg.device)
    ckpt.model.to(device).eval()
    mine = rank_tasks(plan, ranks)
    bar = tqdm(desc=f"extract[{ranks.rank}]" if ranks.world > 1 else "extract", unit="tok", unit_scale=True,
               disable=not cfg.progress, position=ranks.rank, mininterval=0.5)
    records: list[Record] = []
    writing: Future | None = None  # at most one part in flight: its errors surface one shard later
    shards = prepared_shards(mine, ckpt.vocab, ckpt.model.cfg.block_size, cfg, reader)
    with gc_frozen(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="extract-write") as background:
        try:
            for prepared in shards:
                if prepared.checks:  # rows the reader process rendered once, rendered alone here: a difference raises
                    ckpt.vocab.verify(prepared.checks)
                table = None if prepared.rows is None else score_shard(prepared.rows, ckpt.model, device, bar.update)
                if writing is not None:
                    records.append(writing.result())
                writing = background.submit(extract_part, prepared, table, writer)
                bar.set_postfix(parts=f"{len(records) + 1}/{len(mine)}")
            if writing is not None:
                records.append(writing.result())
        finally:
            shards.close()
            bar.close()
    return records


def run(cfg: ExtractConfig) -> dict:
    """Extract (or finish extracting) the store for ``cfg.checkpoint`` over ``cfg.data``; returns a summary."""
    t_start = time.perf_counter()
    ranks = Ranks()
    cfg = replace(cfg, dtype=resolve_dtype(cfg.dtype, rank_device(cfg.device, ranks.local_rank)))  # as recorded
    reader = None
    try:
        reader = start_reader(cfg)  # before the checkpoint loads: its start overlaps that
        ckpt = load_backbone(cfg.checkpoint, dtype=cfg.dtype, template=template_option(cfg.template))
        reader = offer_vocab(reader, ckpt, cfg)
        writer = StoreWriter(cfg.store, ckpt.fingerprint, cfg.format)
        directory = writer.directory
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
                        "nothing_to_do": True, "parts_written": 0, "parts_reused": parts_in(plan.done)}
            try:
                outcome = ("ok", _write_parts(plan, ckpt, cfg, writer, ranks, reader))
            except Exception as e:
                outcome = ("error", f"{type(e).__name__}: {e}")
                ranks.gather(outcome)  # the other ranks learn of it and stop at the same point
                raise
            outcomes = ranks.gather(outcome)
            failed = [(r, msg) for r, (status, msg) in enumerate(outcomes) if status == "error"]
            if failed:
                raise RankFailed("; ".join(f"rank {r} failed: {msg}" for r, msg in failed))
            written = [rec for _, recs in outcomes for rec in recs]
            manifest: Manifest | None = None
            if ranks.is_main:
                records = plan.done + written
                if shards and shards[0].url is not None:
                    records = _unique_urls(records, ckpt, cfg, writer, ranks.device(cfg.device))
                manifest = writer.commit(plan.carried + records, provenance(ckpt, cfg, data_root))
        finally:
            lock.release()
        wall = time.perf_counter() - t_start
        tokens = sum(r.part.tokens for r in written if r.part)
        summary = {"fingerprint": ckpt.fingerprint, "store": str(directory), "rank": ranks.rank, "nothing_to_do": False,
                   "parts_written": parts_in(written), "parts_reused": parts_in(plan.done), "wall_s": round(wall, 3),
                   "tokens_written": tokens, "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
                   "reader_process": reader is not None and len(rank_tasks(plan, ranks)) >= 2}
        if not ckpt.vocab.template.builtin:  # how its rows became ids: rendered once, or per row and why
            summary["rendering"] = ckpt.vocab.rendering
        if manifest is not None:
            summary |= {"parts": len(manifest.parts), "stats": manifest.stats(), "skipped": manifest.skipped(),
                        "skipped_shards": manifest.skipped_by_input()}
        if plan.changed:  # journaled URL parts whose URL streams other bytes now: extracted again
            summary["changed_shards"] = [where(r) for r in plan.changed]
        return summary
    finally:
        if reader is not None:
            reader.close()
        ranks.close()
