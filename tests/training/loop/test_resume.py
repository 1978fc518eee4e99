"""A train run interrupted anywhere and run again ends bitwise where the uninterrupted run ends (CPU, one
torch thread): killed after any step (a fault hook, and one real SIGKILL), or stopped by a full or failing
disk while it writes a checkpoint. The runs train with dropout (torch's global RNG), the default recipe's
E-step and anchor term, and a stop rule that converges mid-run, so that every piece of state is needed."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokweight.training.config.migrations import train_config_from
from tokweight.training.loop.convergence import StopRule
from tokweight.training.loop.faults import Hooks
from tokweight.training.loop.run_dir import CheckpointWriteError
from tokweight.training.loop.train import run
from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

ROOT = Path(__file__).resolve().parents[3]
STEPS, CKPT_EVERY, LR_DECAY = 8, 2, 0.4
# counted from step 2 (the warm-up's end), validated every 2 steps: the validation at 2 sets the bests and the
# one at 4, improving by less than 10 nats, makes the run converge there; its learning rate then falls over
# steps 4-6 (4 / (1 - 0.4) = 6.7 steps in all) and it ends at 7. The run to the cap falls over its last 3 steps.
CONVERGES_AT, CONVERGED_END = 4, 7
RUNS = {
    "converges": dict(stop=StopRule(patience=1, min_delta_objective=10.0, min_delta_mi=10.0), workers=0, lanes=1),
    "to the cap": dict(stop=StopRule(patience=0), workers=1, lanes=2),
}
FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json")


class Killed(Exception):
    """What the fault hooks raise: the run ends there, as if the process had died."""


def config(tiny_dropout, out: Path, name: str) -> TrainConfig:
    data, ckpt = tiny_dropout
    spec = RUNS[name]
    return TrainConfig(io=IOConfig(checkpoint=str(ckpt), data=str(data), out=str(out), num_workers=spec["workers"],
                                   lanes=spec["lanes"], shuffle_buffer=16, device="cpu"),
                       loss=LossConfig(policy="frozen", beta=0.3, beta_warmup_steps=2),
                       optim=OptimConfig(steps=STEPS, batch_size=8, lr_decay=LR_DECAY, stop=spec["stop"]),
                       log=LogConfig(log_every=1, grad_diag_every=0, ckpt_every=CKPT_EVERY, eval_every=2,
                                     eval_examples=64, eval_batch_size=64))


def train(cfg: TrainConfig, hooks: Hooks = Hooks()) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(cfg, hooks)
    finally:
        torch.set_num_threads(threads)


_REFERENCES: dict[str, Path] = {}


@pytest.fixture
def reference(tiny_dropout, tmp_path_factory):
    """The uninterrupted run of a configuration, trained once per session."""
    def get(name: str) -> Path:
        if name not in _REFERENCES:
            out = tmp_path_factory.mktemp("reference") / "run"
            train(config(tiny_dropout, out, name))
            _REFERENCES[name] = out
        return _REFERENCES[name]

    return get


def assert_same_run(got: Path, want: Path) -> None:
    """The same parameters, optimizer state, RNG states, checkpoint state and metrics lines, byte for byte."""
    for name in FILES:
        assert (got / "checkpoint" / name).read_bytes() == (want / "checkpoint" / name).read_bytes(), name
    assert (got / "metrics.jsonl").read_text() == (want / "metrics.jsonl").read_text()


def kill_after_step(n: int) -> Hooks:
    def after_step(step: int) -> None:
        if step == n:
            raise Killed(step)

    return Hooks(after_step=after_step)


def test_the_reference_runs_stop_as_configured(reference):
    for name, reason, window in (("converges", "converged", [CONVERGES_AT, CONVERGED_END]),
                                 ("to the cap", "step cap", [STEPS - 3, STEPS])):
        lines = [json.loads(line) for line in (reference(name) / "metrics.jsonl").read_text().splitlines()]
        stop = lines[-1]["stop"]
        assert (stop["reason"], stop["step"], stop["lr_decay"]) == (reason, window[1], window)
        lrs = {r["step"]: r["lr"] for r in lines if "lr" in r}
        base = OptimConfig.lr
        assert [lrs[s] for s in range(window[0] - 1, window[1])] == pytest.approx([base, base, base * 2 / 3, base / 3])


@pytest.mark.parametrize("name, n", [("converges", n) for n in range(1, CONVERGED_END + 1)]
                         + [("to the cap", n) for n in range(1, STEPS + 1)])
def test_killed_after_any_step_then_run_again_ends_bitwise_equal(tiny_dropout, reference, tmp_path, name, n):
    cfg = config(tiny_dropout, tmp_path / "run", name)
    with pytest.raises(Killed):
        train(cfg, kill_after_step(n))
    last = (n - 1) // CKPT_EVERY * CKPT_EVERY  # the hook ran before step n's own checkpoint
    state = tmp_path / "run" / "checkpoint" / "state.json"
    assert json.loads(state.read_text())["step"] == last if last else not state.exists()
    train(cfg)
    assert_same_run(tmp_path / "run", reference(name))


CHILD = """
import json, os, signal, sys
import torch
from tokweight.training.loop.faults import Hooks
from tokweight.training.config.migrations import train_config_from
from tokweight.training.loop.train import run

def kill_self(step):
    if step == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":  # loader workers (forkserver) import this module too
    torch.set_num_threads(1)
    run(train_config_from(json.loads(open(sys.argv[1]).read())), Hooks(after_checkpoint=kill_self))
"""


def kill_group(pgid: int) -> None:
    """SIGKILL to what is left of a child's session (its loader worker and forkserver), as a preemption
    takes the whole job."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # nothing left
        pass


def train_in_child(cfg: TrainConfig, tmp_path: Path, kill_after_checkpoint: int = 0) -> int:
    """``run(cfg)`` in a child process that SIGKILLs itself once the checkpoint of the given step is committed
    (0: never); its exit code. One string-hash seed for every child: validation sums a metric over a set of
    labels, whose order follows it."""
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg.to_json()))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"}
    with (tmp_path / "child.log").open("w") as log:  # a file, not a pipe: the loader worker may outlive the child
        child = subprocess.Popen([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "cfg.json"),
                                  str(kill_after_checkpoint)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            return child.wait(timeout=300)
        finally:
            kill_group(child.pid)


def test_sigkill_right_after_a_checkpoint_then_run_again_ends_bitwise_equal(tiny_dropout, tmp_path):
    """A real SIGKILL that cannot race: the child kills itself once checkpoint 4 is committed, loader
    worker and all; a second child runs it again, a third runs it uninterrupted."""
    runs = {name: config(tiny_dropout, tmp_path / name / "run", "to the cap") for name in ("killed", "whole")}
    for name in runs:
        (tmp_path / name).mkdir(exist_ok=True)
    code = train_in_child(runs["killed"], tmp_path / "killed", kill_after_checkpoint=4)
    assert code == -signal.SIGKILL, (tmp_path / "killed" / "child.log").read_text()[-2000:]
    assert json.loads((tmp_path / "killed" / "run" / "checkpoint" / "state.json").read_text())["step"] == 4
    assert train_in_child(runs["killed"], tmp_path / "killed") == 0
    assert train_in_child(runs["whole"], tmp_path / "whole") == 0
    assert_same_run(tmp_path / "killed" / "run", tmp_path / "whole" / "run")


def fail_write(k: int, code: int) -> Hooks:
    """OSError(code) at the k-th checkpoint file write of the run (5 files per checkpoint)."""
    writes = []

    def before_write(path: Path) -> None:
        writes.append(path)
        if len(writes) == k:
            raise OSError(code, os.strerror(code), str(path))

    return Hooks(before_write=before_write)


@pytest.mark.parametrize("k, code", [(6, errno.ENOSPC), (10, errno.ENOSPC), (8, errno.EIO)])
def test_a_failed_checkpoint_write_leaves_the_previous_one_and_the_run_completes(tiny_dropout, reference, tmp_path,
                                                                               k, code):
    """Writes 6-10 are the checkpoint of step 4 (model, optimizer, RNG, vocab, state.json last)."""
    cfg = config(tiny_dropout, tmp_path / "run", "to the cap")
    with pytest.raises(CheckpointWriteError) as failed:
        train(cfg, fail_write(k, code))
    message = str(failed.value)
    assert "\n" not in message and os.strerror(code) in message and "rerun the same command" in message
    assert failed.value.errno == code
    left = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert left == ["checkpoint", "config.json", "metrics.jsonl"]  # no checkpoint.tmp, nothing half-committed
    assert json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())["step"] == 2
    train(cfg)
    assert_same_run(tmp_path / "run", reference("to the cap"))


def test_killed_between_the_checkpoint_renames_resumes_from_the_previous_one(tiny_dropout, reference, tmp_path):
    """save_checkpoint renames checkpoint -> checkpoint.old, then checkpoint.tmp -> checkpoint: a kill
    between the two leaves no checkpoint/, and the previous one (checkpoint.old) is the committed one."""
    cfg = config(tiny_dropout, tmp_path / "run", "to the cap")
    run_dir = tmp_path / "run"

    def keep_two_then_die(step: int) -> None:
        if step == 2:
            shutil.copytree(run_dir / "checkpoint", tmp_path / "step2")
        if step == 4:
            raise Killed(step)

    with pytest.raises(Killed):
        train(cfg, Hooks(after_checkpoint=keep_two_then_die))
    (run_dir / "checkpoint").rename(run_dir / "checkpoint.tmp")  # step 4's, complete but not swapped in
    (tmp_path / "step2").rename(run_dir / "checkpoint.old")
    train(cfg)
    assert_same_run(run_dir, reference("to the cap"))
