"""Stage one's plan: the store's resume state (``store.resume``: which parts are intact, which part
name each other shard gets), and the work rank 0 hands out: shard i of the run to rank i % world,
with the keys each shard must skip.

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
from tokweight.store.manifest import Record
from tokweight.store.resume import resume
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
    """Which of this run's shards still need a part (``store.resume``), each given to rank i % world."""
    state = resume(directory, shards, fmt)
    return Plan(tasks=[Task(shards[i], name, rank=i % world) for i, name in state.todo], done=state.done,
                carried=state.carried, committed=state.committed)
