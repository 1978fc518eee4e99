"""What two latent values that share two strategies decode. For a
trained run on synthetic data: each latent value's greedy decodes of a split's inputs and the strategy each
executes (eval's ``strategy_execution``); then, for every value whose decodes execute both strategies a and b
of a pair, on at least a fifth of its a-or-b decodes each:

- how often another value executes the other one of the pair on the same input (the two values split the
  pair between them per input);
- whether the value chooses by an order of the symbols: a logistic regression of "executes a" on
  one-hot(a(x)[p]) - one-hot(b(x)[p]) at the first position p where the two outputs part (p = 0 unless they
  begin alike), a score per symbol (a when its symbol there scores higher), its accuracy on the held-out half
  of the inputs (2-fold), and the order of the scores fitted on all of them;
- whether one symbol decides it: the symbol c and the side (taken or avoided) that account for most of its
  choices on the inputs where a(x) or b(x) has c where the two part, and which strategy it executes on the
  others (the merges of the K = 4 user-path task: "begin with p whenever one of the two would, else b").

Before those, per value, which strategies its decodes begin like: the share of decodes whose first token, and
whose first two tokens, equal those of s(x), by the set of strategies s that they match (strategies that begin
alike on an input, such as copy and evens-odds with x[0], match together). A value that codes the first decision
and not the second shows as one first-token set split between its strategies at the second token. And per value,
which of the base model's choices it executes: the strategies of each input ranked by the base's NLL of s(x)
(the run's checkpoint, z-free): a value that means "the base's first choice" or "its second" codes the base's
own per-x preference, not a strategy. For each shared pair, the base's preference between a and b (which of
a(x), b(x) it finds likelier) is matched with the value's choice the same way. And per value, whether one order
of the symbols accounts for its first tokens: a conditional logit of the decode's first token among the
strategies' first tokens for that x (a score per symbol, 2-fold held-out accuracy), beside the share that one
strategy's first token accounts for. A fixed preference over symbols is what sort and sort-desc are (the least
and the greatest symbol first); copy and reverse begin at a position, which no order of the symbols picks.

    python scripts/merge_probe.py RUN DATA [--split test] [--examples 512] [--synth-preset NAME]

``--synth-preset``: DATA was converted from ``scripts/synth_to_jsonl.py --preset NAME`` (the user path), whose
dataset.json does not hold the generator: s(x) is that preset's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize

from tokweight.config_files import preset_config, preset_names
from tokweight.pipeline.models.backbone import load_backbone, s_nll
from tokweight.pipeline.data.labels import load_labels
from tokweight.pipeline.data.config import SynthConfig
from tokweight.pipeline.tokens.templates import collate, template_ids
from tokweight.training.evaluation.verdict import strategy_execution
from tokweight.training.config.use import GenerateConfig
from tokweight.training.decoding.generate import run as generate
from tokweight.training.loop.train_base import load_split

SHARED = 0.2  # the smaller strategy's least share of a value's a-or-b decodes for the value to count as shared
PAIR_DECODES = 0.1  # and the least share of the inputs that its a-or-b decodes make up (K = 8: a few stray hits)
L2 = 0.1  # on the symbol scores: a symbol seen on one side only would otherwise score without bound


def fit_scores(first_a: np.ndarray, first_b: np.ndarray, chose_a: np.ndarray, n_symbols: int) -> np.ndarray:
    """(n_symbols + 1,) symbol scores and a bias: the L2-penalised logistic regression of chose_a on
    one-hot(first_a) - one-hot(first_b)."""
    X = np.c_[np.eye(n_symbols)[first_a] - np.eye(n_symbols)[first_b], np.ones(len(first_a))]
    sign = np.where(chose_a, 1.0, -1.0)

    def loss(w):
        margin = sign * (X @ w)
        grad = -(X * (sign / (1 + np.exp(margin)))[:, None]).sum(0) + L2 * np.r_[w[:-1], 0]
        return np.logaddexp(0, -margin).sum() + 0.5 * L2 * w[:-1] @ w[:-1], grad

    return minimize(loss, np.zeros(n_symbols + 1), jac=True, method="L-BFGS-B").x


def predicts(w: np.ndarray, first_a: np.ndarray, first_b: np.ndarray) -> np.ndarray:
    return w[first_a] - w[first_b] + w[-1] > 0


def order_accuracy(first_a, first_b, chose_a, n_symbols: int, seed: int = 0) -> tuple[float, np.ndarray]:
    """(held-out accuracy of the fit, 2-fold mean; the symbol scores fitted on every input)."""
    halves = np.array_split(np.random.default_rng(seed).permutation(len(chose_a)), 2)
    accuracy = [np.mean(predicts(fit_scores(first_a[fit], first_b[fit], chose_a[fit], n_symbols),
                                 first_a[held], first_b[held]) == chose_a[held])
                for fit, held in (halves, halves[::-1])]
    return float(np.mean(accuracy)), fit_scores(first_a, first_b, chose_a, n_symbols)[:-1]


def fit_first_token_scores(cands: np.ndarray, unique: np.ndarray, chosen: np.ndarray, n_symbols: int) -> np.ndarray:
    """(n_symbols,) scores w of the L2-penalised conditional logit: the first token is chosen among an input's
    candidate first tokens (``cands`` (n, K) symbol ids, ``unique`` masking repeats) with p ∝ exp(w[symbol])."""
    def loss(w):
        logits = np.where(unique, w[cands], -np.inf)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        grad = np.zeros(n_symbols)
        np.add.at(grad, cands[unique], p[unique])
        np.add.at(grad, chosen, -1.0)
        nll = -(w[chosen] - np.log(np.exp(logits).sum(1))).sum()
        return nll + 0.5 * L2 * w @ w, grad + L2 * w

    return minimize(loss, np.zeros(n_symbols), jac=True, method="L-BFGS-B").x


def first_token_order(cands: np.ndarray, chosen: np.ndarray, n_symbols: int, seed: int = 0) -> float:
    """Held-out accuracy (2-fold mean) of one order of the symbols as the account of a value's first tokens:
    the candidate whose symbol scores highest. ``cands`` (n, K): the first token of each strategy's output for
    each input, ``chosen`` (n,): the decode's first token, one of them."""
    unique = np.ones(cands.shape, bool)
    for j in range(1, cands.shape[1]):
        unique[:, j] = (cands[:, :j] != cands[:, j: j + 1]).all(1)
    halves = np.array_split(np.random.default_rng(seed).permutation(len(chosen)), 2)
    accuracy = []
    for fit, held in (halves, halves[::-1]):
        w = fit_first_token_scores(cands[fit], unique[fit], chosen[fit], n_symbols)
        scored = np.where(unique[held], w[cands[held]], -np.inf)
        accuracy.append(np.mean(cands[held][np.arange(len(held)), scored.argmax(1)] == chosen[held]))
    return float(np.mean(accuracy))


def prefix_shares(samples, decodes: list, labels, tokens: int) -> list[Counter]:
    """Per latent value: how many decodes begin (their first ``tokens`` tokens) like s(x), by the set of
    strategies s they begin like ("none" when no strategy's output begins so)."""
    counts = [Counter() for _ in decodes[0]]
    for s, row in zip(samples, decodes):
        outputs = labels.outputs(s.x)
        for v, y in enumerate(row):
            counts[v]["/".join(sorted(n for n, out in outputs.items() if out[:tokens] == y[:tokens])) or "none"] += 1
    return counts


def parting(a: tuple, b: tuple) -> int | None:
    """The first position where two strategies' outputs for one x (permutations of it) differ; None: equal."""
    return next((p for p, (u, w) in enumerate(zip(a, b)) if u != w), None)


def base_nll(checkpoint: str, samples, labels, names: list[str], batch: int = 256) -> np.ndarray:
    """(inputs, strategies) the base model's NLL of s(x) after x, z-free, nats."""
    ckpt = load_backbone(checkpoint)
    rows = [template_ids(ckpt.vocab, s.x, labels.outputs(s.x)[n]) for s in samples for n in names]
    with torch.no_grad():
        nll = torch.cat([s_nll(ckpt.model, collate(*zip(*rows[i: i + batch]))).sum(1)
                         for i in range(0, len(rows), batch)])
    return nll.view(len(samples), len(names)).numpy()


def base_choice_shares(nll: np.ndarray, hits: list[list[str | None]], names: list[str]) -> list[np.ndarray]:
    """Per latent value: the share of inputs on which its decode executes the base's first, second, ... choice
    (strategies ranked by the base's NLL of s(x)); the shares sum to the value's executed share."""
    rank = nll.argsort(1).argsort(1)  # rank[i, j]: strategy j's place in input i's ranking, 0 = likeliest
    shares = []
    for v in range(len(hits[0])):
        placed = [rank[i, names.index(row[v])] for i, row in enumerate(hits) if row[v] is not None]
        shares.append(np.bincount(placed, minlength=len(names)) / len(hits))
    return shares


def shared_pairs(hits: list[list[str | None]], names: list[str]) -> list[tuple[int, str, str]]:
    """(value, a, b) for each value whose a-or-b decodes are at least ``PAIR_DECODES`` of the inputs and each
    strategy at least ``SHARED`` of them."""
    out = []
    for v in range(len(hits[0])):
        for a, b in combinations(names, 2):
            n_a, n_b = (sum(row[v] == s for row in hits) for s in (a, b))
            if n_a + n_b >= max(PAIR_DECODES * len(hits), 1) and min(n_a, n_b) >= SHARED * (n_a + n_b):
                out.append((v, a, b))
    return out


def decode_every_value(run: Path, data: Path, split: str, samples) -> list[list[tuple]]:
    """Each input's greedy decode under every latent value (``tokweight generate``)."""
    with tempfile.TemporaryDirectory() as tmp:
        inputs, outputs = Path(tmp, "in.jsonl"), Path(tmp, "out.jsonl")
        inputs.write_text("".join(json.dumps({"key": s.key, "x": list(s.x)}) + "\n" for s in samples))
        continuous = json.loads((run / "config.json").read_text())["cvae"]["latent"] == "continuous"
        generate(GenerateConfig(str(run), str(inputs), str(outputs), data=str(data) if continuous else None, split=split))
        return [[tuple(y) for y in json.loads(line)["outputs"]] for line in outputs.read_text().splitlines()]


def report_first_tokens(decodes, firsts: np.ndarray, symbols: dict[str, int]) -> None:
    """Per value: one order of the symbols against one strategy as the account of its first tokens."""
    for v in range(len(decodes[0])):
        starts = [n for n, row in enumerate(decodes) if row[v] and row[v][0] in symbols
                  and symbols[row[v][0]] in firsts[n]]  # decodes that begin like some strategy
        began = np.array([symbols[decodes[n][v][0]] for n in starts])
        best = max(np.mean(firsts[starts, j] == began) for j in range(firsts.shape[1]))
        print(f"value {v}: of its {len(starts)} decodes that begin like a strategy, one order of the symbols "
              f"predicts the first token of {first_token_order(firsts[starts], began, len(symbols)):.3f} held out; "
              f"one strategy's first token, {best:.3f}")


def report_pair(v: int, a: str, b: str, samples, hits, labels, names: list[str], symbols: dict[str, int],
                nll: np.ndarray) -> None:
    """A value that shares strategies a and b: which other values split the pair with it, and whether an order
    of the symbols where a(x) and b(x) part, or the base's preference, accounts for its choice."""
    chosen = [n for n, row in enumerate(hits) if row[v] in (a, b)]  # the inputs of the value's a-or-b decodes
    for w in range(len(hits[0])):
        both = [hits[n] for n in chosen if w != v and hits[n][w] in (a, b)]
        if len(both) >= 0.1 * len(samples):
            print(f"value {v} ({a} or {b}) and value {w}: on the {len(both)} inputs where both execute one, "
                  f"different ones on {np.mean([row[v] != row[w] for row in both]):.2f}")
    cands = [labels.outputs(samples[n].x) for n in chosen]
    parts = [(i, parting(c[a], c[b])) for i, c in enumerate(cands)]
    parts = [(i, p) for i, p in parts if p is not None]  # a(x) = b(x): nothing to choose
    part_a = np.array([symbols[cands[i][a][p]] for i, p in parts])
    part_b = np.array([symbols[cands[i][b][p]] for i, p in parts])
    chose_a = np.array([hits[chosen[i]][v] == a for i, _ in parts])
    accuracy, scores = order_accuracy(part_a, part_b, chose_a, len(symbols))
    base_prefers_a = np.array([nll[chosen[i], names.index(a)] < nll[chosen[i], names.index(b)] for i, _ in parts])
    order = " > ".join(sorted(symbols, key=lambda s: -scores[symbols[s]]))
    where = ", ".join(f"token {p + 1} on {n}" for p, n in sorted(Counter(p for _, p in parts).items()))
    print(f"value {v} executes {a} on {chose_a.mean():.2f} of its {len(parts)} {a}-or-{b} decodes (the two part "
          f"at {where}); an order of the two symbols where they part predicts which on {accuracy:.3f} of "
          f"held-out inputs ({a} when its symbol there ranks higher: {order}); it executes the one the base finds "
          f"likelier on {np.mean(chose_a == base_prefers_a):.3f}")
    c, taken, share, n = one_symbol(part_a, part_b, chose_a, len(symbols))
    rest = (part_a != c) & (part_b != c)
    name = {i: s for s, i in symbols.items()}[c]
    print(f"value {v}: one symbol decides: '{name}' {'taken' if taken else 'avoided'} where the two part on "
          f"{share:.3f} of the {n} inputs where one of them has it; on the other {rest.sum()} it executes "
          f"{a} on {chose_a[rest].mean() if rest.any() else float('nan'):.2f}")


def one_symbol(part_a: np.ndarray, part_b: np.ndarray, chose_a: np.ndarray,
               n_symbols: int) -> tuple[int, bool, float, int]:
    """(symbol c, taken, share, n): the symbol and side whose rule "choose the strategy with c where they part
    (taken), or the other (avoided)" agrees with most choices net of chance, over the n inputs where one has c."""
    def agreement(c: int, taken: bool) -> tuple[int, int]:
        has = (part_a == c) | (part_b == c)
        return int((((part_a == c) == chose_a) == taken)[has].sum()), int(has.sum())
    rules = {(c, t): agreement(c, t) for c in range(n_symbols) for t in (True, False)}
    (c, taken), (agree, n) = max(rules.items(), key=lambda rule: rule[1][0] - rule[1][1] / 2)
    return c, taken, agree / max(n, 1), n


def symbol_index(samples, labels) -> dict[str, int]:
    """Every symbol of the inputs and of what the strategies write from them (a format's month names, a padded
    zero), each with an index: where two outputs part, either may hold a symbol that x does not."""
    written = {t for s in samples for y in labels.outputs(s.x).values() for t in y}
    return {s: i for i, s in enumerate(sorted({t for s in samples for t in s.x} | written))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("--split", default="test")
    ap.add_argument("--examples", type=int, default=512)
    ap.add_argument("--synth-preset", choices=preset_names("synth"),
                    help="DATA came from scripts/synth_to_jsonl.py --preset NAME: s(x) is that preset's")
    args = ap.parse_args()
    torch.set_num_threads(1)  # a small model on a shared machine
    labels = load_labels(args.data)
    if args.synth_preset is not None:
        labels = replace(labels, synth=preset_config(SynthConfig, "synth", args.synth_preset))
    if labels.synth is None:
        raise SystemExit(f"{args.data}/dataset.json: not a tokweight synth dataset; the probe needs s(x) for "
                         f"every strategy s (run it on data made by `tokweight synth`, or name the synth_to_jsonl "
                         f"preset with --synth-preset)")
    samples = load_split(args.data, args.split)[: args.examples]
    decodes = decode_every_value(args.run, args.data, args.split, samples)
    execution, hits = strategy_execution(samples, decodes, labels)
    names = sorted(labels.outputs(samples[0].x))
    print(f"{args.run}: {len(samples)} inputs of {args.data} ({args.split}), {len(decodes[0])} latent values")
    for v, shares in execution["executes"].items():
        print(f"value {v}: " + ", ".join(f"{n} {share:.2f}" for n, share in shares.items() if share >= 0.01))
    for tokens in (1, 2):
        for v, count in enumerate(prefix_shares(samples, decodes, labels, tokens)):
            shares = [f"{n} {m / len(samples):.2f}" for n, m in count.most_common() if m >= 0.02 * len(samples)]
            print(f"value {v} begins (first {tokens} token{'s' * (tokens > 1)}) like: " + ", ".join(shares))
    nll = base_nll(json.loads((args.run / "config.json").read_text())["io"]["checkpoint"], samples, labels, names)
    for v, shares in enumerate(base_choice_shares(nll, hits, names)):
        print(f"value {v} executes the base's choice " + ", ".join(f"{r + 1}: {share:.2f}" for r, share in enumerate(shares)))
    symbols = symbol_index(samples, labels)
    report_first_tokens(decodes, np.array([[symbols[labels.outputs(s.x)[n][0]] for n in names] for s in samples]),
                        symbols)
    for v, a, b in shared_pairs(hits, names):
        report_pair(v, a, b, samples, hits, labels, names, symbols, nll)


if __name__ == "__main__":
    main()
