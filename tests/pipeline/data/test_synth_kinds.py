"""The synthetic kinds whose strategies write different things: outputs against hand-written and independent
references, t0 against brute force, K 2..8, splits, determinism, labels and eval's execution check; the
permutation kind's data byte for byte as before kinds existed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest

from tokweight.config_files import preset_config
from tokweight.pipeline.data.labels import load_labels
from tokweight.pipeline.data.shards import iter_samples, resolve_shards
from tokweight.pipeline.data.synth import (END_OF_Y, candidate_sequences, config_dict, generate, kind_strategies,
                                      write_dataset)
from tokweight.pipeline.data.config import FILLER_SYMBOL, SynthConfig
from tokweight.pipeline.data.synth_kinds import KIND_STRATEGIES, MONTHS, PROCEDURES, strategy_output
from tokweight.pipeline.tokens.vocab import Vocab

KINDS = ("lexical", "format", "procedure")


def small(kind: str, k: int = 4, **fields) -> SynthConfig:
    sizes = dict(n_train=300, n_val=60, n_test=60, shard_size=100)
    return preset_config(SynthConfig, "synth", kind, strategies=list(KIND_STRATEGIES[kind][:k]), **(sizes | fields))


def _brute_t0(seqs: dict, strategy: str) -> int:
    true = seqs[strategy]
    for t in range(len(true)):
        if [s for s, seq in seqs.items() if list(seq[: t + 1]) == list(true[: t + 1])] == [strategy]:
            return t
    return len(true)


# ---------------------------------------------------------------- references


def _roman(n: int) -> str:  # digit by digit, not the subtractive table
    table = [("", "I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX"),
             ("", "X", "XX", "XXX", "XL", "L", "LX", "LXX", "LXXX", "XC"),
             ("", "C", "CC", "CCC", "CD", "D", "DC", "DCC", "DCCC", "CM"), ("", "M", "MM", "MMM")]
    return "".join(table[i][int(d)] for i, d in reversed(list(enumerate(reversed(str(n))))))


@pytest.mark.parametrize("n", [1, 4, 9, 14, 40, 90, 99, 255, 400, 444, 1994, 3999])
def test_procedures_match_independent_references(n):
    assert "".join(PROCEDURES["decimal"](n)) == str(n)
    assert "".join(PROCEDURES["binary"](n)) == format(n, "b")
    assert "".join(PROCEDURES["octal"](n)) == format(n, "o")
    assert "".join(PROCEDURES["hex"](n)) == format(n, "X")
    assert "".join(PROCEDURES["roman"](n)) == _roman(n)
    assert "".join(PROCEDURES["units-first"](n)) == str(n)[::-1]
    tally = PROCEDURES["tally"](n)
    assert [len(g) if g != ["-"] else 0 for g in _split(tally, "+")] == [int(d) for d in str(n)]


def _split(tokens, sep):
    out = [[]]
    for t in tokens:
        out.append([]) if t == sep else out[-1].append(t)
    return out


def test_words_and_a_written_line_of_each_kind():
    assert PROCEDURES["words"](241) == ["two", "hundred", "forty", "one"]
    assert PROCEDURES["words"](1013) == ["one", "thousand", "thirteen"]
    assert PROCEDURES["words"](70) == ["seventy"]
    proc = small("procedure", 8)
    x = tuple("190,4".replace(",", " , ").split())
    assert strategy_output(proc, "roman", x) == tuple("CXC") + (",",) + tuple("IV")
    assert strategy_output(proc, "words", x) == ("one", "hundred", "ninety", ",", "four")
    fmt = small("format", 8)
    x = ("c", ",", "7", ",", "1", "1", ",", "5", ",", "1", "2", "0")  # c, the 7th of November, 5 and 120
    assert " ".join(strategy_output(fmt, "csv", x)) == "c , 7 - 1 1 , 5 , 1 2 0"
    assert " ".join(strategy_output(fmt, "tsv", x)) == "c , 0 7 - 1 1 , 0 0 0 5 0 0 , 0 1 2 0 0 0"
    assert " ".join(strategy_output(fmt, "letter", x)) == "c , nov 7 , 5 , 1 2 0"
    assert " ".join(strategy_output(fmt, "ledger", x)) == "5 0 0 ; 1 2 0 0 0 ; c ; 7 nov"
    assert " ".join(strategy_output(fmt, "form", x)) == "NAME c | DATE 0 7 - 1 1 | AMT 0 0 0 5 | 0 1 2 0"
    assert " ".join(strategy_output(fmt, "fixed", x)) == "0 7 1 1 0 0 0 5 0 1 2 0 c"
    assert MONTHS[10] == "nov"
    lex = small("lexical", 8)  # a-d names; pair j's cognates: c % 4 == j
    x = tuple("aefg")  # concepts 0 4 5 6
    assert strategy_output(lex, "avi", x) == ("a", "ab4", "av5", "av6")
    assert strategy_output(lex, "boro", x) == ("bo6", "bo5", "bo-m", "ab4", "a")  # reversed, 5 is marked
    assert strategy_output(lex, "cema", x) == ("ce4", "a", "ce6", "ce-m", "cd5")  # pairs swapped, article
    assert strategy_output(lex, "dunu", x) == ("a", "cd5", "du-m", "du6", "du4")  # verb last


# ---------------------------------------------------------------- t0, K, splits, determinism


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_t0_is_exact_and_outputs_differ(kind, k):
    cfg = small(kind, k, header_len=1)
    samples = list(generate(cfg, "train"))
    assert {s.strategy for s in samples} == set(cfg.strategies) and len(cfg.strategies) == k
    distinct = 0
    for s in samples:
        seqs = {name: [FILLER_SYMBOL] + list(strategy_output(cfg, name, s.x)) + [END_OF_Y] for name in cfg.strategies}
        assert s.y == tuple(seqs[s.strategy][:-1])
        assert s.t0 == _brute_t0(seqs, s.strategy)
        distinct += len({tuple(v) for v in seqs.values()}) == k
    assert distinct >= 0.98 * len(samples)
    assert len({s.t0 for s in samples}) >= 2  # t0 varies per line
    assert set(cfg.symbols()) >= {t for s in samples for t in s.x + s.y}
    Vocab(symbols=tuple(cfg.symbols()))  # the symbol vocabulary takes them


@pytest.mark.parametrize("kind", KINDS)
def test_symbols_are_safe(kind):
    symbols = small(kind, 8, trailer_len=1).symbols()
    assert len(set(symbols)) == len(symbols) and symbols[-1] == FILLER_SYMBOL
    assert all(s.isprintable() and s.split() == [s] and "." not in s and "/" not in s and not s.startswith("<")
               for s in symbols)


@pytest.mark.parametrize("kind", KINDS)
def test_splits_differ_and_generation_is_deterministic(kind):
    cfg = small(kind)
    train, test = list(generate(cfg, "train")), list(generate(cfg, "test"))
    assert train == list(generate(cfg, "train")) and train != list(generate(replace(cfg, seed=1), "train"))
    assert len({s.x for s in test} & {s.x for s in train}) <= 0.02 * len(test)
    assert len({s.x for s in train}) >= 0.97 * len(train)
    assert cfg.min_len <= min(_items(kind, s.x) for s in train) and max(_items(kind, s.x) for s in train) <= cfg.max_len


def _items(kind: str, x: tuple) -> int:
    """x's length in the unit min_len..max_len count: concepts, amounts or numbers."""
    return {"lexical": len(x), "format": x.count(",") - 2, "procedure": x.count(",") + 1}[kind]


def test_weighted_prior_applies_to_the_kinds():
    cfg = small("procedure", prior="weighted", weights=(5.0, 3.0, 1.0, 1.0), n_train=2000)
    shares = [np.mean([s.strategy == n for s in generate(cfg, "train")]) for n in cfg.strategies]
    assert np.allclose(shares, [0.5, 0.3, 0.1, 0.1], atol=0.04)


@pytest.mark.parametrize("bad", [dict(kind="music"), dict(kind="lexical", strategies=("copy", "reverse")),
                                 dict(kind="format", strategies=("csv", "csv")), dict(kind="procedure", strategies=()),
                                 dict(kind="procedure", strategies=("decimal", "roman"), alphabet_size=4000)])
def test_kind_validation(bad):
    with pytest.raises(ValueError):
        SynthConfig(**bad)


# ---------------------------------------------------------------- the dataset, its labels, eval's check


@pytest.mark.parametrize("kind", KINDS)
def test_dataset_labels_and_strategy_execution(tmp_path, kind):
    from tokweight.training.evaluation.verdict import strategy_execution

    cfg = small(kind)
    info = write_dataset(cfg, tmp_path / "d")
    assert info["config"]["kind"] == kind and info["symbols"] == cfg.symbols()
    labels = load_labels(tmp_path / "d")
    assert labels.synth == cfg and labels.strategies == cfg.strategies
    samples = [s for _, s in iter_samples([str(u) for u in resolve_shards(tmp_path / "d" / "test")[1]])]
    assert samples == list(generate(cfg, "test"))
    for s in samples[:20]:
        assert labels.outputs(s.x)[s.strategy] == s.y
        assert s.t0 >= len(s.y) + 1 or labels.consistent_at_t0(s) >= 2  # y_<t0 fits more than one
    # value v decodes strategy v on every input: each value executes one strategy, all covered
    outputs = [[labels.outputs(s.x)[name] for name in cfg.strategies] for s in samples]
    result, hits = strategy_execution(samples, outputs, labels)
    assert result["control_accuracy"] == pytest.approx(1.0, abs=0.02) and result["coverage"] >= 3.9
    assert result["decode_strategy_mi"] == pytest.approx(np.log(4), abs=0.05)
    assert [h[0] for h in hits[:5]] == [cfg.strategies[0]] * 5


@pytest.mark.parametrize("k", [2, 8])
def test_synth_cli_k_takes_the_kinds_first_strategies(tmp_path, k):
    from click.testing import CliRunner

    from tokweight.cli import main

    result = CliRunner().invoke(main, ["synth", "--out", str(tmp_path / "d"), "--preset", "format", "--k", str(k)])
    assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "d" / "dataset.json").read_text())
    assert info["strategies"] == list(kind_strategies("format")[:k]) and info["splits"]["test"]["samples"] == 2000


# ---------------------------------------------------------------- the permutation kind as before

TINY_PERMUTATION_SHA256 = "1c18fbb100e3be6ad8af37df2061ae164ca88536ec364197bc17b7b82e5700ab"
"""sha256 over the tiny preset's (n_train 40, n_val 10, n_test 10, shard_size 16) dataset.json and shards, in
path order, as written before kinds existed."""


def test_permutation_kind_writes_the_same_bytes(tmp_path):
    cfg = preset_config(SynthConfig, "synth", "tiny", n_train=40, n_val=10, n_test=10, shard_size=16)
    assert cfg.kind == "permutation" and "kind" not in config_dict(cfg)
    write_dataset(cfg, tmp_path / "d")
    digest = hashlib.sha256()
    for path in sorted(p for p in (tmp_path / "d").rglob("*") if p.is_file()):
        digest.update(path.relative_to(tmp_path / "d").as_posix().encode() + path.read_bytes())
    assert digest.hexdigest() == TINY_PERMUTATION_SHA256
    default = SynthConfig()
    assert candidate_sequences((2, 0, 1), default)["sort"] == (0, 1, 2, END_OF_Y)
