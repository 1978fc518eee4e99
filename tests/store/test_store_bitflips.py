"""`store verify` detects any single flipped bit in any store file: every part (Parquet, and each file of a
Zarr part), the manifest and each journal record; and readers refuse a manifest that does not verify."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.store.baseline_store import BaselineStore
from tokweight.store.manifest import MANIFEST_NAME, REPAIR, write_checked_json
from tokweight.store.sql import connect
from tokweight.store.verify import verify_dir
from tokweight.training.loop.join import StoreRef

from tests.support.fixtures_sql import example_rows, write_store

TRIALS = 200
KINDS = ("parquet part", "zarr part file", "manifest", "journal record")


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """A committed Parquet store and a Zarr one (format -> fingerprint directory), two parts each. The
    manifests hold a float in exponent form ("1e-05"), where flipping the case of the "e" changes the
    bytes and not the value."""
    rows = example_rows(4, 40, max_T=6, shards=2)
    directories = {}
    for fmt in ("parquet", "zarr"):
        directory = write_store(tmp_path_factory.mktemp(fmt), "c" * 32, rows, fmt=fmt)
        manifest = json.loads((directory / MANIFEST_NAME).read_text())
        manifest["checkpoint"]["model_config"] = {"lr": 1e-05}
        write_checked_json(directory / MANIFEST_NAME, manifest)
        assert verify_dir(directory) == []
        directories[fmt] = directory
    return directories


def _candidates(stores: dict[str, Path], kind: str) -> list[tuple[Path, str]]:
    """(file, the name a problem must give: the part, the manifest or the record) of one kind."""
    if kind == "parquet part":
        return [(p, p.name) for p in sorted(stores["parquet"].glob("part-*.parquet"))]
    if kind == "zarr part file":
        return [(f, part.name) for part in sorted(stores["zarr"].glob("part-*.zarr"))
                for f in sorted(part.rglob("*")) if f.is_file()]
    if kind == "manifest":
        return [(d / MANIFEST_NAME, MANIFEST_NAME) for d in stores.values()]
    return [(p, p.name) for d in stores.values() for p in sorted(d.glob("part-*.json"))]


def _flip(path: Path, bit: int) -> bytes:
    """Flip one bit of the file; returns the original bytes."""
    data = path.read_bytes()
    flipped = bytearray(data)
    flipped[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(flipped))
    return data


def test_every_single_bit_flip_is_detected(stores, capsys):
    rng = np.random.default_rng(25)
    detected, trials = Counter(), Counter()
    for i in range(TRIALS):
        kind = KINDS[i % len(KINDS)]
        candidates = _candidates(stores, kind)
        path, name = candidates[rng.integers(len(candidates))]
        original = _flip(path, int(rng.integers(8 * path.stat().st_size)))
        try:
            problems = verify_dir(path.parent if kind != "zarr part file" else stores["zarr"])
        finally:
            path.write_bytes(original)
        trials[kind] += 1
        detected[kind] += any(p.part == name for p in problems)
    with capsys.disabled():
        print("\nsingle-bit flips detected by store verify: "
              + ", ".join(f"{kind} {detected[kind]}/{trials[kind]}" for kind in KINDS))
    assert all(verify_dir(d) == [] for d in stores.values())  # every file restored
    assert sum(trials.values()) == TRIALS and detected == trials


def test_a_flip_that_keeps_the_json_equal_is_detected(stores):
    """"1e-05" -> "1E-05": the same value, other bytes: verify hashes the bytes as written."""
    path = stores["parquet"] / MANIFEST_NAME
    data = path.read_bytes()
    at = data.index(b"1e-05") + 1
    original = _flip(path, 8 * at + 5)  # 'e' (0x65) -> 'E' (0x45)
    try:
        assert json.loads(path.read_bytes()) == json.loads(original) and path.read_bytes() != original
        assert [p.part for p in verify_dir(path.parent)] == [MANIFEST_NAME]
    finally:
        path.write_bytes(original)


def test_readers_refuse_a_manifest_that_does_not_verify_naming_the_repair(stores, tmp_path):
    """BaselineStore, StoreRef (what train and eval open), store.sql (inspect, sql) and the CLI: one line,
    the file, the fix."""
    directory = stores["parquet"]
    path = directory / MANIFEST_NAME
    original = path.read_bytes()
    path.write_bytes(original.replace(b'"rows": 20', b'"rows": 21', 1))
    try:
        for read in (lambda: BaselineStore(directory.parent).open(), lambda: connect(directory.parent),
                     lambda: StoreRef(str(directory.parent), "c" * 32).open()):
            with pytest.raises(ValueError) as refused:
                read()
            message = str(refused.value)
            assert "\n" not in message and str(path) in message and REPAIR in message
        for command in (["sql", str(directory.parent), "SELECT 1"], ["store", "verify", str(directory.parent)],
                        ["inspect", str(directory.parent), "--out", str(tmp_path / "report")]):
            result = CliRunner().invoke(main, command)
            assert result.exit_code == 1 and str(path) in result.output, result.output
    finally:
        path.write_bytes(original)
