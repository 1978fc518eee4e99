"""Extraction's reader process: shards read, encoded and batched one or two ahead of the model in a
DataLoader worker process, and the rule for when that pays (``reader_pays``).

Reading tars, JSON and encoding is Python that holds the GIL, so in a thread it slows the
forward pass of the main thread; in a process it runs on another core, where there is one.
"""

from __future__ import annotations

import gc
import os
import pickle
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from torch.utils.data import DataLoader, IterableDataset


@dataclass(frozen=True)
class ReaderFailure:
    """An exception of the reader process, with that process's trace as a note; one that cannot be
    pickled travels as a RuntimeError naming its type (the queue would drop it and end the stream)."""

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


class ShardReader(IterableDataset):
    """The reading stage as a DataLoader dataset: one PreparedShard per task, in order, in a worker process.

    Reading tars, JSON and encoding is Python that holds the GIL, so in a thread it
    slows the forward pass of the main thread; in a process it runs on another core. An
    exception is handed over as a ``ReaderFailure`` and ends the stream.
    """

    def __init__(self, tasks: list, prepare: Callable):
        self.tasks, self.prepare = tasks, prepare  # prepare: picklable (a partial of prepare_shard)

    def __iter__(self) -> Iterator:
        for task in self.tasks:
            try:
                yield self.prepare(task)
            except Exception as error:
                yield ReaderFailure.of(error)
                return


def _exit_with_parent(parent: int, worker_id: int) -> None:
    """DataLoader ``worker_init_fn`` (with the extracting process's pid bound): end the reader process as
    soon as that process is gone.

    DataLoader's own watchdog takes the parent to be whatever it is when the worker has
    started, which is init if the parent was killed during the start-up; and when it does
    notice, the worker waits forever at exit to flush a large item into a pipe that it
    holds open itself.
    """
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="extract-reader-watchdog", daemon=True).start()


def _reader_init(parent: int, worker_id: int) -> None:
    """DataLoader ``worker_init_fn`` of the reader process: end with the extracting process, and leave what it
    has loaded (torch, the tokenizer) out of the garbage collector's passes (``gc_frozen``) for good."""
    _exit_with_parent(parent, worker_id)
    gc.freeze()


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


def reader_pays(device_type: str, cpus: int, torch_threads: int) -> bool:
    """The default reading mode's rule: a reader process where a CPU is free beside the forward.

    Reading in-process puts the shard's tar scan, JSON, validation and encoding (about 7% of the
    forward's time here) in series with the forward; a reader process overlaps them on another CPU,
    after about 2 s to start and import torch. Measured by ``scripts/bench_extract.py`` on the
    2-CPU VM with one torch thread and nothing else running, three runs: reader process 0.966, 1.017
    and 0.916 of the bare forward, in-process 0.890, 0.982 and 0.841 (within-round medians; the bare
    forward itself moves by 6% between rounds). With the CPUs shared by other jobs the order turns
    (0.80-0.94 in-process, 0.70-0.89 with the reader): the rule serves a machine doing this job. On
    CPU a free CPU means ``cpus >= torch_threads + 1`` (the forward's threads keep theirs busy); on an
    accelerator the forward runs on the device, which reading in the main thread would leave idle:
    ``cpus >= 2``.
    """
    if device_type == "cpu":
        return cpus >= torch_threads + 1
    return cpus >= 2


def cpus_per_process() -> int:
    """The CPUs this process may run on (its affinity), divided between the node's torchrun ranks."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def read_ahead(tasks: list, prepare: Callable) -> Iterator:
    """``prepare(task)`` for every task, in order: the first here while a DataLoader worker process starts
    (it imports torch, about 2 s), the others in that process one or two shards ahead."""
    reader = ShardReader(tasks[1:], prepare)
    # spawn: like forkserver, a fresh interpreter (forking a process that runs threads can deadlock: cpython#112275),
    # and the worker is this process's child, so DataLoader's watchdog ends it if this process is killed; a
    # forkserver child outlives a SIGKILLed parent (it holds the server's liveness pipe open).
    loader = iter(DataLoader(reader, batch_size=None, num_workers=1, multiprocessing_context="spawn",
                             prefetch_factor=2, worker_init_fn=partial(_reader_init, os.getpid())))
    try:
        yield prepare(tasks[0])
        for item in loader:
            if isinstance(item, ReaderFailure):
                raise item.exception()
            yield item
    finally:
        del loader  # the last reference: the iterator shuts its worker down now, also after an early stop
