import json
import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.training.objective.baselines import Frozen, dynamic
from tokweight.training.config.migrations import train_config_from
from tokweight.training.cvae.model import CVAEConfig, build_cvae
from tokweight.training.loop.batches import StreamSpec
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.loop.run_dir import load_run
from tokweight.training.objective.schedules import Schedule, lr_at, lr_decay_window
from tokweight.training.loop.stream import EvalStream, loader
from tokweight.training.loop.train import run
from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

def config(tiny, out, steps=6, **groups):
    data, ckpt = tiny
    base = dict(io=IOConfig(checkpoint=str(ckpt), data=str(data), out=str(out), num_workers=0),
                loss=LossConfig(policy="frozen"), optim=OptimConfig(steps=steps, batch_size=8),
                log=LogConfig(log_every=2, grad_diag_every=3, ckpt_every=2, eval_batch_size=64))
    return TrainConfig(**{**base, **groups})


def optim(cfg, **kw):
    return replace(cfg, optim=replace(cfg.optim, **kw))


def elsewhere(cfg, out):
    return replace(cfg, io=replace(cfg.io, out=str(out)))


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_run_writes_config_metrics_checkpoint_and_resumes(tiny, tmp_path):
    cfg = config(tiny, tmp_path / "run", steps=4)
    result = run(cfg)
    assert result["split"] == "val" and result["examples"] == 128 and 0 <= result["mi"] <= math.log(4)
    assert train_config_from(json.loads((tmp_path / "run" / "config.json").read_text())) == cfg
    recs = lines(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in recs if "loss" in r] == [0, 1, 3]  # log_every 2, diagnostics at step 0 and 3
    assert {"grad_recon", "grad_kl", "grad_ratio"} <= set(recs[0])
    assert json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())["step"] == 4
    # resume: the same run, longer, continues from step 4
    run(optim(cfg, steps=6))
    recs = lines(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in recs if "loss" in r][-2:] == [3, 5]
    _, model, _, meta = load_run(tmp_path / "run")
    assert meta["step"] == 6
    # another config in the same directory is refused
    with pytest.raises(ValueError, match="another config"):
        run(optim(cfg, steps=8, lr=5e-4))


def test_same_seed_same_parameters(tiny, tmp_path):
    cfg = config(tiny, tmp_path / "a", cvae=CVAEConfig(latent="continuous", z_dim=3))
    cfg = replace(cfg, io=replace(cfg.io, num_workers=1))
    run(cfg)
    run(elsewhere(cfg, tmp_path / "b"))
    a = load_file(tmp_path / "a" / "checkpoint" / "model.safetensors")
    b = load_file(tmp_path / "b" / "checkpoint" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    run(optim(elsewhere(cfg, tmp_path / "c"), seed=1))
    c = load_file(tmp_path / "c" / "checkpoint" / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_dynamic_baseline_is_the_z_free_pass_and_equals_frozen_at_init(tiny):
    data, ckpt_dir = tiny
    ckpt = load_checkpoint(ckpt_dir)
    model = build_cvae(ckpt.model, ckpt.vocab, CVAEConfig(k=2)).eval()
    spec = StreamSpec(urls=split_urls(data, "val"), vocab=ckpt.vocab, slots=1, block_size=ckpt.model.cfg.block_size,
                      batch_size=16)
    batch = next(iter(loader(EvalStream(spec), 0)))
    frozen = Frozen(ckpt.model)
    out = model(batch)
    torch.testing.assert_close(dynamic(batch, out), frozen(batch), atol=1e-6, rtol=0)
    assert (dynamic(batch, out)[batch.zfree.mask] > 0).all()


def test_config_refusals(tiny, tmp_path):
    with pytest.raises(ValueError, match="log K"):
        config(tiny, tmp_path, loss=LossConfig(policy="frozen", free_bits=math.log(4)))
    with pytest.raises(ValueError, match="needs --store"):
        config(tiny, tmp_path, loss=LossConfig(policy="precomputed"))
    with pytest.raises(ValueError, match="weighting"):
        config(tiny, tmp_path, loss=LossConfig(policy="frozen", weighting="median"))
    with pytest.raises(ValueError, match=r"^bogus: no such field; TrainConfig has"):
        train_config_from({**config(tiny, tmp_path).to_json(), "bogus": 1})
    with pytest.raises(ValueError, match=r"^loss.lr: no such field; loss has"):
        train_config_from({**config(tiny, tmp_path).to_json(), "loss": {"lr": 1e-3}})


def test_beta_schedules(tiny, tmp_path):
    def schedule(**loss) -> Schedule:
        return Schedule.of(config(tiny, tmp_path, loss=LossConfig(policy="frozen", **loss)))

    assert schedule(beta=0.5, beta_warmup_steps=0).at(7).beta == 0.5
    lin = schedule(beta=1.0, beta_warmup_steps=4)
    assert [lin.at(s).beta for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    with pytest.raises(ValueError):
        LossConfig(beta=1.0, beta_warmup_steps=-1)


def test_the_learning_rate_falls_to_0_over_the_last_fraction_of_the_run():
    assert lr_decay_window(600, 0.2) == (480, 600)  # a run to its cap: its last 120 steps
    assert lr_decay_window(600, 0.2, converged_at=300) == (300, 375)  # converged: 75 more make a fifth of 375
    assert lr_decay_window(600, 0.2, converged_at=550) == (550, 600)  # never past the cap
    assert lr_decay_window(600, 0.0) == (600, 600) and lr_decay_window(600, 0.0, converged_at=300) == (300, 300)
    assert [lr_at(1.0, s, (4, 8)) for s in range(3, 8)] == [1.0, 1.0, 0.75, 0.5, 0.25]
    with pytest.raises(ValueError, match="lr_decay is a fraction"):
        OptimConfig(lr_decay=1.0)


def test_a_bfloat16_forward_trains_close_to_float32(tiny, tmp_path):
    """--dtype bfloat16 (autocast; parameters and the head's log-softmax stay float32): the same run's first
    losses within bfloat16's precision of float32's, every step finite, the parameters still float32."""
    base = config(tiny, tmp_path / "f32", steps=3)
    run(base)
    run(replace(elsewhere(base, tmp_path / "bf16"), io=replace(elsewhere(base, tmp_path / "bf16").io, dtype="bfloat16")))
    f32, bf16 = ([r for r in lines(tmp_path / name / "metrics.jsonl") if "loss" in r] for name in ("f32", "bf16"))
    assert [r["step"] for r in f32] == [r["step"] for r in bf16] and all(math.isfinite(r["loss"]) for r in bf16)
    assert abs(bf16[0]["loss"] - f32[0]["loss"]) < 0.02 * abs(f32[0]["loss"])
    assert bf16[0]["loss"] != f32[0]["loss"]  # the forward did run in bfloat16
    assert all(t.dtype == torch.float32 for t in load_file(tmp_path / "bf16" / "checkpoint" / "model.safetensors").values())
    with pytest.raises(ValueError, match="dtype"):
        replace(base, io=replace(base.io, dtype="float16"))


def test_a_job_says_once_what_trains_and_that_its_checkpoint_learnt_the_training_lines(tiny, tiny_store, tmp_path,
                                                                                        capsys, monkeypatch):
    """The store's mean b on train against val is read before any step; below MEMORISED of it the job warns, once
    (its first start), as it says once what trains."""
    import tokweight.training.loop.train_base as train_base

    data, ckpt = tiny
    io = IOConfig(checkpoint=str(ckpt), data=str(data), out=str(tmp_path / "run"), store=str(tiny_store),
                  num_workers=0)
    cfg = config(tiny, io.out, io=io, loss=LossConfig(), optim=OptimConfig(steps=4, batch_size=8, starts=2,
                                                                           start_steps=2))
    run(cfg)
    err = capsys.readouterr().err
    assert err.count("parameters (") == 1 and "has learnt the training lines" not in err
    monkeypatch.setattr(train_base, "MEMORISED", 100.0)  # any store now reads as learnt
    run(elsewhere(cfg, tmp_path / "again"))
    err = capsys.readouterr().err
    assert err.count("parameters (") == 1 and err.count("has learnt the training lines") == 1
    assert "on the train split against" in err and "docs/own-task.md" in err


def test_the_collective_timeout_covers_a_checkpoint_write_and_every_rank_waits_for_it(tiny, tmp_path, monkeypatch):
    """The job's process group waits collective_timeout_s (30 min by default, not 2), and every checkpoint ends at a
    barrier that every rank reaches after rank 0's write."""
    import tokweight.training.loop.train as train_module
    from tokweight.pipeline.ranks import Ranks

    assert IOConfig(checkpoint="c", data="d", out="o").collective_timeout_s >= 1800
    with pytest.raises(ValueError, match="collective_timeout_s must be > 0"):
        IOConfig(checkpoint="c", data="d", out="o", collective_timeout_s=0)
    made, barriers = [], []

    class Recorded(Ranks):
        def __init__(self, timeout_s, backend):
            made.append(timeout_s)
            super().__init__(timeout_s, backend)

        def barrier(self):
            barriers.append(True)

    monkeypatch.setattr(train_module, "Ranks", Recorded)
    cfg = config(tiny, tmp_path / "run", steps=4)
    run(replace(cfg, io=replace(cfg.io, collective_timeout_s=3600.0)))
    assert made == [3600.0]
    assert len(barriers) >= 2  # ckpt_every 2 over 4 steps: the checkpoints at steps 2 and 4
