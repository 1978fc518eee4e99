"""Stage one's plan: which input shards still need a part, and under which name (rank 0, under the lock).

Shards are identified by size and sha256, so a moved dataset still matches its parts and
changed data never does. A part is done when the committed manifest, or the journal of an
interrupted run, names it and the file on disk hashes to the recorded sha256. A manifest
that does not verify (its own checksum) is treated as absent: the journal records, which
commits keep, give back every part of this run's inputs that is intact (the others are
re-extracted), and those of other inputs are carried into the new manifest.

Keys are unique across the run's shards, not only inside one: rank 0 reads every shard's
member names before any rank starts (``cross_shard_duplicates``), so the check is global
under torchrun and does not depend on which rank reads which shard. A key found again in a
later shard (in name order) is an error naming both shards, or under 'skip' a skipped
'duplicate-key' of the later shard's task; the first occurrence is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from tokweight.pipeline.errors import SampleError
from tokweight.pipeline.shards import sample_keys, scan_shard
from tokweight.store.manifest import (Manifest, Record, damaged_manifest, load_manifest, part_index, part_name,
                                      read_records)
from tokweight.store.parts import TMP_SUFFIX, remove_path, sha256_path
from tokweight.store.writer import InputShard


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


def _committed_manifest(directory: Path, fmt: str) -> Manifest | None:
    """The committed manifest, refused if it is of another schema version or format."""
    manifest = load_manifest(directory)
    if manifest is not None and manifest.format != fmt:
        raise ValueError(f"{directory} holds {manifest.format} parts; extract with --format "
                         f"{manifest.format} or into another store")
    return manifest


def _intact(directory: Path, record: Record | None) -> bool:
    """The record's part exists and hashes to what the record says (or the record is a whole-shard skip)."""
    if record is None:
        return False
    if record.part is None:
        return record.input.skipped is not None
    path = directory / record.part.name
    return path.exists() and sha256_path(path)[0] == record.part.sha256


def cross_shard_duplicates(shards: list[InputShard], policy: str) -> dict[str, dict[str, str]]:
    """{shard name: {key: the earlier shard's name}} for keys that an earlier shard of the run has too.

    Under 'error' the first such key raises, naming both shards. A truncated shard has no
    keys here: it raises when it is read (or is skipped whole under 'skip').
    """
    first: dict[str, str] = {}  # key -> the first shard (in the run's order) that has it
    later: dict[str, dict[str, str]] = {}
    for shard in shards:
        for key in _keys_of(shard, policy):
            if key not in first:
                first[key] = shard.name
                continue
            if policy == "error":
                raise SampleError("duplicate-key", f"key {key!r} occurs in shards {first[key]} and {shard.name}",
                                  key=key, shard=shard.name)
            later.setdefault(shard.name, {})[key] = first[key]
    return later


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


def make_plan(directory: Path, shards: list[InputShard], fmt: str, world: int) -> Plan:
    """Which of this run's shards still need a part, and under which name.

    Part names depend only on the committed manifest and this run's inputs (never on
    what an interrupted run finished), so a resumed run, or a run with another number
    of ranks, names every part the same way. Shard i of the run goes to rank i % world.
    """
    damaged = damaged_manifest(directory) is not None
    manifest = None if damaged else _committed_manifest(directory, fmt)
    committed = {(r.input.size, r.input.sha256): r for r in (manifest.records() if manifest else [])}
    journal = {(r.input.size, r.input.sha256, r.part.name): r for r in read_records(directory)}
    next_index = 1 + max((part_index(r.part.name) for r in committed.values() if r.part), default=-1)
    plan = Plan(tasks=[], committed=not damaged)
    for i, shard in enumerate(shards):
        record = committed.get((shard.size, shard.sha256))
        if record is not None:
            name = record.input.part
        else:
            plan.committed = False
            name = part_name(next_index, fmt)
            next_index += 1
            record = journal.get((shard.size, shard.sha256, name))
        if _intact(directory, record):
            plan.done.append(record)
        else:
            plan.committed = False
            plan.tasks.append(Task(shard, name, rank=i % world))
    ours = {(s.size, s.sha256) for s in shards}
    plan.carried = [r for key, r in committed.items() if key not in ours]
    if damaged:  # the damaged manifest's other inputs, as far as their records and parts survive
        names = {t.part for t in plan.tasks} | {r.input.part for r in plan.done}
        plan.carried += [r for (size, sha, name), r in journal.items()
                         if (size, sha) not in ours and name not in names and _intact(directory, r)]
    return plan


def remove_temporaries(directory: Path) -> None:
    """Leftovers of a killed writer (under the lock nobody else writes them)."""
    for path in directory.glob(f"*{TMP_SUFFIX}"):
        remove_path(path)
