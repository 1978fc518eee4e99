"""One input example (docs/contract.md §5) and its validation.

A WebDataset sample is ``<key>.json`` holding ``{"x": ..., "y": ...}``, each a list of
string tokens (looked up one to one in the vocabulary) or a string (encoded by a
checkpoint's tokenizer), with optional ``"strategy"`` (str) and ``"t0"`` (int, an index into S).
Every check raises ``SampleError`` naming the key and shard, so a caller can stop or
skip-and-count by reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokweight.pipeline.data.errors import SampleError


@dataclass(frozen=True)
class Sample:
    """A validated example: ``key`` has no '.' or '/', ``y`` is non-empty."""

    key: str
    x: tuple[str, ...] | str
    y: tuple[str, ...] | str
    strategy: str | None = None  # the generating strategy, when known
    t0: int | None = None  # first index in S at which y_<=t fits one strategy only


def check_key(key: Any, *, shard: str | None = None) -> str:
    """The key unchanged, or SampleError('bad-key'): WebDataset splits names at the first dot."""
    if not isinstance(key, str) or not key or "." in key or "/" in key:
        raise SampleError("bad-key", f"key {key!r} must be a non-empty string without '.' or '/'",
                          key=key if isinstance(key, str) else None, shard=shard)
    return key


def _tokens(record: dict, field: str, key: str, shard: str | None) -> tuple[str, ...] | str:
    """``record[field]`` as a tuple of strings, or the string itself (wrong-type otherwise)."""
    value = record[field]
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not all(isinstance(tok, str) for tok in value):
        raise SampleError("wrong-type", f"field {field!r} must be a list of strings or a string", key=key,
                          shard=shard)
    return tuple(value)


def sample_from_record(record: Any, key: str, *, shard: str | None = None) -> Sample:
    """Validate a decoded JSON record (the ``<key>.json`` payload) into a Sample."""
    check_key(key, shard=shard)
    if not isinstance(record, dict):
        raise SampleError("wrong-type", f"json payload must be an object, got {type(record).__name__}",
                          key=key, shard=shard)
    for field in ("x", "y"):
        if field not in record:
            raise SampleError("missing-field", f"field {field!r} is missing", key=key, shard=shard)
    x, y = _tokens(record, "x", key, shard), _tokens(record, "y", key, shard)
    strategy, t0 = record.get("strategy"), record.get("t0")
    if strategy is not None and not isinstance(strategy, str):
        raise SampleError("wrong-type", "field 'strategy' must be a string", key=key, shard=shard)
    if t0 is not None and (not isinstance(t0, int) or isinstance(t0, bool)):
        raise SampleError("wrong-type", "field 't0' must be an integer", key=key, shard=shard)
    if not y:
        raise SampleError("empty-y", "field 'y' is empty", key=key, shard=shard)
    return Sample(key=key, x=x, y=y, strategy=strategy, t0=t0)


def parse_sample(raw: dict, *, shard: str | None = None) -> Sample:
    """A Sample from a WebDataset raw dict (``__key__``, ``json`` as bytes or a decoded dict)."""
    key = raw.get("__key__")
    check_key(key, shard=shard)
    if "json" not in raw:
        raise SampleError("missing-field", "no '.json' member for this key", key=key, shard=shard)
    payload = raw["json"]
    if isinstance(payload, (bytes, bytearray, memoryview, str)):
        try:
            payload = json.loads(bytes(payload) if not isinstance(payload, str) else payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SampleError("bad-json", f"json does not decode: {exc}", key=key, shard=shard) from None
    return sample_from_record(payload, key, shard=shard)


def sample_to_json(sample: Sample) -> dict:
    """The ``<key>.json`` payload; optional fields only when set, so files stay minimal."""
    record: dict[str, Any] = {f: v if isinstance(v, str) else list(v) for f, v in (("x", sample.x), ("y", sample.y))}
    if sample.strategy is not None:
        record["strategy"] = sample.strategy
    if sample.t0 is not None:
        record["t0"] = sample.t0
    return record
