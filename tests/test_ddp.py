"""Two CPU ranks under torchrun (gloo) step like one process with the same global batch,
for every objective, the ones that couple a batch's examples included."""

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from tokweight.training.configs import CVAEConfig
from tokweight.training.convergence import StopRule
from tokweight.training.train import run
from tokweight.training.train_config import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

TIMEOUT_S = 240
ROOT = Path(__file__).resolve().parents[1]
MAX_RELATIVE_DIFFERENCE = 0.005  # |theta_2 - theta_1| / |theta_1 - theta_init|, over all parameters


def torchrun(args: list[str]) -> subprocess.CompletedProcess:
    """torchrun in its own session, with a hard timeout that ends the launcher and its workers."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
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
    assert proc.returncode == 0, out[-3000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def relative_difference(run_a: Path, run_b: Path, init_ckpt: Path) -> float:
    """|theta_b - theta_a| / |theta_a - theta_init| over every backbone parameter and head."""
    a = load_file(run_a / "checkpoint" / "model.safetensors")
    b = load_file(run_b / "checkpoint" / "model.safetensors")
    init = {f"backbone.{k}": v for k, v in load_file(init_ckpt / "model.safetensors").items()}
    names = sorted(k for k in a if k in init)  # the heads start random in both; compare what has an init
    moved = torch.cat([(a[k] - init[k]).flatten() for k in names]).norm()
    apart = torch.cat([(b[k] - a[k]).flatten() for k in a]).norm()
    assert moved > 0, "training did not move the weights"
    return float(apart / moved)


def common(tiny, tiny_store, out: Path, batch_size: int, lanes: int | None = None) -> TrainConfig:
    data, ckpt = tiny
    return TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), store=str(tiny_store), out=str(out),
                                lanes=lanes, num_workers=0),
                       optim=OptimConfig(steps=4, batch_size=batch_size, seed=3),
                       log=LogConfig(log_every=1, ckpt_every=4))


def test_two_ranks_equal_one_process_with_the_global_batch(tiny, tiny_store, tmp_path):
    """The README's command line: ``torchrun ... -m tokweight.cli train``, lanes defaulting to one per rank."""
    data, ckpt = tiny
    run(common(tiny, tiny_store, tmp_path / "one", batch_size=8, lanes=2))
    torchrun(["-m", "tokweight.cli", "train", "--checkpoint", str(ckpt), "--data", str(data), "--store",
              str(tiny_store), "--out", str(tmp_path / "two"), "--steps", "4", "--batch-size", "4", "--log-every",
              "1", "--ckpt-every", "4", "--num-workers", "0", "--seed", "3"])
    assert relative_difference(tmp_path / "one", tmp_path / "two", Path(ckpt)) < MAX_RELATIVE_DIFFERENCE
    # the exact validation pass saw every val example once across the two ranks; the stop line follows it
    final, stop = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()[-2:]]
    assert final["examples"] == 128 and stop["stop"]["reason"] == "step cap" and stop["stop"]["step"] == 4


COUPLED = {  # objectives with a term over the whole batch, and what couples it
    "estep-balanced": lambda cfg: replace(cfg, estep=replace(cfg.estep, mode="hard", balance_iters=3)),  # Sinkhorn
    # v normalised to batch mean 1
    "example-inverse": lambda cfg: replace(cfg, loss=replace(cfg.loss, weighting="example-inverse")),
    "free-bits": lambda cfg: replace(cfg, loss=replace(cfg.loss, free_bits=0.5)),  # floor on the batch-mean KL
    # the continuous latent's own defaults (the hard E-step over its draws, per example)
    "free-bits-continuous": lambda cfg: TrainConfig(cfg.io, cvae=CVAEConfig(latent="continuous"), optim=cfg.optim,
                                                    log=cfg.log, loss=replace(cfg.loss, free_bits=0.1)),
}


def test_coupled_objectives_on_two_ranks_equal_one_process(tiny, tiny_store, tmp_path):
    ckpt = Path(tiny[1])
    two = [COUPLED[name](common(tiny, tiny_store, tmp_path / name / "two", batch_size=4)) for name in COUPLED]
    (tmp_path / "runs.json").write_text(json.dumps([cfg.to_json() for cfg in two]))
    torchrun(["-m", "tests.ddp_runs", str(tmp_path / "runs.json")])
    differences = {}
    for name, make in COUPLED.items():
        run(make(common(tiny, tiny_store, tmp_path / name / "one", batch_size=8, lanes=2)))
        differences[name] = relative_difference(tmp_path / name / "one", tmp_path / name / "two", ckpt)
    assert max(differences.values()) < MAX_RELATIVE_DIFFERENCE, differences


def test_two_ranks_resume_bitwise_and_stop_together(tiny, tiny_store, tmp_path):
    """Under torchrun: a run stopped at step 2 and run again to 4 ends bitwise where the uninterrupted run
    ends (each rank's stream and RNG state restored), so does a run with two starts where a single run from
    the chosen start's seed ends, and both ranks stop at the step the rule converges at
    (a rank that went on alone would hang the job into the timeout)."""
    whole = common(tiny, tiny_store, tmp_path / "whole", batch_size=4)
    part = common(tiny, tiny_store, tmp_path / "part", batch_size=4)
    stops = replace(common(tiny, tiny_store, tmp_path / "stops", batch_size=4),
                    loss=LossConfig(beta=0.3, beta_warmup_steps=1),
                    optim=replace(whole.optim, steps=6, stop=StopRule(patience=1, min_delta_objective=10.0,
                                                                      min_delta_mi=10.0)),
                    log=replace(whole.log, eval_every=1, eval_examples=32))
    # two starts of 2 steps (seeds 6 and 7), and a single run from each of their seeds
    starts = replace(common(tiny, tiny_store, tmp_path / "starts", batch_size=4),
                     optim=replace(whole.optim, starts=2, start_steps=2))
    singles = [replace(common(tiny, tiny_store, tmp_path / f"seed-{s}", batch_size=4),
                       optim=replace(whole.optim, seed=s)) for s in (6, 7)]
    runs = [whole, replace(part, optim=replace(part.optim, steps=2)), part, stops, starts, *singles]
    (tmp_path / "runs.json").write_text(json.dumps([cfg.to_json() for cfg in runs]))
    torchrun(["-m", "tests.ddp_runs", str(tmp_path / "runs.json")])
    chosen = json.loads((tmp_path / "starts" / "starts.json").read_text())["seed"]
    for name in ("model.safetensors", "optimizer.safetensors", "rng.safetensors"):
        assert (tmp_path / "part" / "checkpoint" / name).read_bytes() == \
            (tmp_path / "whole" / "checkpoint" / name).read_bytes(), name
        assert (tmp_path / "starts" / "checkpoint" / name).read_bytes() == \
            (tmp_path / f"seed-{chosen}" / "checkpoint" / name).read_bytes(), name
    stop = json.loads((tmp_path / "stops" / "metrics.jsonl").read_text().splitlines()[-1])["stop"]
    assert stop["reason"] == "converged" and stop["step"] == 2 and stop["best_step"] == 1  # counted from step 1
