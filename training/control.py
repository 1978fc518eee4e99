"""Evidence that z is used: decode-per-latent control against the references, and the verdict.

``reference_control``: every decoded example under every latent value, scored against its own y
under the latent value its strategy label is matched to (any labelled data), against chance: the
other latent values. ``strategy_execution``: synthetic data only, whether a decode executes a
known strategy. ``z_use``: the verdict in words with its rules (``metrics.POSTERIOR_RULES``,
``CONTROL_RULE``), the strategy NMI / accuracy marked not informative when the posterior is flat.
"""

from __future__ import annotations

import numpy as np

from tokweight.pipeline.labels import DatasetLabels
from tokweight.pipeline.samples import Sample
from tokweight.store.tables import fixed, markdown_table
from tokweight.training.metrics import POSTERIOR_RULES, hungarian_accuracy

CONTROL_FLOOR = 0.01
"""The least gain over chance (a share of the examples) that counts as control, besides 2 SE."""
CONTROL_RULE = (f"control above chance: the exact-match or the first-token rate under the matched latent value "
                f"exceeds chance by >= {CONTROL_FLOOR} and by > 2 SE (paired over examples)")
CHANCE = "chance: the same examples decoded under each of the other latent values (their mean)"
MATCHING = ("matching: strategy label -> latent value, one to one, maximising the split's contingency of argmax q "
            "(continuous: k-means cluster of mu) against the labels (Hungarian)")
RATES = ("exact_match", "chance_exact_match", "first_token_match", "chance_first_token_match")


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


def passes(gain: np.ndarray) -> bool:
    """The rule of ``CONTROL_RULE`` on the per-example gains over chance."""
    mean = gain.mean()
    return bool(mean >= CONTROL_FLOOR and mean > 2 * standard_error(gain))


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


def strategy_execution(samples: list[Sample], outputs: list, labels: DatasetLabels) -> tuple[dict, list]:
    """Synthetic data: the share of decodes under each latent value that execute each strategy s (equal s(x)),
    and control accuracy = matched executions / (examples x V) under the Hungarian map latent value ->
    strategy; with, per example and latent value, the strategy its decode executes (or None)."""
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
    return {"executes": executes, "control_accuracy": float(accuracy)}, hits


# ---------------------------------------------------------------- the verdict


def z_use(metrics: dict, decode: dict, latent: str) -> dict:
    """Whether z is used, as a bool and in words, with the rules applied: the posterior is informative
    (``POSTERIOR_RULES``) and decoding under the matched value beats chance (``CONTROL_RULE``; where no
    control could be measured, the posterior alone decides). Strategy NMI / accuracy as reported: their
    numbers, or "not informative (...)" when the posterior is flat."""
    informative, control = bool(metrics.get("posterior_informative")), decode.get("reference", {})
    above = control["above_chance"] if control.get("measured") else None
    used = informative and above is not False
    out = {"used": used, "statement": z_statement(used, metrics, control, latent),
           "posterior_rule": POSTERIOR_RULES[latent], "posterior_informative": informative,
           "posterior_values": metrics.get("posterior_values"), "control_rule": CONTROL_RULE,
           "control_above_chance": above}
    flat = f"not informative (posterior flat: {metrics.get('posterior_values')}; rule: {POSTERIOR_RULES[latent]})"
    return out | {m: metrics[m] if informative else flat for m in ("strategy_nmi", "strategy_accuracy") if m in metrics}


def z_statement(used: bool, metrics: dict, control: dict, latent: str) -> str:
    state = "carries information" if metrics.get("posterior_informative") else "is flat"
    posterior = f"the posterior {state} ({metrics.get('posterior_values')}; rule: {POSTERIOR_RULES[latent]})"
    if control.get("measured"):
        decode = (f"decoding each example under the latent value matched to its strategy "
                  f"{'beats' if control['above_chance'] else 'does not beat'} chance at reproducing its reference "
                  f"(exact match {control['exact_match']:.3f} vs {control['chance_exact_match']:.3f}, first token "
                  f"{control['first_token_match']:.3f} vs {control['chance_first_token_match']:.3f})")
    else:
        decode = f"decode control not measured ({control.get('reason', 'no example decoded')})"
    return f"z is {'used' if used else 'not used'}: {posterior}; {decode}."


def reference_markdown(control: dict) -> list[str]:
    """eval.md's section on the decode-per-latent control against the references."""
    head = "## Decode per latent: match with each example's reference y"
    by_latent = "exact match of every decoded example under each latent value: " + ", ".join(
        f"{v}: {r:.2f}" for v, r in enumerate(control["exact_match_by_latent"]))
    if not control.get("measured"):
        return [head, f"control not measured: {control['reason']}.", by_latent]
    rows = [[v, str(r["strategy"]), str(r["examples"]), *(fixed(r[c], 2) for c in RATES)]
            for v, r in control["per_latent"].items()]
    rows.append(["all", "", str(control["examples"]), *(fixed(control[c], 2) for c in RATES)])
    headers = ["latent", "strategy", "examples", "exact match", "chance", "first token", "chance"]
    counts = f"{control['examples']} examples assigned, {control['unassigned']} without a matched label"
    return [head, markdown_table(headers, rows), f"{counts}; {MATCHING}; {CHANCE}.", by_latent]
