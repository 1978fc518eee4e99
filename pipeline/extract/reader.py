"""Extraction's reader process: the reading stage (``pipeline.extract.prepare``: shards read, encoded and batched)
in a process of its own, one or two shards ahead of the model, and the rule for when that pays (``reader_pays``).

Reading tars, JSON and encoding is Python that holds the GIL, so in a thread it slows the forward pass of
the main thread; in a process it runs on another core, where there is one. The process is cheap to start
and started early (``ReaderProcess``, before the checkpoint loads): a spawned interpreter that imports
neither torch nor transformers (it reads with the tokenizers library, ``pipeline.tokens.tokenizer_ids``, and hands
over numpy arrays), nor the script that runs extraction. It idles until given its vocabulary
(``prepare``) and then its tasks (``read``), and sends each shard, or the first exception with its trace,
back over a pipe; it ends with the extracting process, and is ended by it (``close``).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler

NOT_HERE = ("torch", "transformers")  # never imported by the reader process (a bug, not a slow start)


@dataclass(frozen=True)
class ReaderFailure:
    """An exception of the reader process, with that process's trace as a note; one that cannot be
    pickled travels as a RuntimeError naming its type (the pipe could not carry it)."""

    error: BaseException

    @classmethod
    def of(cls, error: BaseException) -> ReaderFailure:
        note = f"raised in the extraction reader process:\n{''.join(traceback.format_exception(error))}"
        try:
            pickle.dumps(error)
        except Exception:
            error = RuntimeError(f"{type(error).__name__}: {error}")
        error.add_note(note)
        return cls(error)

    def exception(self) -> BaseException:
        return self.error


class ReaderProcess:
    """The reading stage in a spawned process: started at once, idle until ``prepare`` gives it the preparing
    function (a ``functools.partial`` of ``prepare.prepare_shard`` with a vocabulary free of transformers)
    and ``read`` the tasks; ``close`` ends it, also mid-way. A context manager."""

    def __init__(self, threads: int = 1, serve_fn: Callable[[Connection, int], None] | None = None):
        """threads: the tokenizer's threads there (the CPUs beside the forward); serve_fn: the process's body
        (``serve``; a test's fault hook)."""
        # spawn: a fresh interpreter (forking a process that runs threads can deadlock: cpython#112275), and this
        # process's child, which watches for its end (a forkserver child outlives a SIGKILLed parent)
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()  # the vocabulary and tasks one way, prepared shards the other
        self.process = context.Process(target=serve_fn or serve, args=(theirs, threads), name="extract-reader",
                                       daemon=True)
        with main_script_left_out():
            self.process.start()
        theirs.close()

    def prepare(self, prepare: Callable) -> None:
        """Send the preparing function (its vocabulary unpickled there while this process plans)."""
        self.conn.send(prepare)

    def read(self, tasks: list) -> Iterator:
        """Send the tasks now; the process's ``prepare(task)`` of each, in order, as it sends them (its exception
        is raised here)."""
        self.conn.send(tasks)
        return self._results(len(tasks))

    def _results(self, n: int) -> Iterator:
        for _ in range(n):
            item = self._receive()
            if isinstance(item, ReaderFailure):
                raise item.exception()
            yield item

    def _receive(self):
        wait([self.conn, self.process.sentinel])  # an item, or the process's end
        if self.conn.poll():
            try:
                return self.conn.recv()
            except EOFError:  # it ended while sending
                pass
        self.process.join()
        raise RuntimeError(f"the extraction reader process ended (exit code {self.process.exitcode}) before it sent "
                           "every shard; nothing was committed: run extract again (it resumes), or pass "
                           "--no-reader-process")

    def close(self) -> None:
        """End the process (done, or not: this process stopped reading) and wait for it."""
        self.conn.close()  # a send there fails now, whatever it was doing
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()

    def __enter__(self) -> ReaderProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def main_script_left_out() -> Iterator[None]:
    """While a process is spawned: spawn has the child run the parent's ``__main__`` script (or module) before
    anything else, in case a pickled function lives there; the reader's functions live in tokweight's modules,
    and the scripts that run extraction (the tokweight command, a benchmark) import torch at the top. The child
    reads which script to run from ``sys.modules["__main__"]`` at ``start``: a blank one stands in meanwhile."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def serve(conn: Connection, threads: int) -> None:
    """The reader process's body: load the reading stage, then prepare each task as told and send it back; the
    first exception is sent as a ``ReaderFailure`` and ends it."""
    for name in NOT_HERE:
        sys.modules[name] = None  # an import raises: webdataset falls back to its own stand-ins for torch
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizers library's threads, before its first batch
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the extracting process's to handle: it ends this one
    _exit_with_parent()
    inbox = _inbox(conn)
    import tokweight.pipeline.extract.plan  # noqa: F401  (what the tasks unpickle into, loaded while idle)
    import tokweight.pipeline.extract.prepare  # noqa: F401

    gc.freeze()  # what is loaded stays out of the garbage collector's passes (``gc_frozen``)
    prepare, tasks = inbox.get(), inbox.get()
    if prepare is None or tasks is None:  # the extracting process did not need it after all
        return
    prepare, tasks = ForkingPickler.loads(prepare), ForkingPickler.loads(tasks)
    for task in tasks:
        try:
            item = prepare(task)
        except Exception as error:
            item = ReaderFailure.of(error)
        try:
            conn.send(item)
        except OSError:  # the extracting process closed its end: it stopped reading
            return
        if isinstance(item, ReaderFailure):
            return


def _inbox(conn: Connection) -> queue.SimpleQueue:
    """The messages' bytes as they arrive, then None at the end: received by a thread from the start, so that the
    extracting process never waits for this one to have loaded its modules before it can send."""
    box = queue.SimpleQueue()

    def receive() -> None:
        try:
            while True:
                box.put(conn.recv_bytes())
        except (EOFError, OSError):
            box.put(None)
            box.put(None)

    threading.Thread(target=receive, name="extract-reader-inbox", daemon=True).start()
    return box


def _exit_with_parent() -> None:
    """End this (reader) process as soon as its parent is gone, whatever it is doing: a thread waits on the
    parent's sentinel, which multiprocessing closes only when the parent ends."""
    sentinel = multiprocessing.parent_process().sentinel

    def watch() -> None:
        wait([sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="extract-reader-watchdog", daemon=True).start()


@contextmanager
def gc_frozen() -> Iterator[None]:
    """Leave the objects alive now out of the cyclic garbage collector's passes while the block runs. A process
    that has loaded torch and transformers holds ~400k of them, and the reading stage allocates enough small objects
    (samples, ids, layouts) to run a full pass over them all again and again: a fifth of its time, measured on a
    chat template (``scripts/bench_extract.py``). Objects made in the block are collected as usual; the frozen ones
    are the collector's again after it. A process that froze objects itself is left as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def reader_pays(device_type: str, cpus: int, torch_threads: int, busy: float) -> bool:
    """The default reading mode's rule: a reader process where at least half a CPU is idle beside the forward.

    The forward keeps ``torch_threads`` CPUs busy on CPU, the main thread one on an accelerator (reading there
    would leave the device idle); ``busy``: the CPUs other work keeps busy now (``busy_cpus``). Where no CPU is
    idle, a reader process only splits this session's share (Linux's autogroup shares CPUs between sessions, not
    processes) and adds its own work to it. Measured in docs/benchmarks.md (extraction through a chat template).
    """
    forward = torch_threads if device_type == "cpu" else 1
    return cpus - busy - forward >= 0.5


def busy_cpus() -> float:
    """CPUs that other work keeps busy now, per torchrun rank of the node: the 1-minute load average (runnable
    tasks) less this process's own one, divided between the ranks."""
    if not hasattr(os, "getloadavg"):
        return 0.0
    return max(0.0, os.getloadavg()[0] - 1) / int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def reader_threads(device_type: str, cpus: int, torch_threads: int) -> int:
    """The reader process's tokenizer threads: the CPUs the forward leaves (one on an accelerator's host)."""
    return max(1, cpus - (torch_threads if device_type == "cpu" else 1))


def cpus_per_process() -> int:
    """The CPUs this process may run on (its affinity), divided between the node's torchrun ranks."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
