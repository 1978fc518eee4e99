"""Synthetic generator: strategies against references, t0 against brute force, determinism."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokweight.pipeline.data.shards import iter_samples, resolve_shards, shard_name
from tokweight.config_files import preset_config
from tokweight.pipeline.data.synth import (END_OF_Y, STRATEGIES, candidate_sequences, compute_t0, consistent_at, generate,
                                      write_dataset)
from tokweight.pipeline.data.config import FILLER_SYMBOL, SynthConfig

REFERENCE = {  # written independently of pipeline.data.synth
    "copy": lambda x: list(x),
    "reverse": lambda x: [x[len(x) - 1 - i] for i in range(len(x))],
    "sort": lambda x: sorted(x),
    "sort-desc": lambda x: sorted(x)[::-1],
    "rotate-left": lambda x: list(x[1:]) + list(x[:1]),
    "rotate-right": lambda x: [x[(i - 1) % len(x)] for i in range(len(x))],
    "swap-pairs": lambda x: [x[i ^ 1] if (i ^ 1) < len(x) else x[i] for i in range(len(x))],
    "evens-odds": lambda x: [x[i] for i in range(len(x)) if i % 2 == 0] + [x[i] for i in range(len(x)) if i % 2],
}

TINY = preset_config(SynthConfig, "synth", "tiny", n_train=40, n_val=10, n_test=10, shard_size=16)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategies_match_reference(name):
    assert set(STRATEGIES) == set(REFERENCE)
    rng = np.random.default_rng(1)
    for _ in range(200):
        x = tuple(rng.integers(0, 30, size=rng.integers(0, 9)).tolist())
        assert list(STRATEGIES[name](x)) == REFERENCE[name](x)
        assert isinstance(STRATEGIES[name](x), tuple)


def _brute_t0(x, strategy, cfg):
    """t0 by definition: the shortest S prefix that only the true strategy produces."""
    seqs = {s: [FILLER_SYMBOL] * cfg.header_len + REFERENCE[s](list(x)) + [END_OF_Y] for s in cfg.strategies}
    true = seqs[strategy]
    for t in range(len(true)):
        if [s for s, seq in seqs.items() if seq[: t + 1] == true[: t + 1]] == [strategy]:
            return t
    return len(true)


@settings(max_examples=300, deadline=None)
@given(x=st.lists(st.integers(0, 3), min_size=1, max_size=6),
       header_len=st.integers(0, 3),
       names=st.lists(st.sampled_from(sorted(STRATEGIES)), min_size=1, max_size=5, unique=True),
       pick=st.integers(0, 4))
def test_t0_matches_brute_force(x, header_len, names, pick):
    cfg = replace(TINY, strategies=tuple(names), header_len=header_len)
    strategy = names[pick % len(names)]
    candidates = candidate_sequences(tuple(x), cfg)
    t0 = compute_t0(candidates, strategy)
    assert t0 == _brute_t0(x, strategy, cfg)
    T = len(x) + header_len + 1
    assert t0 >= header_len or len(names) == 1
    if t0 < T:  # decided at t0, undecided before it
        assert consistent_at(candidates, strategy, t0 + 1) == 1
        assert consistent_at(candidates, strategy, t0) >= 2 or t0 == 0


def test_t0_never_unique_is_T():
    cfg = replace(TINY, header_len=2)
    candidates = candidate_sequences((0, 1, 2), cfg)  # already sorted: copy == sort everywhere
    assert compute_t0(candidates, "copy") == compute_t0(candidates, "sort") == 2 + 3 + 1
    assert compute_t0(candidates, "reverse") == 6  # and reverse == sort-desc
    assert consistent_at(candidates, "copy", 0) == 4 and consistent_at(candidates, "copy", 6) == 2
    candidates = candidate_sequences((0, 2, 1), cfg)  # copy 0 2 1, reverse 1 2 0, sort 0 1 2, sort-desc 2 1 0
    assert {s: compute_t0(candidates, s) for s in candidates} == {"copy": 3, "reverse": 2, "sort": 3, "sort-desc": 2}
    assert consistent_at(candidates, "copy", 3) == 2 and consistent_at(candidates, "copy", 4) == 1


def test_generate_is_consistent_and_deterministic():
    cfg = replace(TINY, header_len=1)
    samples = list(generate(cfg, "train"))
    assert [s.key for s in samples] == [f"train-{i:07d}" for i in range(40)]
    alphabet = set(cfg.symbols())
    for s in samples:
        assert cfg.min_len <= len(s.x) <= cfg.max_len and set(s.x) | set(s.y) <= alphabet
        ids = [cfg.symbols().index(tok) for tok in s.x]
        y_ids = [cfg.symbols().index(tok) for tok in s.y[1:]]
        assert s.y[0] == FILLER_SYMBOL and y_ids == REFERENCE[s.strategy](ids)
        assert s.t0 == _brute_t0(ids, s.strategy, cfg)
    assert samples == list(generate(cfg, "train"))
    assert samples != list(generate(replace(cfg, seed=1), "train"))
    assert [s.x for s in generate(cfg, "val")] != [s.x for s in samples[:10]]


def test_a_trailer_lengthens_y_and_leaves_t0():
    cfg = replace(TINY, n_train=40)
    trailed = replace(cfg, trailer_len=5)
    assert trailed.symbols() == cfg.symbols() + [FILLER_SYMBOL]
    for plain, long in zip(generate(cfg, "train"), generate(trailed, "train")):
        assert long.y == plain.y + (FILLER_SYMBOL,) * 5 and long.x == plain.x and long.strategy == plain.strategy
        decided = plain.t0 < len(plain.y) + 1  # otherwise t0 = T, which the trailer lengthens
        assert long.t0 == (plain.t0 if decided else len(long.y) + 1)


def test_synth_cli_writes_the_trailer(tmp_path):
    from click.testing import CliRunner

    from tokweight.cli import main

    result = CliRunner().invoke(main, ["synth", "--out", str(tmp_path / "d"), "--preset", "tiny", "--trailer-len", "3"])
    assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "d" / "dataset.json").read_text())
    assert info["config"]["trailer_len"] == 3
    samples = [s for _, s in iter_samples([str(u) for u in resolve_shards(tmp_path / "d" / "train")[1]])]
    assert samples and all(s.y[-3:] == (FILLER_SYMBOL,) * 3 for s in samples)


def test_x_dependent_prior_favours_x0_strategy():
    cfg = replace(TINY, prior="x-dependent", alpha=6.0, n_train=2000)
    hits = [cfg.strategies.index(s.strategy) == cfg.symbols().index(s.x[0]) % 4 for s in generate(cfg, "train")]
    assert abs(np.mean(hits) - 7 / 10) < 0.05  # (1 + alpha) / (K + alpha)
    uniform = [cfg.strategies.index(s.strategy) == cfg.symbols().index(s.x[0]) % 4
               for s in generate(replace(cfg, prior="uniform"), "train")]
    assert abs(np.mean(uniform) - 1 / 4) < 0.05


def test_symbols_are_safe_and_distinct():
    symbols = SynthConfig(alphabet_size=40, header_len=1).symbols()
    assert len(set(symbols)) == 41 and symbols[:2] == ["a", "b"] and symbols[26] == "s26"
    assert all(s.isprintable() and s.split() == [s] and "." not in s and "/" not in s
               and not s.startswith("<") for s in symbols)


def test_weighted_prior_draws_each_strategy_at_its_weight_whatever_x():
    cfg = replace(TINY, prior="weighted", weights=(6.0, 2.0, 1.0, 1.0), n_train=4000)
    samples = list(generate(cfg, "train"))
    shares = [np.mean([s.strategy == name for s in samples]) for name in cfg.strategies]
    assert np.allclose(shares, [0.6, 0.2, 0.1, 0.1], atol=0.03)
    favoured = [s.strategy == cfg.strategies[0] for s in samples if cfg.symbols().index(s.x[0]) % 4 == 1]
    assert abs(np.mean(favoured) - 0.6) < 0.06  # not x-dependent: the same share for any x[0]


@pytest.mark.parametrize("bad", [dict(alphabet_size=1), dict(min_len=0), dict(min_len=5, max_len=4),
                                 dict(strategies=("copy", "shuffle")), dict(strategies=()),
                                 dict(strategies=("copy", "copy")), dict(header_len=-1), dict(trailer_len=-2),
                                 dict(prior="zipf"), dict(alpha=-1.0), dict(prior="weighted"),
                                 dict(weights=(1.0, 1.0, 1.0, 1.0)), dict(prior="weighted", weights=(1.0, 1.0)),
                                 dict(prior="weighted", weights=(1.0, 0.0, 1.0, 1.0)), dict(n_val=-1), dict(shard_size=0),
                                 dict(seed=-3)])
def test_config_validation(bad):
    with pytest.raises(ValueError):
        SynthConfig(**bad)


def test_write_dataset_layout_and_byte_determinism(tmp_path):
    info = write_dataset(TINY, tmp_path / "a")
    again = write_dataset(TINY, tmp_path / "b")
    other = write_dataset(replace(TINY, seed=7), tmp_path / "c")
    on_disk = json.loads((tmp_path / "a" / "dataset.json").read_text())
    assert on_disk == info and info["generator"] == "tokweight.synth"
    assert info["config"]["strategies"] == list(TINY.strategies) == info["strategies"]
    assert {k: v["samples"] for k, v in info["splits"].items()} == {"train": 40, "val": 10, "test": 10}
    root, shards = resolve_shards(tmp_path / "a")
    assert [shard_name(root, p) for p in shards] == sorted(
        n for v in info["splits"].values() for n in v["shards"])
    assert info["splits"]["train"]["shards"] == [f"train/shard-00000{i}.tar" for i in range(3)]
    assert again == info and other != info
    for name in info["splits"]["train"]["shards"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "train/shard-000000.tar").read_bytes() != (tmp_path / "c" / "train/shard-000000.tar").read_bytes()
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    assert (tmp_path / "a" / files[1]).read_bytes() != (tmp_path / "c" / files[1]).read_bytes()
    assert other["config"]["seed"] == 7 and other["stats"] != info["stats"]
    read = [s for _, s in iter_samples([tmp_path / "a" / n for n in info["splits"]["train"]["shards"]])]
    assert read == list(generate(TINY, "train"))
    T = [len(s.y) + 1 for s in read]
    assert math.isclose(info["splits"]["train"]["stats"]["mean_T"], np.mean(T))
    with pytest.raises(FileExistsError):
        write_dataset(TINY, tmp_path / "a")
    smaller = write_dataset(replace(TINY, n_train=10), tmp_path / "a", overwrite=True)
    assert len(resolve_shards(tmp_path / "a" / "train")[1]) == len(smaller["splits"]["train"]["shards"]) == 1


def test_default_preset_is_dilute():
    """The default preset's mean T/(t0+1) is >= 8 (measured on a slice of its train split)."""
    cfg = preset_config(SynthConfig, "synth", "default", n_train=2000)
    ratios = [(len(s.y) + 1) / (s.t0 + 1) for s in generate(cfg, "train")]
    assert np.mean(ratios) >= 8
