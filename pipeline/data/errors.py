"""The one error type for bad input samples.

Every stage that reads samples (extraction, training, conversion) raises
``SampleError`` so that a caller can either stop with a message naming the shard
and key, or skip the sample and count it under ``reason``.
"""

from __future__ import annotations

from collections.abc import Iterator

REASONS = (
    "missing-field",
    "wrong-type",
    "empty-y",
    "unknown-symbol",
    "too-long",
    "duplicate-key",
    "bad-key",
    "bad-json",
    "truncated-shard",
    "template-token",  # a sample the checkpoint's template cannot hold as it is (e.g. y holds its end token)
)


class SampleError(ValueError):
    """A sample that cannot be used, with the reason class and where it came from."""

    def __init__(self, reason: str, message: str, *, key: str | None = None, shard: str | None = None):
        if reason not in REASONS:
            raise ValueError(f"unknown SampleError reason {reason!r}; expected one of {REASONS}")
        self.reason = reason
        self.detail = message
        self.key = key
        self.shard = shard
        where = ", ".join(f"{k} {v!r}" for k, v in (("shard", shard), ("key", key)) if v is not None)
        super().__init__(f"{message} ({where})" if where else message)

    def __reduce__(self):
        """Pickle by the constructor's own arguments (the default passes only the message), so the
        error crosses a process boundary intact: reason, key, shard and any notes."""
        return _rebuild, (self.reason, self.detail, self.key, self.shard), self.__dict__

    def located(self, *, key: str | None = None, shard: str | None = None) -> "SampleError":
        """The same error with the shard and/or key filled in where they were missing."""
        return SampleError(self.reason, self.detail, key=self.key or key, shard=self.shard or shard)


def _rebuild(reason: str, detail: str, key: str | None, shard: str | None) -> SampleError:
    return SampleError(reason, detail, key=key, shard=shard)


# ---------------------------------------------------------------- what a stage skipped

WHOLE_SHARD = "truncated-shard"
"""The reason counted per shard, not per sample: a truncated tar is skipped whole."""

SHOWN_SHARDS = 3
"""Shards a summary line names before it says how many more there are."""


class Skips:
    """Bad samples a stage left out: per shard (named relative to the dataset root), per reason.

    Kept per shard so that a shard read again (a training stream resamples its shards, and
    validations re-read the val split) is counted once: the first count of a shard stands.
    """

    def __init__(self, shards: dict[str, dict[str, int]] | None = None):
        self.shards: dict[str, dict[str, int]] = {}
        self.merge(shards or {})

    def add(self, shard: str, reasons: dict[str, int]) -> None:
        """One shard's skips per reason; a shard already counted, or nothing skipped, changes nothing."""
        if shard not in self.shards and any(reasons.values()):
            self.shards[shard] = {r: n for r, n in sorted(reasons.items()) if n}

    def merge(self, shards: Skips | dict[str, dict[str, int]]) -> Skips:
        for shard, reasons in (shards.shards if isinstance(shards, Skips) else shards).items():
            self.add(shard, reasons)
        return self

    def __bool__(self) -> bool:
        return bool(self.shards)

    def drain(self) -> Iterator[Skips]:
        """What was gathered since the last drain, as one ``Skips`` (nothing if nothing was); then empty."""
        if self:
            yield Skips(self.shards)
            self.shards = {}

    def reasons(self) -> dict[str, int]:
        """Skips per reason over every shard, sorted by reason."""
        totals: dict[str, int] = {}
        for reasons in self.shards.values():
            for reason, n in reasons.items():
                totals[reason] = totals.get(reason, 0) + n
        return dict(sorted(totals.items()))

    def to_json(self) -> dict:
        """``{"skipped": {reason: n}, "skipped_shards": {shard: {reason: n}}}``, or {} if nothing was skipped:
        the keys every stage's JSON (extract's summary, train's result, the eval metrics) reports them under."""
        return {"skipped": self.reasons(), "skipped_shards": dict(sorted(self.shards.items()))} if self else {}

    def summary_line(self) -> str | None:
        """One line for stderr, e.g. ``skipped 3 samples: bad-key 2, duplicate-key 1 (shard train/a.tar)``;
        None if nothing was skipped. A truncated shard counts as a whole shard, not as samples."""
        if not self:
            return None
        reasons = self.reasons()
        whole = reasons.get(WHOLE_SHARD, 0)
        amounts = [_counted(sum(reasons.values()) - whole, "sample"), _counted(whole, "whole shard")]
        counts = ", ".join(f"{reason} {n}" for reason, n in reasons.items())
        return f"skipped {' and '.join(a for a in amounts if a)}: {counts} ({_shard_list(sorted(self.shards))})"


def _counted(n: int, noun: str) -> str:
    """"3 samples", "1 sample", or "" for none."""
    return f"{n} {noun}{'s' if n != 1 else ''}" if n else ""


def _shard_list(names: list[str]) -> str:
    """"shard a.tar", "shards a.tar, b.tar", or the first SHOWN_SHARDS "and N more"."""
    shown = ", ".join(names[:SHOWN_SHARDS])
    more = f" and {len(names) - SHOWN_SHARDS} more" if len(names) > SHOWN_SHARDS else ""
    return f"{'shards' if len(names) > 1 else 'shard'} {shown}{more}"
