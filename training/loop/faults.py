"""Points where a test interrupts a train run: deterministic stand-ins for a kill, a full disk or a
failing one, at a chosen step or file write instead of at a polled moment (``train.run(cfg, hooks)``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable


def nothing(_) -> None:
    return None


@dataclass(frozen=True)
class Hooks:
    after_step: Callable[[int], None] = nothing
    """Called with the step count once a step's optimizer update is done, before its metrics line,
    validation and checkpoint: raising there is a kill between two steps."""
    after_checkpoint: Callable[[int], None] = nothing
    """Called with the step once that step's checkpoint is committed."""
    before_write: Callable[[Path], None] = nothing
    """Called with the path of each file of a checkpoint before it is written: raise OSError(ENOSPC) or
    OSError(EIO) there to fail the k-th write."""


NO_HOOKS = Hooks()
