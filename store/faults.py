"""A test-only fault hook in the store's durable writes: fail, or die, at the k-th write.

Every file that the store makes durable (a Parquet part's bytes, each file of a Zarr part,
a journal record, the manifest) passes ``on_write(path)`` once, half written (a Zarr file:
written, not yet fsynced). Unarmed, which it always is outside tests, that is a no-op. A
test arms it for a block, ``with armed(WriteFault(at=k, action="ENOSPC")): ...``, and at
the k-th durable write from then on:

- "ENOSPC" / "EIO": ``OSError`` of that errno, as a full disk or a failing one raises it;
- "SIGKILL": the process kills itself, ``os.kill(os.getpid(), SIGKILL)``: a crash at a
  known point of the store protocol, with no timer and no poll to race. A test runs
  ``tokweight extract`` in a child process under ``armed`` to reach it.

``WriteFault.paths`` lists every durable write seen while armed, so a test can check
that the fault struck the file it meant.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ACTIONS = ("ENOSPC", "EIO", "SIGKILL")


@dataclass
class WriteFault:
    at: int
    """1-based index of the durable write that fails, counted from when the fault is armed."""
    action: str = "ENOSPC"
    """One of ACTIONS."""
    paths: list[Path] = field(default_factory=list)
    """Every durable write seen while armed, in order (the failing one last, if it came)."""

    def __post_init__(self):
        if self.at < 1:
            raise ValueError(f"at must be >= 1, got {self.at}")
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {self.action!r}")

    def strike(self, path: Path) -> None:
        if self.action == "SIGKILL":
            os.kill(os.getpid(), signal.SIGKILL)
        code = getattr(errno, self.action)
        raise OSError(code, os.strerror(code), str(path))


_armed: WriteFault | None = None
_lock = threading.Lock()  # parts are written by a background thread, the manifest by the main one


@contextmanager
def armed(fault: WriteFault) -> Iterator[WriteFault]:
    """Arm ``fault`` for the block (one at a time), disarm it on leaving, whatever happened."""
    global _armed
    with _lock:
        if _armed is not None:
            raise RuntimeError("a write fault is armed already")
        _armed = fault
    try:
        yield fault
    finally:
        with _lock:
            _armed = None


def on_write(path: Path) -> None:
    """Count one durable write of ``path``; strike if it is the armed fault's."""
    if _armed is None:
        return
    with _lock:
        fault = _armed
        if fault is None:
            return
        fault.paths.append(Path(path))
        due = len(fault.paths) == fault.at
    if due:
        fault.strike(Path(path))
