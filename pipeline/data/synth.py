"""Synthetic strategy-ambiguous data: one input x, several strategies that could produce y.

Each example draws x (a sequence of data symbols) and a strategy s, and writes
``y = header + s(x) + trailer``. All strategies share the header and the trailer and most of
their outputs agree after the first few tokens, so only ``y_<=t0`` reveals s: the regime where a
uniform token average dilutes the latent's signal by about ``t0 / T`` (docs/contract.md §1).

Symbols are handled as integer ids while generating (so ``sort`` means "by symbol
index") and named only when a Sample is built: ids 0..25 are "a".."z", then "s26",
"s27", ...; the header and the trailer repeat the filler symbol "#".

These strategies are read orders of x (``kind = "permutation"``, the default). The kinds whose strategies
differ in what they write (``lexical``, ``format``, ``procedure``) live in pipeline.data.synth_kinds; x and y are
symbols there throughout, and t0, splits and labels are computed here alike for every kind.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from tokweight.pipeline.data import synth_kinds
from tokweight.pipeline.data.config import FILLER_SYMBOL, PERMUTATIONS, SynthConfig, symbol_name
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import prepare_output_dir, shard_name, write_shards
from tokweight.store.durable import write_json_atomic

END_OF_Y = "</y>"  # closes S: S = y_1..y_n </y>, T = n + 1 (docs/contract.md §2)
SPLITS = ("train", "val", "test")
_SPLIT_IDS = {"train": 0, "val": 1, "test": 2}  # folded into the split's seed


# ---------------------------------------------------------------- strategies (pure, on tuples)


def copy(x: tuple) -> tuple:
    return tuple(x)


def reverse(x: tuple) -> tuple:
    return tuple(x[::-1])


def sort(x: tuple) -> tuple:
    return tuple(sorted(x))


def sort_desc(x: tuple) -> tuple:
    return tuple(sorted(x, reverse=True))


def rotate_left(x: tuple) -> tuple:
    return tuple(x[1:]) + tuple(x[:1])


def rotate_right(x: tuple) -> tuple:
    return tuple(x[-1:]) + tuple(x[:-1])


def swap_pairs(x: tuple) -> tuple:
    """x1 x0 x3 x2 ...; an odd length keeps its last symbol in place."""
    out = list(x)
    out[0:len(x) - 1:2], out[1::2] = x[1::2], x[0:len(x) - 1:2]
    return tuple(out)


def evens_odds(x: tuple) -> tuple:
    """The symbols at even positions, then those at odd positions."""
    return tuple(x[0::2]) + tuple(x[1::2])


STRATEGIES: dict[str, Callable[[tuple], tuple]] = dict(zip(PERMUTATIONS, (
    copy, reverse, sort, sort_desc, rotate_left, rotate_right, swap_pairs, evens_odds)))


# ---------------------------------------------------------------- config


def kind_strategies(kind: str) -> tuple[str, ...]:
    """The strategies of ``kind`` in the order its K = 2..8 tasks take them (the first K)."""
    return tuple(STRATEGIES) if kind == "permutation" else synth_kinds.KIND_STRATEGIES[kind]


def config_dict(cfg: SynthConfig) -> dict:
    """cfg as dataset.json records it: every field, ``kind`` only where it is not the default (so a permutation
    dataset's json is what it was before kinds existed)."""
    out = asdict(cfg)
    if out["kind"] == "permutation":
        del out["kind"]
    return out


# ---------------------------------------------------------------- t0


def consistent_at(candidates: dict[str, Sequence], strategy: str, t: int) -> int:
    """How many strategies' S agree with the true one on y_<t (t tokens); 1 means decided."""
    true_prefix = tuple(candidates[strategy][:t])
    return sum(tuple(seq[:t]) == true_prefix for seq in candidates.values())


def compute_t0(candidates: dict[str, Sequence], strategy: str) -> int:
    """First index t in S (0-based) where y_<=t fits ``strategy`` only; T if it never does.

    ``candidates`` maps every strategy to its full S sequence (y tokens then "</y>") for
    the same x; T = len(candidates[strategy]).
    """
    total = len(candidates[strategy])
    for t in range(total):
        if consistent_at(candidates, strategy, t + 1) == 1:
            return t
    return total


def candidate_sequences(x: tuple, cfg: SynthConfig) -> dict[str, tuple]:
    """Each configured strategy's S for input x: header + s(x) + trailer + </y>. Permutation kind: x of any
    comparable symbols (ids while generating); the other kinds: x as its symbols."""
    header, trailer = (FILLER_SYMBOL,) * cfg.header_len, (FILLER_SYMBOL,) * cfg.trailer_len
    if cfg.kind != "permutation":
        return {name: header + synth_kinds.strategy_output(cfg, name, x) + trailer + (END_OF_Y,)
                for name in cfg.strategies}
    return {name: header + STRATEGIES[name](x) + trailer + (END_OF_Y,) for name in cfg.strategies}


def symbol_candidates(x: tuple[str, ...], cfg: SynthConfig) -> dict[str, tuple]:
    """candidate_sequences for x given as its symbols, every kind (a permutation x is mapped to ids and back)."""
    if cfg.kind != "permutation":
        return candidate_sequences(tuple(x), cfg)
    index = {symbol_name(i): i for i in range(cfg.alphabet_size)}
    cands = candidate_sequences(tuple(index[s] for s in x), cfg)
    return {name: tuple(t if isinstance(t, str) else symbol_name(t) for t in seq) for name, seq in cands.items()}


def load_synth_config(data: str | Path) -> SynthConfig | None:
    """The generator config of a synthetic dataset directory; None for converted or foreign data."""
    meta = Path(data) / "dataset.json"
    if not meta.is_file():
        return None
    info = json.loads(meta.read_text())
    return SynthConfig(**info["config"]) if info.get("generator") == "tokweight.synth" else None


def consistent_at_t0(sample: Sample, cfg: SynthConfig) -> int | None:
    """Strategies still consistent with the sample's prefix y_<t0 (None without a unique t0).

    A Bayes-optimal z-free model with a uniform prior has surprisal log of this at t0.
    """
    if sample.strategy is None or sample.t0 is None or sample.t0 >= len(sample.y) + 1:
        return None
    return consistent_at(symbol_candidates(sample.x, cfg), sample.strategy, sample.t0)


# ---------------------------------------------------------------- generation


def _strategy_ids(rng: np.random.Generator, first: np.ndarray, cfg: SynthConfig) -> np.ndarray:
    """One strategy index per example, given x[0]'s symbol id under the configured prior."""
    k = len(cfg.strategies)
    if cfg.prior == "uniform":
        return rng.integers(0, k, size=len(first))
    if cfg.prior == "weighted":
        return rng.choice(k, size=len(first), p=np.array(cfg.weights) / sum(cfg.weights))
    probs = np.ones((len(first), k))  # (N, K) unnormalised p(s|x)
    probs[np.arange(len(first)), first % k] += cfg.alpha
    cdf = np.cumsum(probs / probs.sum(axis=1, keepdims=True), axis=1)
    u = rng.random(len(first))[:, None]
    return np.minimum((u >= cdf).sum(axis=1), k - 1)  # inverse-CDF draw


def generate(cfg: SynthConfig, split: str) -> Iterator[Sample]:
    """The split's examples in key order; deterministic in (cfg, split)."""
    n = cfg.split_size(split)
    rng = np.random.default_rng([cfg.seed, _SPLIT_IDS[split]])
    if cfg.kind != "permutation":
        yield from _generate_kind(cfg, split, n, rng)
        return
    lengths = rng.integers(cfg.min_len, cfg.max_len + 1, size=n)  # (N,)
    flat = rng.integers(0, cfg.alphabet_size, size=int(lengths.sum()))  # (sum len,) symbol ids
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    chosen = _strategy_ids(rng, flat[starts] if n else flat[:0], cfg)
    names = [symbol_name(i) for i in range(cfg.alphabet_size)]
    for i in range(n):
        x_ids = tuple(flat[starts[i]: starts[i] + lengths[i]].tolist())
        candidates = candidate_sequences(x_ids, cfg)
        strategy = cfg.strategies[chosen[i]]
        y = tuple(tok if tok == FILLER_SYMBOL else names[tok] for tok in candidates[strategy][:-1])
        yield Sample(key=f"{split}-{i:07d}", x=tuple(names[j] for j in x_ids), y=y,
                     strategy=strategy, t0=compute_t0(candidates, strategy))


def _generate_kind(cfg: SynthConfig, split: str, n: int, rng: np.random.Generator) -> Iterator[Sample]:
    """generate() for the kinds of pipeline.data.synth_kinds: x drawn by the kind, then the strategy (the
    x-dependent prior reads x[0]'s index among the kind's symbols)."""
    xs = synth_kinds.draw_inputs(rng, n, cfg)
    index = {s: i for i, s in enumerate(cfg.symbols())}
    chosen = _strategy_ids(rng, np.array([index[x[0]] for x in xs], dtype=np.int64), cfg)
    for i, x in enumerate(xs):
        candidates = candidate_sequences(x, cfg)
        strategy = cfg.strategies[chosen[i]]
        yield Sample(key=f"{split}-{i:07d}", x=x, y=tuple(candidates[strategy][:-1]), strategy=strategy,
                     t0=compute_t0(candidates, strategy))


class _Stats:
    """Running means of T, t0 and T/(t0+1) over the samples that pass through ``tap``."""

    def __init__(self):
        self.n, self.T, self.t0, self.ratio = 0, 0.0, 0.0, 0.0

    def tap(self, samples):
        for s in samples:
            T = len(s.y) + 1
            self.n, self.T, self.t0, self.ratio = self.n + 1, self.T + T, self.t0 + s.t0, self.ratio + T / (s.t0 + 1)
            yield s

    def means(self) -> dict:
        d = max(self.n, 1)
        return {"mean_T": self.T / d, "mean_t0": self.t0 / d, "mean_T_over_t0p1": self.ratio / d}


def write_dataset(cfg: SynthConfig, out_dir: str | Path, *, overwrite: bool = False) -> dict:
    """Write ``out_dir/{train,val,test}/shard-NNNNNN.tar`` then ``out_dir/dataset.json``; return the latter.

    Shard names in the json are relative to ``out_dir``. With ``overwrite``, old shards
    and dataset.json under ``out_dir`` are deleted first.
    """
    out_dir = Path(out_dir)
    prepare_output_dir(out_dir, overwrite=overwrite)
    total, splits = _Stats(), {}
    for split in SPLITS:
        stats = _Stats()
        paths = write_shards(total.tap(stats.tap(generate(cfg, split))), out_dir / split,
                             shard_size=cfg.shard_size)
        splits[split] = {"samples": stats.n, "shards": [shard_name(out_dir, p) for p in paths],
                         "stats": stats.means()}
    info = {
        "generator": "tokweight.synth",
        "config": config_dict(cfg),
        "symbols": cfg.symbols(),
        "strategies": list(cfg.strategies),
        "splits": splits,
        "stats": total.means(),
    }
    write_json_atomic(out_dir / "dataset.json", info)
    return json.loads(json.dumps(info))  # the same plain-JSON view a reader of the file gets

