"""The one error type for bad input samples.

Every stage that reads samples (extraction, training, conversion) raises
``SampleError`` so that a caller can either stop with a message naming the shard
and key, or skip the sample and count it under ``reason``.
"""

from __future__ import annotations

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
