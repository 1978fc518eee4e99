"""The reader process (spawned, started before the checkpoint loads, free of torch and transformers) gives the
same store as reading in-process, its errors reach the caller as the same exceptions with its trace, naming
shard and key, it ends with a failing or killed extracting process (deterministic fault hooks, no sleeps), and
the default mode takes it only with an idle CPU beside the forward (``reader_pays``)."""

import multiprocessing
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokweight.commands import extract as extract_cli
from tokweight.pipeline.extract import extract
from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.extract.extract import run
from tokweight.pipeline.extract.reader import ReaderFailure, ReaderProcess
from tokweight.store.baseline_store import BaselineStore

from tests.support import reader_hooks
from tests.support.fixtures_extract import fp_dir, part_bytes, sample_member, write_raw_tar

GOOD = {"x": ["a", "b"], "y": ["c", "d", "e"], "strategy": "copy", "t0": 1}


def test_reader_process_store_is_byte_identical(world, tmp_path, monkeypatch):
    """The default mode with CPUs to spare takes the reader process: shard 0 is prepared in-process and
    shards 1-5 by the worker, and every part equals the in-process store's."""
    monkeypatch.setattr(extract, "cpus_per_process", lambda: 64)
    monkeypatch.setattr(extract, "busy_cpus", lambda: 0.0)
    summary = run(world.config(tmp_path / "s", reader_process=None))
    assert summary["parts_written"] == 6 and summary["reader_process"] is True
    assert part_bytes(tmp_path / "s") == part_bytes(world.store)


def test_the_default_reads_in_process_without_cpus_to_spare(world, tmp_path, monkeypatch):
    monkeypatch.setattr(extract, "cpus_per_process", lambda: torch.get_num_threads())  # every CPU in the forward
    monkeypatch.setattr(extract, "busy_cpus", lambda: 0.0)
    summary = run(world.config(tmp_path / "s", reader_process=None))
    assert summary["reader_process"] is False
    assert part_bytes(tmp_path / "s") == part_bytes(world.store)
    [option] = [p for p in extract_cli.extract.params if p.name == "reader_process"]
    assert option.default is None  # the CLI's default is this rule too


def test_the_default_reads_in_process_while_other_work_keeps_the_cpus_busy(world, tmp_path, monkeypatch):
    monkeypatch.setattr(extract, "cpus_per_process", lambda: 2)
    monkeypatch.setattr(extract, "busy_cpus", lambda: 3.5)  # the shared 2-core VM at load 4.5
    assert run(world.config(tmp_path / "s", reader_process=None))["reader_process"] is False


@pytest.mark.parametrize("device, cpus, threads, busy, pays", [
    ("cpu", 2, 1, 0.0, True),  # the 2-core VM with one torch thread, idle: the other CPU reads
    ("cpu", 2, 1, 0.4, True),
    ("cpu", 2, 1, 1.0, False),  # one CPU busy elsewhere: a reader would split this process's share
    ("cpu", 2, 1, 3.5, False),  # the shared VM at load 4.5
    ("cpu", 2, 2, 0.0, False),  # torch's default there: both CPUs in the forward
    ("cpu", 1, 1, 0.0, False),
    ("cpu", 16, 16, 0.0, False),
    ("cpu", 16, 15, 0.0, True),
    ("cpu", 16, 8, 4.0, True),
    ("cuda", 2, 2, 0.0, True),  # the forward runs on the device: one CPU beside the main thread is enough
    ("cuda", 16, 16, 3.0, True),  # a GPU host with several cores
    ("cuda", 1, 1, 0.0, False),
])
def test_reader_pays_with_an_idle_cpu_beside_the_forward(device, cpus, threads, busy, pays):
    assert extract.reader_pays(device, cpus, threads, busy) is pays


def test_one_shard_or_an_explicit_choice_overrides_the_rule(world, tmp_path):
    assert not extract.uses_reader_process(world.config(tmp_path, reader_process=True), 1)
    assert not extract.uses_reader_process(world.config(tmp_path, reader_process=False), 6)
    assert extract.uses_reader_process(world.config(tmp_path, reader_process=True), 2)


def _data(tmp_path, bad_record):
    """a/shard.tar (good, prepared in-process) then b/shard.tar with one bad sample k1 (prepared by the worker)."""
    write_raw_tar(tmp_path / "data" / "a" / "shard.tar", [sample_member(f"g{i}", GOOD) for i in range(3)])
    write_raw_tar(tmp_path / "data" / "b" / "shard.tar",
                  [sample_member("k0", GOOD), sample_member("k1", bad_record), sample_member("k2", GOOD)])
    return tmp_path / "data"


def test_worker_sample_error_names_shard_and_key(world, tmp_path):
    data = _data(tmp_path, {"x": ["a"], "y": ["c", "zz"]})
    with pytest.raises(SampleError) as info:
        run(world.config(tmp_path / "s", data=str(data), reader_process=True))
    assert info.value.reason == "unknown-symbol" and info.value.key == "k1"
    assert "b/shard.tar" in str(info.value)
    note = info.value.__notes__[0]  # the reader's own trace
    assert note.startswith("raised in the extraction reader process") and "prepare.py" in note
    assert not (fp_dir(tmp_path / "s") / "manifest.json").exists()
    summary = run(world.config(tmp_path / "s", data=str(data), reader_process=True, on_bad_sample="skip"))
    assert summary["skipped"] == {"unknown-symbol": 1}
    view = BaselineStore(tmp_path / "s").open()
    assert [p["rows"] for p in view.parts()] == [3, 2]


def test_reader_failure_survives_pickling_as_the_same_exception():
    import pickle

    sample = pickle.loads(pickle.dumps(ReaderFailure.of(SampleError("too-long", "long", key="k", shard="s.tar"))))
    error = sample.exception()
    assert isinstance(error, SampleError) and (error.reason, error.key, error.shard) == ("too-long", "k", "s.tar")
    other = pickle.loads(pickle.dumps(ReaderFailure.of(RuntimeError("refusing to write")))).exception()
    assert isinstance(other, RuntimeError) and str(other) == "refusing to write"
    assert "reader process" in other.__notes__[0]


def test_gc_frozen_freezes_for_the_block_only_and_leaves_a_callers_freeze_alone():
    import gc

    from tokweight.pipeline.extract.reader import gc_frozen

    assert gc.get_freeze_count() == 0
    with gc_frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_frozen():
            pass
        assert gc.get_freeze_count() == frozen  # the caller's, untouched
    finally:
        gc.unfreeze()


# ---------------------------------------------------------------- the process


ROOT = Path(__file__).resolve().parents[3]


def test_the_reader_imports_neither_torch_nor_transformers_nor_the_calling_script(tmp_path):
    """Started from a script that imports torch (as the tokweight command and the benchmark do), the process does not
    run that script and loads the reading stage without torch or transformers."""
    script = tmp_path / "main.py"
    script.write_text("import json, sys\n"
                      f"sys.path.insert(0, {str(ROOT)!r})\n"
                      "import torch, transformers  # the caller's, never the reader's\n"
                      "from tokweight.pipeline.extract.reader import ReaderProcess\n"
                      "from tests.support import reader_hooks\n"
                      "if __name__ == '__main__':\n"
                      "    with ReaderProcess(3, reader_hooks.recording_serve) as reader:\n"
                      "        before = reader.conn.recv()\n"
                      "        reader.prepare(reader_hooks.echo)\n"
                      "        print(json.dumps([before, list(reader.read([1, 2]))]))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    before, items = json.loads(done.stdout)
    assert before == {"loaded": [], "main_script": None}
    assert items == [[1, [], "3"], [2, [], "3"]]  # the reading stage loaded (serve), still no torch; 3 threads


def test_the_reader_is_started_before_the_checkpoint_loads(world, tmp_path, monkeypatch):
    seen = []
    load = extract.load_backbone

    def loading(*args, **kwargs):
        seen.append([p.name for p in multiprocessing.active_children()])
        return load(*args, **kwargs)

    monkeypatch.setattr(extract, "load_backbone", loading)
    assert run(world.config(tmp_path / "s", reader_process=True))["reader_process"] is True
    assert seen == [["extract-reader"]]
    assert multiprocessing.active_children() == []  # ended with the run


def test_a_reader_exception_is_raised_here_with_its_trace():
    with ReaderProcess() as reader:
        reader.prepare(reader_hooks.RaiseAt(2))
        items = reader.read([0, 1, 2, 3])
        assert [next(items), next(items)] == [0, 1]
        with pytest.raises(KeyError, match="task 2 refused") as info:
            next(items)
    assert "reader_hooks.py" in info.value.__notes__[0]


def test_a_reader_that_dies_is_an_error_not_a_hang():
    with ReaderProcess() as reader:
        reader.prepare(reader_hooks.ExitAt(1, code=7))
        items = reader.read([0, 1, 2])
        assert next(items) == 0
        with pytest.raises(RuntimeError, match=r"reader process ended \(exit code 7\)"):
            next(items)


def test_closing_mid_way_ends_a_reader_blocked_on_sending():
    """The extracting process stops reading (an exception there) while the reader waits to send: ``close`` ends it."""
    reader = ReaderProcess()
    reader.prepare(reader_hooks.big)
    items = reader.read(list(range(4)))
    assert len(next(items)) == 1 << 22  # the second is on its way, blocked on the full pipe
    reader.close()
    assert not reader.process.is_alive() and reader.process.exitcode is not None


def test_an_extraction_that_fails_while_the_reader_reads_commits_nothing_and_ends_it(world, tmp_path, monkeypatch):
    scored = []
    score = extract.score_shard

    def failing(rows, *args):
        if scored:
            raise FloatingPointError("the fault hook fails the second shard")
        scored.append(rows.shard)
        return score(rows, *args)

    monkeypatch.setattr(extract, "score_shard", failing)
    with pytest.raises(FloatingPointError):
        run(world.config(tmp_path / "s", reader_process=True))
    assert not (fp_dir(tmp_path / "s") / "manifest.json").exists()
    assert multiprocessing.active_children() == []


def test_the_reader_ends_when_the_extracting_process_is_killed(tmp_path):
    """The extracting process SIGKILLs itself while its reader is busy in a task: the reader's watchdog ends it.
    The run returns once every holder of the script's stdout (the reader, which inherits it) has exited."""
    script = tmp_path / "killed.py"
    script.write_text("import os, signal, sys\n"
                      f"sys.path.insert(0, {str(ROOT)!r})\n"
                      "from tokweight.pipeline.extract.reader import ReaderProcess\n"
                      "from tests.support import reader_hooks\n"
                      "if __name__ == '__main__':\n"
                      "    reader = ReaderProcess(1, reader_hooks.recording_serve)\n"
                      "    reader.conn.recv()  # serving: its watchdog runs\n"
                      "    reader.prepare(reader_hooks.stuck)\n"
                      "    reader.read([0])\n"
                      "    print(reader.process.pid, flush=True)\n"
                      "    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    pid = int(done.stdout)
    status = Path(f"/proc/{pid}/status")
    assert not status.exists() or "\nState:\tZ" in status.read_text()  # gone, or a zombie waiting to be reaped
