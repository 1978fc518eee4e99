"""Two CPU ranks under torchrun (gloo) step like one process with the same global batch."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from training.train import TrainConfig, run

TIMEOUT_S = 180


def torchrun(args: list[str], env: dict) -> subprocess.CompletedProcess:
    """torchrun in its own session, with a hard timeout that ends the launcher and its workers."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "pipeline.cli", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher forwards it to its workers
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        raise AssertionError(f"torchrun hung for {TIMEOUT_S} s:\n{out[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def test_two_ranks_equal_one_process_with_the_global_batch(tiny, tiny_store, tmp_path):
    data, ckpt = tiny
    common = dict(checkpoint=str(ckpt), data=str(data), store=str(tiny_store), policy="precomputed", steps=4,
                  log_every=1, grad_diag_every=2, ckpt_every=4, num_workers=0, seed=3)
    run(TrainConfig(out=str(tmp_path / "one"), batch_size=8, **common))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = torchrun(["train", "--checkpoint", str(ckpt), "--data", str(data), "--store", str(tiny_store),
                     "--out", str(tmp_path / "two"), "--steps", "4", "--batch-size", "4", "--log-every", "1",
                     "--grad-diag-every", "2", "--ckpt-every", "4", "--num-workers", "0", "--seed", "3"], env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    one = load_file(tmp_path / "one" / "checkpoint" / "model.safetensors")
    two = load_file(tmp_path / "two" / "checkpoint" / "model.safetensors")
    init = load_file(Path(ckpt) / "model.safetensors")
    assert not torch.equal(one["backbone.wte.weight"], init["wte.weight"])  # training moved the weights
    for name in one:
        torch.testing.assert_close(two[name], one[name], atol=2e-5, rtol=1e-4, msg=name)
    # the exact validation pass saw every val example once across the two ranks
    last = (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()[-1]
    assert '"examples": 128' in last
