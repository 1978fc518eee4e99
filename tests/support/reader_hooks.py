"""Probes and deterministic fault hooks that run inside extraction's reader process (``pipeline.extract.reader``).

This module imports neither torch nor transformers: the reader process refuses both."""

from __future__ import annotations

import os
import sys
import threading

from tokweight.pipeline.extract.reader import serve


def loaded() -> list[str]:
    """Which of torch and transformers this process has imported."""
    return [name for name in ("torch", "transformers") if sys.modules.get(name) is not None]


def recording_serve(conn, threads: int) -> None:
    """``serve``, after sending what the process had imported before it and whether the parent's script ran."""
    conn.send({"loaded": loaded(), "main_script": getattr(sys.modules["__main__"], "__file__", None)})
    serve(conn, threads)


def echo(task):
    """A preparing function: the task back, with what is imported and the tokenizer's threads."""
    return task, loaded(), os.environ.get("RAYON_NUM_THREADS")


class ExitAt:
    """A preparing function that ends the process at once (no exception, no message) at task ``at``."""

    def __init__(self, at: int, code: int):
        self.at, self.code = at, code

    def __call__(self, task: int) -> int:
        if task == self.at:
            os._exit(self.code)
        return task


class RaiseAt:
    """A preparing function that raises at task ``at``."""

    def __init__(self, at: int):
        self.at = at

    def __call__(self, task: int) -> int:
        if task == self.at:
            raise KeyError(f"task {task} refused by the fault hook")
        return task


def big(task: int) -> bytes:
    """More bytes than a pipe holds: the process blocks sending them until they are read."""
    return bytes(1 << 22)


def stuck(task: int) -> int:
    """Never returns (waits on an event nothing sets): only the process's end stops it."""
    threading.Event().wait()
    return task
