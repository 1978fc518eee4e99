"""The store's resume protocol: which of a run's input shards already have an intact part, and which
part name each of the others gets (under the store lock, before anything is written).

Local shards are identified by size and sha256, so a moved dataset still matches its parts and
changed data never does. A URL is identified by the URL itself, whose bytes are known only once
streamed: a committed URL input is not read again, and a journaled one (an interrupted run's)
counts only if ``verify`` finds that its bytes still hash to the record (those that do not are
``changed``, and extracted again). A part is done when the committed manifest, or the journal
of an interrupted run, names it and the file on disk hashes to the recorded sha256. A manifest
that does not verify (its own checksum) is treated as absent: the journal records, which
commits keep, give back every part of this run's inputs that is intact (the others are
re-extracted), and those of other inputs are carried into the new manifest.

Part names depend only on the committed manifest and this run's inputs (never on what an
interrupted run finished), so a resumed run, or a run with another number of ranks, names
every part the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tokweight.store.durable import TMP_SUFFIX
from tokweight.store.manifest import (Manifest, Record, damaged_manifest, load_manifest, part_index, part_name,
                                      read_records)
from tokweight.store.parts import remove_path, sha256_path
from tokweight.store.writer import InputShard


@dataclass
class Resume:
    todo: list[tuple[int, str]] = field(default_factory=list)  # (index in the run's shards, part name) to write
    done: list[Record] = field(default_factory=list)  # records of this run's inputs already on disk
    carried: list[Record] = field(default_factory=list)  # committed records of inputs not in this run
    committed: bool = False  # every input of this run is in the committed manifest and verified
    changed: list[Record] = field(default_factory=list)  # journaled URL inputs whose bytes no longer match


Verify = Callable[[list[Record]], set[str]]
"""Journal records of URL inputs -> the URLs whose bytes still hash to their record (pipeline.extract.plan)."""


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


def resume(directory: Path, shards: list[InputShard], fmt: str, verify: Verify | None = None) -> Resume:
    """What of ``shards`` the fingerprint directory already holds intact, and the part names of the rest.

    verify: for journaled URL inputs (see the module docstring); None trusts them as they are.
    """
    damaged = damaged_manifest(directory) is not None
    manifest = None if damaged else _committed_manifest(directory, fmt)
    committed = {r.input.identity(): r for r in (manifest.records() if manifest else [])}
    journal = {(r.input.identity(), r.part.name): r for r in read_records(directory)}
    next_index = 1 + max((part_index(r.part.name) for r in committed.values() if r.part), default=-1)
    state = Resume(committed=not damaged)
    found: list[tuple[int, str, Record | None, bool]] = []  # (index, part name, record, from the journal)
    for i, shard in enumerate(shards):
        record = committed.get(shard.identity())
        if record is not None:
            found.append((i, record.input.part, record, False))
            continue
        state.committed = False
        name = part_name(next_index, fmt)
        next_index += 1
        found.append((i, name, journal.get((shard.identity(), name)), True))
    found = [(i, name, record if _intact(directory, record) else None, journaled)
             for i, name, record, journaled in found]
    unread = [r for _, _, r, journaled in found if journaled and r is not None and r.input.url is not None]
    same = verify(unread) if verify is not None and unread else {r.input.url for r in unread}
    for i, name, record, journaled in found:
        if record is not None and journaled and record.input.url is not None and record.input.url not in same:
            state.changed.append(record)
            record = None
        if record is not None:
            state.done.append(record)
        else:
            state.committed = False
            state.todo.append((i, name))
    ours = {s.identity() for s in shards}
    state.carried = [r for key, r in committed.items() if key not in ours]
    if damaged:  # the damaged manifest's other inputs, as far as their records and parts survive
        names = {name for _, name in state.todo} | {r.input.part for r in state.done}
        state.carried += [r for (key, name), r in journal.items()
                          if key not in ours and name not in names and _intact(directory, r)]
    return state


def remove_temporaries(directory: Path) -> None:
    """Leftovers of a killed writer (under the lock nobody else writes them)."""
    for path in directory.glob(f"*{TMP_SUFFIX}"):
        remove_path(path)
