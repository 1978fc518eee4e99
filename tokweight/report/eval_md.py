"""eval.md: eval.json (``training.evaluation.evaluate.run_eval``) in words and tables. The verdict with its rules
first, the CVAE beside the base model, every metric, then the decode-per-latent sections."""

from __future__ import annotations

from pathlib import Path

from tokweight.report.tables import fixed, general, markdown_table
from tokweight.training.evaluation.verdict import CHANCE, CONTROL_RULE, MATCHING, RATES


def write_eval_md(run: str | Path, evaluated: dict) -> Path:
    """RUN/eval.md of ``evaluated`` (what run_eval returned, or eval.json read back); its path."""
    path = Path(run, "eval.md")
    text = eval_markdown(evaluated["metrics"], evaluated["decode"], evaluated["z_used"])
    if evaluated.get("values"):
        text += "\n" + "\n\n".join(values_section(evaluated["values"])) + "\n"
    path.write_text(text)
    return path


def values_section(report: dict) -> list[str]:
    """eval.md's table of which latent values to trust (``verdict.value_report``)."""
    def listed(shares: dict | None) -> str:
        return "" if not shares else ", ".join(f"{n} {p:.2f}" for n, p in shares.items() if p >= 0.005)

    rows = [[v, str(r["examples"]), listed(r["labels"]), listed(r["decodes"]), r["status"]]
            for v, r in report["values"].items()]
    trusted = report["trusted"]
    said = (f"values naming one strategy: {', '.join(map(str, trusted))}" if trusted
            else "no value names one strategy")
    return ["## Which latent values to trust",
            markdown_table(["latent", "examples (posterior)", "their labels",
                            "strategies its decodes execute (labelled lines: those they reproduce)", "status"], rows),
            f"{said}. Rule: {report['rule']}. A merge reconstructs as well as a strategy code, so the loss cannot "
            "show it: a few labels (`train --labelled`) name the values."]


def eval_markdown(metrics: dict, decode: dict, verdict: dict) -> str:
    """eval.md: the verdict, the CVAE beside the base model, the metrics (NMI / accuracy as the verdict reports
    them), the decode sections."""
    cells = [[k, "not informative (posterior flat: rule above)" if isinstance(verdict.get(k), str) else general(v)]
             for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    rules = (f"Rules: posterior: {verdict['posterior_rule']}; {CONTROL_RULE}; {verdict['label_free_rule']}; "
             f"{verdict['likelihood_rule']}; {verdict['whole_rule']}.")
    parts = ["## Verdict", f"**{verdict['outcome']}**", verdict["statement"], rules]
    if decode.get("label_free") and "nll_token_mean" in metrics:
        free = decode["label_free"]
        parts += ["## Against the base model (the same examples)",
                  markdown_table(["", "CVAE", "base model"], [
                      ["exact match (CVAE: each example's own latent value)", f"{free['own_exact_match']:.3f}",
                       f"{free['base_exact_match']:.3f}"],
                      ["exact match, the other latent values (their mean)", f"{free['others_exact_match']:.3f}", ""],
                      ["exact match, best of the K latent values", f"{free['best_of_k_exact_match']:.3f}", ""],
                      ["examples decoded differently under different values", f"{free['diverse_share']:.3f}", ""],
                      ["token-mean NLL (nats)", f"{metrics['nll_token_mean']:.4f}",
                       f"{metrics['base_nll_token_mean']:.4f}"]])]
    parts += ["## Metrics", markdown_table(["metric", "value"], cells)]
    if decode:
        parts += reference_section(decode["reference"])
    if "executes" in decode:
        names = list(next(iter(decode["executes"].values())))
        parts += ["## Strategy execution (synthetic data: does a decode equal s(x) for a strategy s?)",
                  markdown_table(["latent", *names], [[v, *(f"{row[n]:.2f}" for n in names)]
                                                      for v, row in decode["executes"].items()]),
                  f"control accuracy (a latent value means one strategy across inputs): "
                  f"{decode['control_accuracy']:.3f}; coverage (distinct strategies among an input's decodes): "
                  f"{decode['coverage']:.2f} of {decode['coverage_max']}; I(value; strategy) over the "
                  f"{decode['executing_share']:.2f} of decodes that execute one: {of_most(decode)}"]
    if "reproduces" in decode:
        parts += [f"Decodes that reproduce their line's own y: {decode['reproductions']}; I(value; label) over them: "
                  f"{of_most(decode)}"]
    return "\n\n".join(parts) + "\n"


def of_most(decode: dict) -> str:
    """I(value; strategy) over the decodes, in nats and as a share of the most it can be, log min(K, S)."""
    mi, most = decode["decode_strategy_mi"], decode["decode_strategy_mi_max"]
    return f"{mi:.3f} nats ({mi / most:.2f} of log min(K, S) = {most:.3f})" if most > 0 else f"{mi:.3f} nats"


def reference_section(control: dict) -> list[str]:
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
