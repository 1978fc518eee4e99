"""Stage one's plan: the store's resume state (``store.resume``: which parts are intact, which part
name each other shard gets), and the work rank 0 hands out: shard i of the run to rank i % world,
with the keys each shard must skip.

Keys are unique across the run's shards, not only inside one; a key found again in a later
shard (in name order) is an error naming both shards, or under 'skip' a skipped
'duplicate-key' of the later shard's task; the first occurrence is kept.

Local shards: rank 0 hashes every tar and reads every shard's member names before any rank
starts (``cross_shard_duplicates``), so the check is global under torchrun and does not
depend on which rank reads which shard.

URLs are read once, by the rank that extracts them, so no shard's keys are known before it
is read. The check runs twice instead, over the keys each part holds: as each rank's shards
arrive in order (``later_occurrences`` over the keys read so far: an error before the later
part is written, or under 'skip' the later shard read again without those keys), and on rank
0 before the commit over every part of the run in name order (``part_keys``), which finds
what the ranks could not see of each other and what an interrupted run wrote; a later
shard found there is extracted again by rank 0 without its duplicates, and nothing is
committed before. A journaled URL part of an interrupted run counts only if its URL
still streams the bytes it was made of (``verify_journaled``).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.data.shards import resolve_shards, sample_keys, scan_shard, shard_name
from tokweight.pipeline.extract.config import Retry
from tokweight.pipeline.data.urls import fetch, is_url_data
from tokweight.store.manifest import Record, load_manifest
from tokweight.store.parts import read_part
from tokweight.store.resume import resume
from tokweight.store.writer import InputShard, hash_inputs, url_inputs

FETCH_THREADS = 8  # URLs streamed at once to check an interrupted run's journaled parts


@dataclass(frozen=True)
class Task:
    """An input shard and the part it maps to; ``rank`` is the rank that writes it if needed."""

    shard: InputShard
    part: str
    rank: int
    duplicates: dict[str, str] = field(default_factory=dict)  # key -> the earlier shard that has it: skipped here


@dataclass
class Plan:
    tasks: list[Task]  # parts to write, each with its rank
    done: list[Record] = field(default_factory=list)  # records of this run's inputs already on disk
    carried: list[Record] = field(default_factory=list)  # committed records of inputs not in this run
    committed: bool = False  # every input of this run is in the committed manifest and verified
    changed: list[Record] = field(default_factory=list)  # journaled URL parts whose URL now streams other bytes


def run_inputs(data: str) -> tuple[Path | str, list[InputShard]]:
    """(data root, this run's inputs in name order): local tars hashed (``hash_inputs``), URLs unread."""
    root, found = resolve_shards(data)
    named = {shard_name(root, location): location for location in found}
    return root, url_inputs(named) if is_url_data(data) else hash_inputs(named)


def where(shard: InputShard | Record) -> str:
    """A shard as errors name it: its name, and its URL if it has one."""
    entry = shard.input if isinstance(shard, Record) else shard
    return entry.name if entry.url is None else f"{entry.name} ({entry.url})"


def later_occurrences(first: dict[str, str], name: str, keys: Iterable[str], policy: str) -> dict[str, str]:
    """{key: the earlier shard} for the keys of shard ``name`` that ``first`` (key -> the first shard that has
    it, updated here) already holds; under 'error' the first such key raises, naming both shards."""
    later = {}
    for key in keys:
        earlier = first.setdefault(key, name)
        if earlier == name:
            continue
        if policy == "error":
            raise SampleError("duplicate-key", f"key {key!r} occurs in shards {earlier} and {name}", key=key,
                              shard=name)
        later[key] = earlier
    return later


def cross_shard_duplicates(shards: list[InputShard], policy: str) -> dict[str, dict[str, str]]:
    """{shard name: {key: the earlier shard's name}} for keys that an earlier shard of the run has too,
    from the local tars' headers (``later_occurrences``). A truncated shard has no keys here: it raises
    when it is read (or is skipped whole under 'skip')."""
    first: dict[str, str] = {}  # key -> the first shard (in the run's order) that has it
    later = {shard.name: later_occurrences(first, shard.name, _keys_of(shard, policy), policy) for shard in shards}
    return {name: keys for name, keys in later.items() if keys}


def _keys_of(shard: InputShard, policy: str) -> list[str]:
    """The shard's sample keys from its tar headers; none for a truncated shard under 'skip'."""
    try:
        members = scan_shard(shard.path, shard.name)
    except SampleError:
        if policy == "error":
            raise
        return []
    return sample_keys([m.name for m in members])


def skip_duplicates(tasks: list[Task], duplicates: dict[str, dict[str, str]]) -> list[Task]:
    """The tasks, each with the keys of its shard that an earlier shard has (``cross_shard_duplicates``)."""
    return [replace(task, duplicates=duplicates.get(task.shard.name, {})) for task in tasks]


def part_keys(directory: Path, fmt: str, record: Record) -> list[str]:
    """The keys of the rows a record's part holds (none for a shard skipped whole)."""
    if record.part is None:
        return []
    return read_part(directory / record.part.name, fmt, ["key"]).column("key").to_pylist()


def url_duplicates(directory: Path, fmt: str, records: list[Record], policy: str) -> dict[str, dict[str, str]]:
    """``cross_shard_duplicates`` for URL inputs, from the keys of their parts (``records``: one per input of
    the run), the shards named with their URLs. Parts that the committed manifest lists come first, never
    later: a committed part is not rewritten under its readers; the others follow in name order."""
    manifest = load_manifest(directory)
    committed = {p.name: p.sha256 for p in manifest.parts} if manifest is not None else {}

    def listed(record: Record) -> bool:
        return record.part is not None and committed.get(record.part.name) == record.part.sha256

    first: dict[str, str] = {}
    for record in filter(listed, records):
        later_occurrences(first, where(record), part_keys(directory, fmt, record), "skip")
    later = {r.input.name: later_occurrences(first, where(r), part_keys(directory, fmt, r), policy)
             for r in sorted(records, key=lambda r: r.input.name) if not listed(r)}
    return {name: keys for name, keys in later.items() if keys}


def verify_journaled(records: list[Record], retry: Retry) -> set[str]:
    """The URLs among ``records`` (an interrupted run's journal) whose bytes still have the recorded size
    and sha256, each streamed once (a few at a time)."""
    def same(record: Record) -> bool:
        fetched = fetch(record.input.url, retry)
        return (fetched.size, fetched.sha256) == (record.input.size, record.input.sha256)

    with ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="extract-verify") as pool:
        return {r.input.url for r, ok in zip(records, pool.map(same, records)) if ok}


def make_plan(directory: Path, shards: list[InputShard], fmt: str, world: int,
              retry: Retry | None = None) -> Plan:
    """Which of this run's shards still need a part (``store.resume``), each given to rank i % world.

    retry: how journaled URL parts are checked (``verify_journaled``); None trusts them unread.
    """
    verify = None if retry is None else (lambda records: verify_journaled(records, retry))
    state = resume(directory, shards, fmt, verify)
    return Plan(tasks=[Task(shards[i], name, rank=i % world) for i, name in state.todo], done=state.done,
                carried=state.carried, committed=state.committed, changed=state.changed)

