import json
import math

import pytest

from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.config_files import preset, preset_config
from tokweight.pipeline.data.config import SynthConfig
from tokweight.pipeline.data.synth import consistent_at_t0, write_dataset
from tokweight.training.config.base import BaseTrainConfig
from tokweight.training.loop.train_base import run

TINY_BASE = preset("base", "tiny")
"""The tiny base preset's fields (tokweight/presets/base/tiny.toml)."""


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    write_dataset(preset_config(SynthConfig, "synth", "tiny", seed=0), root / "data")
    return root


def test_short_train_base_lowers_loss_and_writes_a_checkpoint(tiny_data):
    out = tiny_data / "base"
    result = run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(out), **{**TINY_BASE, "steps": 60}))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 60
    first = sum(r["loss"] for r in records[:5]) / 5
    last = sum(r["loss"] for r in records[-5:]) / 5
    assert last < 0.8 * first
    assert math.isfinite(result["val_nll"]) and "log_consistent_at_t0" in result
    assert 0 < result["train_nll"] < first  # as many training lines as val has, read by the trained model
    ckpt = load_checkpoint(out)
    assert ckpt.fingerprint == result["fingerprint"]
    assert ckpt.model.cfg.block_size >= max(2 * 5 + 6 + 2 + 4, 0)  # longest tiny sequence + latent slots


def test_same_seed_same_fingerprint(tiny_data, tmp_path):
    kw = {**TINY_BASE, "steps": 5}
    a = run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(tmp_path / "a"), **kw))
    b = run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(tmp_path / "b"), **kw))
    c = run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(tmp_path / "c"), **{**kw, "seed": 1}))
    assert a["fingerprint"] == b["fingerprint"] != c["fingerprint"]


def test_consistent_at_t0_matches_enumeration():
    from tokweight.pipeline.data.synth import generate

    cfg = preset_config(SynthConfig, "synth", "tiny")
    for s in list(generate(cfg, "val"))[:50]:
        n = consistent_at_t0(s, cfg)
        if s.t0 >= len(s.y) + 1:
            assert n is None
        else:
            assert 2 <= n <= len(cfg.strategies)  # one left before t0 would have made t0 earlier


def test_k_max_flag_reaches_the_vocabulary_checkpoint_and_fingerprint(tiny_data, tmp_path):
    from click.testing import CliRunner

    from tokweight.cli import main

    args = ["train-base", "--data", str(tiny_data / "data"), "--preset", "tiny", "--steps", "3"]
    for name, extra in (("k8", []), ("k10", ["--k-max", "10"])):
        result = CliRunner().invoke(main, args + ["--out", str(tmp_path / name), *extra])
        assert result.exit_code == 0, result.output
    k8, k10 = load_checkpoint(tmp_path / "k8"), load_checkpoint(tmp_path / "k10")
    assert (k8.vocab.k_max, k10.vocab.k_max) == (8, 10) and k10.vocab.tokens[k10.vocab.latent_id(9)] == "<z_9>"
    assert k10.meta["train"]["k_max"] == 10
    assert json.loads((tmp_path / "k10" / "train_config.json").read_text())["k_max"] == 10
    assert k8.fingerprint != k10.fingerprint  # another vocabulary, another store
    bad = CliRunner().invoke(main, args + ["--out", str(tmp_path / "k0"), "--k-max", "0"])
    assert bad.exit_code != 0 and "k_max must be >= 1" in bad.output and not (tmp_path / "k0").exists()


def test_train_with_more_latent_values_than_tokens_appends_them_to_its_copy(tiny, tmp_path):
    from tokweight.pipeline.models.checkpoint import load_checkpoint
    from tokweight.training.config.components import CVAEConfig
    from tokweight.training.loop.run_dir import load_run
    from tokweight.training.loop.train import run as train
    from tokweight.training.config.train import IOConfig, LossConfig, OptimConfig, TrainConfig

    data, ckpt = tiny  # built with the default k_max = 8
    before = load_checkpoint(ckpt)
    cfg = TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), out=str(tmp_path / "run"), num_workers=0),
                      cvae=CVAEConfig(k=10), loss=LossConfig(policy="frozen"), optim=OptimConfig(steps=1, batch_size=4))
    train(cfg)
    _, model, vocab, _ = load_run(tmp_path / "run")
    assert vocab.k_max == 10 and len(vocab) == len(before.vocab) + 2 == model.backbone.cfg.vocab_size
    assert vocab.tokens[: len(before.vocab)] == before.vocab.tokens and vocab.tokens[-1] == "<z_9>"
    assert load_checkpoint(ckpt).fingerprint == before.fingerprint  # the checkpoint itself is untouched


def test_a_k_max_checkpoint_trains_that_many_latent_values(tiny_data, tmp_path):
    from tokweight.training.config.components import CVAEConfig
    from tokweight.training.loop.train import run as train
    from tokweight.training.config.train import IOConfig, LossConfig, OptimConfig, TrainConfig

    run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(tmp_path / "base"),
                        **{**TINY_BASE, "steps": 3, "k_max": 10}))
    result = train(TrainConfig(IOConfig(checkpoint=str(tmp_path / "base"), data=str(tiny_data / "data"),
                                        out=str(tmp_path / "run"), num_workers=0),
                               cvae=CVAEConfig(k=10), loss=LossConfig(policy="frozen"),
                               optim=OptimConfig(steps=1, batch_size=4)))
    assert len(result["usage"]) == 10


def test_the_base_reports_its_nll_on_the_z_conditioned_template(tiny_data, tmp_path):
    """val_nll_zcond is the val NLL with one <z_0> slot, the template every CVAE decoder starts from: a base
    never shown it reads it worse, relative to its z-free NLL, than one shown nothing else."""
    kw = {**TINY_BASE, "steps": 60}
    gap = {}
    for rate in (0.0, 1.0):
        result = run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(tmp_path / str(rate)), zcond_rate=rate, **kw))
        gap[rate] = result["val_nll_zcond"] - result["val_nll"]
    assert gap[0.0] > gap[1.0] + 0.05


def test_min_slots_trains_only_the_counts_from_it_to_max_slots(tiny_data, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tokweight.cli import main
    from tokweight.training.loop import train_base

    drawn = []
    batch = train_base.EncodedSplit.batch

    def spy(self, idx, slots=None, latent=None):
        drawn.extend(slots or [])
        return batch(self, idx, slots, latent)

    monkeypatch.setattr(train_base.EncodedSplit, "batch", spy)
    args = ["train-base", "--data", str(tiny_data / "data"), "--preset", "tiny", "--steps", "20"]
    result = CliRunner().invoke(main, args + ["--out", str(tmp_path / "s4"), "--min-slots", "4"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "s4" / "train_config.json").read_text())["min_slots"] == 4
    assert set(drawn) == {0, 4}  # z-free or the 4 slots the prefix reads; evaluation reads 4 too
    drawn.clear()
    run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(tmp_path / "s1"),
                        **{**TINY_BASE, "steps": 20}))
    assert set(drawn) == {0, 1, 2, 3, 4}
    bad = CliRunner().invoke(main, args + ["--out", str(tmp_path / "s5"), "--min-slots", "5"])
    assert bad.exit_code != 0 and "min_slots <= max_slots" in bad.output and not (tmp_path / "s5").exists()


def test_train_base_warns_on_stderr_when_its_training_lines_read_as_learnt(tiny_data, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tokweight.cli import main
    from tokweight.training.loop import train_base

    args = ["train-base", "--data", str(tiny_data / "data"), "--preset", "tiny", "--steps", "3"]
    quiet = CliRunner().invoke(main, args + ["--out", str(tmp_path / "a")])
    assert quiet.exit_code == 0 and "has learnt the training lines" not in quiet.stderr  # 3 steps learn nothing
    monkeypatch.setattr(train_base, "MEMORISED", 100.0)  # any base now reads as having learnt its lines
    loud = CliRunner().invoke(main, args + ["--out", str(tmp_path / "b")])
    assert loud.exit_code == 0 and loud.stderr.count("has learnt the training lines") == 1
    assert json.loads(loud.stdout)["train_nll"] > 0  # the report on stdout stays JSON


def test_a_base_that_learnt_its_training_lines_is_named():
    from tokweight.training.loop.train_base import memorised_line

    line = memorised_line(0.150, 0.418)  # the walk-through's base, trained 3000 steps on its 3998 lines
    assert line.startswith("warning:") and "0.150" in line and "0.418" in line and "(0.36 of it)" in line
    assert "\n" not in line
    assert memorised_line(0.411, 0.411) is None and memorised_line(0.099, 0.123) is None  # other lines; K = 4
    assert memorised_line(0.0, 0.0) is None
