"""Evidence that z is used and that the decoder survived: decode-per-latent controls, and the verdict.

``reference_control``: every decoded example under every latent value, scored against its own y
under the latent value its strategy label is matched to (labelled data), against chance: the other
latent values. ``label_free_control``: no labels needed (users' labels are often missing or name no
strategy consistently): best-of-K exact match, some latent value reproduces the reference, against
the base model's own greedy exact match, and the share of examples whose K decodes differ.
``likelihood_control``: labelled data, the reference's likelihood under the matched latent value
against the others, which sees a z that moves probabilities without flipping a greedy decode.
``strategy_execution``: synthetic data only, whether a decode executes a known strategy. ``z_use``:
one of three outcomes with the rules applied (``OUTCOMES``, ``metrics.POSTERIOR_RULES``,
``CONTROL_RULE``, ``LABEL_FREE_RULE``, ``LIKELIHOOD_RULE``, ``WHOLE_RULE``), the strategy NMI / accuracy
marked not informative when the posterior is flat.
"""

from __future__ import annotations

import math

import numpy as np

from tokweight.pipeline.data.labels import DatasetLabels
from tokweight.pipeline.data.samples import Sample
from tokweight.training.evaluation.metrics import (MI_FLOOR, POSTERIOR_RULES, contingency, contingency_mi,
                                                   hungarian_accuracy)
from tokweight.training.config.use import OUTCOMES

CONTROL_FLOOR = 0.05
"""The least gain over chance (a share of the examples) that counts as control, besides 2 SE. Why 1 in 20: at 1 in
100 traces passed (latents that carry almost nothing and move a few examples), while the weakest code measured
gains several times 1 in 20."""
CONTROL_RULE = (f"control above chance: the exact-match or the first-token rate under the matched latent value "
                f"exceeds chance by >= {CONTROL_FLOOR} and by > 2 SE (paired over examples)")
CHANCE = "chance: the same examples decoded under each of the other latent values (their mean)"
MATCHING = ("matching: strategy label -> latent value, one to one, maximising the split's contingency of argmax q "
            "(continuous: k-means cluster of mu) against the labels (Hungarian)")
RATES = ("exact_match", "chance_exact_match", "first_token_match", "chance_first_token_match")
LABEL_FREE_RULE = (f"the posterior picks the decode: the share of examples reproduced exactly under the example's own "
                   f"latent value (argmax q, which has seen y; continuous: its cluster) exceeds the share under the "
                   f"other values (their mean) by >= {CONTROL_FLOOR} and by > 2 SE (paired over examples)")
"""Why own against the others, not best of K against the base or the mean: a decoder whose outputs move with the
latent value without meaning anything (noise, or a z that barely moved off its init) reproduces more references
under some one of K values than under their mean, and a decoder trained past an imperfect base beats the base's
greedy decode under every value alike; only a z that the decoder uses and the posterior reads gives its own
value the edge."""
NLL_TOLERANCE = 0.05
"""Nats per token the decoder may lose against the base model and still count as whole."""
WHOLE_RULE = (f"decoder whole: under each example's own latent value (argmax q; continuous: its cluster's centre for "
              f"the decode, its posterior mean for the NLL) the exact match is at least the base model's greedy exact "
              f"match on the same examples, and the token-mean NLL is within {NLL_TOLERANCE} nats of the base's")
LIKELIHOOD_FLOOR = math.log(2)
"""The least mean log-likelihood ratio (nats) that counts: the reference at least twice as likely under its matched
latent value. Why not a share over chance like the decode controls' floor: a trace moves likelihoods long before it
flips a decode. Cells whose posterior carries nothing of the strategy tilt the reference's likelihood by a fraction
of a nat, some of them by a share over chance above the decodes' floor, while a decoder that codes the strategy on a
base that decodes nothing gains tens of nats."""
LIKELIHOOD_RULE = (f"likelihood above chance: the posterior's I(z; strategy) is >= {MI_FLOOR} nats (else the matching "
                   f"of values to strategies is arbitrary), and with y teacher-forced, log p(y|x,k) under the latent "
                   f"value k matched to the example's strategy exceeds log of the other values' mean p(y|x,j) by >= "
                   f"log 2 = {LIKELIHOOD_FLOOR:.3f} nats on average and by > 2 SE")
"""Why beside the decodes: a greedy decode shows z only where z flips an argmax. On a base that reproduces nothing,
a z that moves the likelihood of every token of y without flipping the first one is invisible to both decode
controls. Why the label-matched value and not the posterior's own: argmax q has read y, so its value has the higher
likelihood whenever q follows the decoder, also for a z that means nothing. Why the gate on I(z; strategy): the
matching comes from the posterior's clusters, and a posterior that knows nothing of the strategy matches at random,
so the tilt's sign is a coin's and its size grows with y's length."""
ONE_STRATEGY = 0.9
"""A latent value names one strategy when at least this share of its decodes execute its most common strategy
(synthetic data), or, where no decode says, of the labelled examples its posterior picks carry its most common
label. Below it the value is a merge: a code the objective cannot tell from a strategy code (two values that
share two strategies, each choosing per input), which reconstructs as well and means nothing across inputs."""
VALUE_RULE = (f"a value names one strategy when >= {ONE_STRATEGY:g} of its decodes execute one strategy (synthetic "
              f"data), else of the labelled lines its decodes reproduce carry one label, else of the labelled "
              f"examples its posterior picks carry one label; below that it is a merge, which decodes by a "
              f"different strategy on different inputs")


def reference_control(outputs: list, refs: list, assigned: list[int], latent_labels: dict) -> dict:
    """Decode-per-latent control against each example's own reference y.

    outputs[i][v]: example i's greedy decode under latent value v (tokens); refs[i] its y; assigned[i]
    the latent value its label is matched to (-1: none); latent_labels: v -> that label. For value v and
    the examples assigned to it: exact_match = share whose decode under v equals their y, first_token_match
    = share whose first token does; chance_* = the same shares under the other values. Labels aside, each
    value's exact match over every example (``exact_match_by_latent``).
    """
    exact = np.array([[y == ref for y in row] for row, ref in zip(outputs, refs)], dtype=float)  # (N, V)
    first = np.array([[y[:1] == ref[:1] for y in row] for row, ref in zip(outputs, refs)], dtype=float)
    assigned, V = np.asarray(assigned), exact.shape[1]
    out = {"exact_match_by_latent": exact.mean(0).tolist()}
    mine = np.flatnonzero(assigned >= 0)  # the examples with a matched label
    if V < 2 or not len(mine):
        reason = "one latent value: no other to compare with" if V < 2 else "no example has a matched strategy label"
        return out | {"measured": False, "reason": reason}
    gains = {"exact_match": under_and_chance(exact[mine], assigned[mine]),
             "first_token_match": under_and_chance(first[mine], assigned[mine])}
    return out | {"measured": True, "above_chance": any(passes(u - c) for u, c in gains.values()),
                  "rule": CONTROL_RULE, "chance": CHANCE, "matching": MATCHING,
                  "examples": len(mine), "unassigned": int((assigned < 0).sum()),
                  **rates(gains, slice(None)), **gain_errors(gains),
                  "per_latent": per_latent(gains, assigned[mine], latent_labels, V)}


def per_latent(gains: dict, assigned: np.ndarray, latent_labels: dict, V: int) -> dict:
    """latent value -> its label, its examples and their rates."""
    return {str(v): {"strategy": latent_labels.get(v), "examples": int((assigned == v).sum()),
                     **rates(gains, assigned == v)} for v in range(V)}


def under_and_chance(match: np.ndarray, assigned: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((n,) match under each example's assigned value, (n,) its mean match under the other values)."""
    under = match[np.arange(len(match)), assigned]
    return under, (match.sum(1) - under) / (match.shape[1] - 1)


def passes(gain: np.ndarray, floor: float = CONTROL_FLOOR) -> bool:
    """The per-example gains' mean is at least ``floor`` and above 2 SE (``CONTROL_RULE``'s floor by default)."""
    mean = gain.mean()
    return bool(mean >= floor and mean > 2 * standard_error(gain))


def standard_error(x: np.ndarray) -> float:
    return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0


def rates(gains: dict, rows) -> dict:
    """The four rates of ``RATES`` over ``rows`` of the assigned examples (None where there are none)."""
    out = {}
    for name, (under, chance) in gains.items():
        some = bool(under[rows].size)
        out |= {name: float(under[rows].mean()) if some else None,
                f"chance_{name}": float(chance[rows].mean()) if some else None}
    return out


def gain_errors(gains: dict) -> dict:
    return {f"{name}_gain_se": standard_error(under - chance) for name, (under, chance) in gains.items()}


def likelihood_control(nll_by_value: np.ndarray, assigned: list[int], strategy_mi: float) -> dict:
    """``LIKELIHOOD_RULE`` over a split. nll_by_value[i, v]: nats, the decoder's NLL of example i's y under latent
    value v (teacher-forced, summed over y); assigned[i]: the value its label is matched to (-1: none);
    strategy_mi: the posterior's I(z; strategy), which the matching rests on. log_ratio: the mean over the
    assigned examples of log p(y|x,assigned) - log mean_{j != assigned} p(y|x,j)."""
    from scipy.special import logsumexp

    assigned, V = np.asarray(assigned), nll_by_value.shape[1]
    mine = np.flatnonzero(assigned >= 0)
    if V < 2 or not len(mine):
        reason = "one latent value: no other to compare with" if V < 2 else "no example has a matched strategy label"
        return {"measured": False, "reason": reason}
    loglik, rows = -nll_by_value[mine], np.arange(len(mine))
    others = np.where(np.arange(V) == assigned[mine, None], -np.inf, loglik)
    ratio = loglik[rows, assigned[mine]] - (logsumexp(others, axis=1) - np.log(V - 1))
    matching_informative = bool(strategy_mi >= MI_FLOOR)
    return {"measured": True, "above_chance": matching_informative and passes(ratio, LIKELIHOOD_FLOOR),
            "rule": LIKELIHOOD_RULE, "examples": len(mine), "log_ratio": float(ratio.mean()),
            "log_ratio_se": standard_error(ratio), "strategy_mi": strategy_mi,
            "matching_informative": matching_informative}


def strategy_execution(samples: list[Sample], outputs: list, labels: DatasetLabels) -> tuple[dict, list]:
    """Synthetic data: the share of decodes under each latent value that execute each strategy s (equal s(x)),
    control accuracy = matched executions / (examples x V) under the Hungarian map latent value -> strategy
    (whether a value means the same strategy across inputs), decode_strategy_mi = I(value; strategy) over the
    decodes that execute one (whether each value names one strategy, as its decodes show; at most
    decode_strategy_mi_max = log coverage_max), executing_share = the share of decodes that execute one, and
    coverage = the mean number of distinct strategies an input's V decodes execute (whether z selects among them
    per input; a conditional prior can assign them per input, which covers every strategy while naming none), of
    coverage_max = min(V, strategies); with, per example and latent value, the strategy its decode executes (or
    None)."""
    V, names = len(outputs[0]), sorted(labels.outputs(samples[0].x))
    counts = np.zeros((V, len(names) + 1))  # last column: executes no strategy
    hits = []
    for s, row in zip(samples, outputs):
        cands = labels.outputs(s.x)
        hits.append([next((n for n in names if cands[n] == y), None) for y in row])
        for v, hit in enumerate(hits[-1]):
            counts[v, len(names) if hit is None else names.index(hit)] += 1
    executes = {str(v): {n: float(counts[v, j] / len(samples)) for j, n in enumerate(names + ["none"])}
                for v in range(V)}
    accuracy = hungarian_accuracy(counts[:, :-1]) * counts[:, :-1].sum() / counts.sum()
    coverage = float(np.mean([len(set(row) - {None}) for row in hits]))
    valid, most = counts[:, :-1], min(V, len(names))
    return {"executes": executes, "control_accuracy": float(accuracy), "coverage": coverage, "coverage_max": most,
            "decode_strategy_mi": contingency_mi(valid), "decode_strategy_mi_max": math.log(most),
            "executing_share": float(valid.sum() / counts.sum())}, hits


MIN_REPRODUCTIONS = 10
"""Lines a value's decodes must reproduce before their labels speak for it (fewer: its posterior's picks do)."""


def reproduction_by_label(outputs: list, refs: list, strategies: list) -> dict | None:
    """Labelled data without a generator: per latent value, the labels of the lines whose own y its decode
    reproduces (outputs[i][v] == refs[i]; strategies[i] line i's label or None), as shares of them (None below
    ``MIN_REPRODUCTIONS``), and decode_strategy_mi = I(value; label) over those reproductions (at most
    decode_strategy_mi_max = log min(V, labels)). A value that names one strategy reproduces the lines of one
    label; a merge those of two, each on some inputs. None without labels."""
    if all(s is None for s in strategies):
        return None
    hits = [(v, label) for row, ref, label in zip(outputs, refs, strategies) if label is not None
            for v, y in enumerate(row) if y == ref]  # (value, label) of each decode that reproduces its line
    counts, labels = contingency([label for _, label in hits], np.array([v for v, _ in hits], dtype=int),
                                 len(outputs[0]))
    order = np.argsort(-counts, axis=1, kind="stable")  # per value, its labels most reproduced first
    reproduces = {str(v): {labels[j]: float(counts[v, j] / counts[v].sum()) for j in order[v] if counts[v, j]}
                  if counts[v].sum() >= MIN_REPRODUCTIONS else None for v in range(len(counts))}
    return {"reproduces": reproduces, "reproductions": int(counts.sum()), "decode_strategy_mi": contingency_mi(counts),
            "decode_strategy_mi_max": math.log(min(len(counts), len({s for s in strategies if s is not None})))}


def label_free_control(outputs: list, refs: list, base_outputs: list, own_values: list[int]) -> dict:
    """Decode controls that need no labels. outputs[i][v]: example i's greedy decode under latent value v;
    refs[i] its y; base_outputs[i] the base model's greedy decode; own_values[i] the example's own latent value.

    best_of_k_exact_match: share reproduced exactly under some value; base_exact_match: share the base's
    greedy decode reproduces; mean_exact_match: the CVAE's exact match averaged over the values;
    own_exact_match: share reproduced under the example's own value; others_exact_match: under the other
    values, averaged; diverse_share: share whose decodes are not all the same; own_above_others:
    ``LABEL_FREE_RULE``.
    """
    exact = np.array([[y == ref for y in row] for row, ref in zip(outputs, refs)], dtype=float)  # (N, V)
    best, mean = exact.max(1), exact.mean(1)
    base = np.array([y == ref for y, ref in zip(base_outputs, refs)], dtype=float)
    own = exact[np.arange(len(refs)), own_values]
    others = (exact.sum(1) - own) / (exact.shape[1] - 1)
    diverse = np.array([len(set(row)) > 1 for row in outputs], dtype=float)
    return {"examples": len(refs), "best_of_k_exact_match": float(best.mean()),
            "base_exact_match": float(base.mean()), "mean_exact_match": float(mean.mean()),
            "own_exact_match": float(own.mean()), "others_exact_match": float(others.mean()),
            "diverse_share": float(diverse.mean()), "own_over_others_se": standard_error(own - others),
            "own_above_others": passes(own - others), "rule": LABEL_FREE_RULE}


# ---------------------------------------------------------------- the verdict


def z_use(metrics: dict, decode: dict, latent: str, likelihood: dict | None = None) -> dict:
    """One of ``OUTCOMES``, in words with the rules applied. Used: the posterior is informative
    (``POSTERIOR_RULES``) and the decoder shows it: decoding under the label-matched value above chance
    (``CONTROL_RULE``), or, labels or not, under the example's own value above the others (``LABEL_FREE_RULE``),
    or the reference's likelihood under the label-matched value above chance (``LIKELIHOOD_RULE``); with
    neither decode nor likelihood measured the posterior alone decides. Whole: ``WHOLE_RULE``, both figures
    measured. Strategy NMI / accuracy as reported: their numbers, or "not informative (...)" when the
    posterior is flat."""
    informative = bool(metrics.get("posterior_informative"))
    control, free, likelihood = decode.get("reference", {}), decode.get("label_free", {}), likelihood or {}
    above = control["above_chance"] if control.get("measured") else None
    likely = likelihood["above_chance"] if likelihood.get("measured") else None
    evidence = [e for e in (above, free.get("own_above_others"), likely) if e is not None]
    used = informative and (any(evidence) if evidence else True)
    whole, whole_reason = decoder_whole(metrics, free)
    outcome = OUTCOMES[2] if not used else OUTCOMES[0] if whole else OUTCOMES[1]
    out = {"outcome": outcome, "used": used, "whole": whole,
           "statement": z_statement(outcome, metrics, control, free, likelihood, whole_reason, latent),
           "posterior_rule": POSTERIOR_RULES[latent], "posterior_informative": informative,
           "posterior_values": metrics.get("posterior_values"), "control_rule": CONTROL_RULE,
           "label_free_rule": LABEL_FREE_RULE, "likelihood_rule": LIKELIHOOD_RULE, "whole_rule": WHOLE_RULE,
           "control_above_chance": above, "own_above_others": free.get("own_above_others"),
           "likelihood_above_chance": likely}
    flat = f"not informative (posterior flat: {metrics.get('posterior_values')}; rule: {POSTERIOR_RULES[latent]})"
    return out | {m: metrics[m] if informative else flat for m in ("strategy_nmi", "strategy_accuracy") if m in metrics}


def decoder_whole(metrics: dict, free: dict) -> tuple[bool, str]:
    """(``WHOLE_RULE`` holds, the figures in words); not whole when a figure was not measured."""
    nll, base_nll = metrics.get("nll_token_mean"), metrics.get("base_nll_token_mean")
    if nll is None or not free:
        return False, "the decoder was not checked (no decode or no NLL measured), so it is not called whole"
    exact, base_exact = free["own_exact_match"], free["base_exact_match"]
    whole = exact >= base_exact and nll - base_nll <= NLL_TOLERANCE
    return whole, (f"under its own latent value the decoder reproduces {exact:.3f} of the references against the base "
                   f"model's greedy {base_exact:.3f}, at {nll:.3f} nats per token against the base's {base_nll:.3f}")


def z_statement(outcome: str, metrics: dict, control: dict, free: dict, likelihood: dict, whole_reason: str,
                latent: str) -> str:
    state = "carries information" if metrics.get("posterior_informative") else "is flat"
    parts = [f"the posterior {state} ({metrics.get('posterior_values')}; rule: {POSTERIOR_RULES[latent]})"]
    if control.get("measured"):
        parts.append(f"decoding each example under the latent value matched to its strategy "
                     f"{'beats' if control['above_chance'] else 'does not beat'} chance at reproducing its reference "
                     f"(exact match {control['exact_match']:.3f} vs {control['chance_exact_match']:.3f}, first "
                     f"token {control['first_token_match']:.3f} vs {control['chance_first_token_match']:.3f})")
    if free:
        parts.append(f"under its own latent value an example's decode reproduces {free['own_exact_match']:.3f} of the "
                     f"references against {free['others_exact_match']:.3f} under the other values "
                     f"({'above' if free['own_above_others'] else 'not above'} them; best of K "
                     f"{free['best_of_k_exact_match']:.3f}, {free['diverse_share']:.3f} of the examples decode "
                     f"differently under different values)")
    if likelihood.get("measured"):
        ratio = likelihood["log_ratio"]
        if not likelihood["matching_informative"]:
            rule = (f"not counted: the posterior's I(z; strategy) {likelihood['strategy_mi']:.3f} is under {MI_FLOOR} "
                    f"nats, so the matching is arbitrary")
        elif likelihood["above_chance"]:
            rule = "above chance"
        else:
            rule = (f"not above chance, which asks >= {LIKELIHOOD_FLOOR:.3f} nats and > 2 SE; "
                    f"SE {likelihood['log_ratio_se']:.3f}")
        parts.append(f"with y teacher-forced, the latent value matched to an example's strategy gives its reference "
                     f"{abs(ratio):.3f} nats {'more' if ratio >= 0 else 'less'} log-likelihood than the other values "
                     f"do (their mean likelihood, over {likelihood['examples']} examples; {rule})")
    if not control.get("measured") and not free:
        parts.append(f"decode control not measured ({control.get('reason', 'no example decoded')})")
    if outcome != OUTCOMES[2]:
        parts.append(whole_reason)
    return f"{outcome}: " + "; ".join(parts) + "."


def value_report(clusters: list[int], strategies: list, decoded: dict | None, V: int) -> dict:
    """Per latent value, whether it can be trusted to mean one strategy: the examples the posterior gives it
    (clusters[i]: example i's value over the split; strategies[i] its label or None), their labels' shares, the
    shares of strategies its decodes execute (``decoded``: ``strategy_execution``'s ``executes``, synthetic data,
    or the labels of the lines they reproduce, ``reproduction_by_label``'s ``reproduces``; or None), and its status
    (``VALUE_RULE``, ``value_status``)."""
    values = {}
    for v in range(V):
        labels = [s for c, s in zip(clusters, strategies) if c == v and s is not None]
        row = {"examples": int(sum(c == v for c in clusters)), "labels": shares(labels),
               "decodes": None if decoded is None or decoded[str(v)] is None else dict(decoded[str(v)])}
        ranked = sorted(((p, n) for n, p in (row["decodes"] or row["labels"] or {}).items() if n != "none"),
                        reverse=True)
        row["strategy"], row["share"] = (ranked[0][1], ranked[0][0]) if ranked else (None, None)
        row["status"] = value_status([p for p, _ in ranked])
        values[str(v)] = row
    return {"values": values, "rule": VALUE_RULE, "one_strategy": ONE_STRATEGY,
            "trusted": [int(v) for v, r in values.items() if r["status"] == "one strategy"]}


def value_status(ranked: list[float]) -> str:
    """A value's status from the shares of its strategies, largest first: one strategy, a merge (a second one
    takes >= 1 - ONE_STRATEGY), unreliable (it mostly executes no strategy) or unknown (nothing says)."""
    if not ranked:
        return "unknown"
    if ranked[0] >= ONE_STRATEGY:
        return "one strategy"
    return "merge" if len(ranked) > 1 and ranked[1] >= 1 - ONE_STRATEGY else "unreliable"


def shares(names: list) -> dict | None:
    """{name: share} of a list of names, most common first; None for an empty list."""
    if not names:
        return None
    counts = {n: names.count(n) for n in sorted(set(names))}
    return {n: c / len(names) for n, c in sorted(counts.items(), key=lambda t: -t[1])}
