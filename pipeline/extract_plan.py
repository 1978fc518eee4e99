"""Stage one's plan: which input shards still need a part, and under which name (rank 0, under the lock).

Shards are identified by size and sha256, so a moved dataset still matches its parts and
changed data never does. A part is done when the committed manifest, or the journal of an
interrupted run, names it and the file on disk hashes to the recorded sha256.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from store.manifest import Manifest, Record, load_manifest, part_index, part_name, read_records
from store.parts import TMP_SUFFIX, remove_path, sha256_path
from store.writer import InputShard


@dataclass(frozen=True)
class Task:
    """An input shard and the part it maps to; ``rank`` is the rank that writes it if needed."""

    shard: InputShard
    part: str
    rank: int


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


def make_plan(directory: Path, shards: list[InputShard], fmt: str, world: int) -> Plan:
    """Which of this run's shards still need a part, and under which name.

    Part names depend only on the committed manifest and this run's inputs (never on
    what an interrupted run finished), so a resumed run, or a run with another number
    of ranks, names every part the same way. Shard i of the run goes to rank i % world.
    """
    manifest = _committed_manifest(directory, fmt)
    committed = {(r.input.size, r.input.sha256): r for r in (manifest.records() if manifest else [])}
    journal = {(r.input.size, r.input.sha256, r.part.name): r for r in read_records(directory)}
    next_index = 1 + max((part_index(r.part.name) for r in committed.values() if r.part), default=-1)
    plan = Plan(tasks=[], committed=True)
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
    return plan


def remove_temporaries(directory: Path) -> None:
    """Leftovers of a killed writer (under the lock nobody else writes them)."""
    for path in directory.glob(f"*{TMP_SUFFIX}"):
        remove_path(path)
