"""One writer per directory (a store's fingerprint directory, an experiment's setting or cell): an advisory
``flock`` on ``.lock``.

The kernel drops a ``flock`` when its holder dies (even by SIGKILL), so a crashed
extraction never leaves a stale lock behind; the pid/host written into the file only
serves the error message. Two lock objects in one process conflict as well (a lock
belongs to an open file description), which is what the tests use. ``flock`` is
advisory and unreliable on some network filesystems (NFS): keep stores on local disks
or on filesystems with working POSIX locks.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

LOCK_NAME = ".lock"


class StoreLockedError(RuntimeError):
    """Another process holds the store's lock."""


class StoreLock:
    """``with StoreLock(dir, wait_s=0):`` holds ``dir/.lock`` exclusively or raises StoreLockedError.

    wait_s: seconds to wait for the holder to finish; 0 fails at once, ``math.inf`` waits as long as it holds.
    waiting: told (once, with the holder) when the lock is held by another and this one waits.
    """

    def __init__(self, directory: str | Path, *, wait_s: float = 0.0, poll_s: float = 0.2,
                 waiting: Callable[[str], None] | None = None):
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        self.path = Path(directory) / LOCK_NAME
        self.wait_s, self.poll_s, self.waiting = wait_s, poll_s, waiting
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline, told = time.monotonic() + self.wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self.holder()
                    os.close(fd)
                    raise StoreLockedError(
                        f"{self.path.parent} is being written by another process ({holder}); "
                        f"waited {self.wait_s:g} s. Wait for it to finish, or remove {self.path} "
                        "only if you are sure no tokweight process is writing it") from None
                if self.waiting is not None and not told:
                    self.waiting(f"{self.path.parent} is being written by another process ({self.holder()}): waiting")
                    told = True
                time.sleep(self.poll_s)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())
        self._fd = fd

    def holder(self) -> str:
        """Who holds the lock, as recorded in the file (best effort: for messages only)."""
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return "unknown holder"
        return ", ".join(f"{k} {v}" for k, v in info.items()) or "unknown holder"

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "StoreLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
