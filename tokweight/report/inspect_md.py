"""report.md of `tokweight inspect`: definitions, then each estimator's table beside its plot, from the
store's inspection (``store.inspection``) as plain data."""

from __future__ import annotations

from tokweight.report.tables import group_records, records_table

MAX_TABLE_POSITIONS = 16  # wider profiles go to the CSV files only


def _pct(v) -> str:
    return "–" if v is None else f"{v:.1%}"


def render_report(store: str, summary: dict, profiles: dict, confusion: list[dict], plots: list[str]) -> str:
    """The report over ``store`` (as the user named it, for the `tokweight sql` line): ``summary`` and the
    records of the profile and confusion queries (``store.inspection``); ``plots``: the PNG files saved."""
    fps = summary["fingerprints"]
    sections = _introduction(store, summary) + _profiles(profiles, plots)
    sections += _t0_sections(fps, confusion, plots) + _concentration_and_beta_c(fps, summary, plots)
    return "\n\n".join(s for s in sections if s) + "\n"


def _introduction(store: str, summary: dict) -> list[str]:
    """The title, the definitions and the stores' table."""
    fps, p = summary["fingerprints"], summary["params"]
    sections = [
        f"# Baseline-store inspection: `{summary['store']}`",
        "Per-token surprisal `b_t = -log p(y_t | x, y_<t)` (nats) of the frozen base model, over the supervised "
        "set S (positions 0..T-1). This report runs the estimators of `store/sql/*.sql`; every number can be "
        f"recomputed with `tokweight sql {store} \"...\"` over the views `examples` and `tokens`.",
        "## Definitions",
        f"- **t0_share** (q = {p['q']}): the first position t with `cumsum_b[t] >= q * sum b`, read from the stored "
        "running sum.\n"
        f"- **t0_threshold** (tau = {p['tau']} nats): the last position with `b_t > tau`; none if no position "
        "exceeds tau.\n"
        "- **dilution** `(t0 + 1) / T` and **predicted amplification** `T / (t0 + 1)`: positions 0..t0 carry the "
        "strategy, i.e. t0 + 1 tokens. The ground-truth t0 is the first position at which the prefix of S fits "
        "one strategy only.\n"
        "- **Weight concentration** over `pi_t = b_t / sum b`: entropy `-sum pi ln pi` (nats; ln T when uniform), "
        "effective number of tokens `1 / sum pi^2` (T when uniform, 1 when one token carries all), max share.\n"
        f"- **Degenerate** examples have `sum b < eps` (eps = {p['eps']:g}): pi is undefined, so they are counted and "
        "left out of t0_share and of the concentration statistics.\n"
        "- t0 accuracy against the ground truth: exact-match rate, mean absolute error (positions) and the rate "
        "within one position, over examples that have both values.",
        "## Stores",
        records_table(fps, {"fingerprint": "fingerprint", "format": "format", "complete": "complete",
                            "examples": "examples", "tokens": "tokens", "mean_b": "mean b (nats)",
                            "mean_example_mean_b": "mean of example means", "mean_T": "mean T",
                            "degenerate": "degenerate"}),
    ]
    if any(not f["complete"] for f in fps):
        sections.append("**Incomplete store**: extraction has not finished; the numbers cover the parts written so far.")
    return sections


def _profiles(profiles: dict, plots: list[str]) -> list[str]:
    return ["## Surprisal profile by position", _plot_md("profile.png", plots),
                 _profile_table(profiles["profile_by_position"]),
                 "Full tables: `profile_by_position.csv`, `profile_by_strategy.csv`, `profile_by_T.csv`.",
                 "### Mean b by position, per strategy",
                 _wide_profile(profiles["profile_by_strategy"], "strategy"),
                 "### Mean b by position, per length T",
                 _wide_profile(profiles["profile_by_T"], "T")]


def _t0_sections(fps: list[dict], confusion: list[dict], plots: list[str]) -> list[str]:
    sections = ["## t0 estimates against the ground truth", _t0_table(fps), _plot_md("t0_confusion.png", plots)]
    if not any(f.get("with_true_t0") for f in fps):
        sections.append("No example carries a ground-truth t0 (pass `--data` if the dataset has it).")
    return sections + ["Full confusion counts: `t0_confusion.csv`." if confusion else "",
                       "## Dilution and predicted amplification",
                 records_table(fps, {"fingerprint": "fingerprint", "mean_dilution": "mean (t0_share+1)/T",
                                     "mean_amplification": "mean T/(t0_share+1)",
                                     "median_amplification": "median T/(t0_share+1)",
                                     "mean_amplification_true": "mean T/(t0+1), true",
                                     "median_amplification_true": "median T/(t0+1), true"}),
                       _plot_md("amplification.png", plots)]


def _concentration_and_beta_c(fps: list[dict], summary: dict, plots: list[str]) -> list[str]:
    return ["## Weight concentration",
                 records_table(fps, {"fingerprint": "fingerprint", "mean_share_entropy": "entropy of pi (nats)",
                                     "mean_effective_tokens": "effective tokens",
                                     "mean_effective_fraction": "effective tokens / T", "mean_max_share": "max share",
                                     "degenerate": "degenerate (excluded)"}),
                 _plot_md("concentration.png", plots),
                 "## Collapse threshold beta_c predicted from the store",
                 ("The beta below which a z that removes all of the base model's surprisal pays for itself under "
                  "each weighting: gain = the reconstruction it saves (uniform: mean sum b / T; sum: mean sum b; "
                  "surprisal-share: mean sum b^2 / sum b), cost = I(z; y | x) = H(strategy) nats for a z that "
                  "names the strategy; beta_c = gain / cost. Before any training; the beta sweep "
                  "(`tokweight experiment --sweep beta`) measures it."),
                 records_table(summary["predicted_beta_c"],
                               {"fingerprint": "fingerprint", "weighting": "weighting", "gain_nats": "gain (nats)",
                                "kl_cost_nats": "KL cost H(strategy) (nats)",
                                "beta_c_predicted": "predicted beta_c"}),
                 "" if any(r["kl_cost_nats"] for r in summary["predicted_beta_c"]) else
                 "No example carries a strategy label, so the cost is unknown (pass `--data` if the dataset has it).",
                 "## Files", "`summary.json` (headline numbers), `config.json` (this run's settings), the CSV tables "
                 "and PNG plots above."]


def _plot_md(name: str, plots: list[str]) -> str:
    return f"![{name}]({name})" if name in plots else ""


def _t0_table(fps: list[dict]) -> str:
    rows = []
    for f in fps:
        for est in ("t0_share", "t0_threshold"):
            rows.append({"fingerprint": f["fingerprint"], "estimator": est, "compared": f.get(f"{est}_compared"),
                         "exact": _pct(f.get(f"{est}_exact")), "mae": f.get(f"{est}_mae"),
                         "within_1": _pct(f.get(f"{est}_within_1")),
                         "no_estimate": f.get("degenerate") if est == "t0_share" else f.get("t0_threshold_none")})
    return records_table(rows, {"fingerprint": "fingerprint", "estimator": "estimator", "compared": "examples compared",
                                "exact": "exact match", "mae": "MAE (positions)", "within_1": "within 1",
                                "no_estimate": "no estimate"})


def _profile_table(rows: list[dict]) -> str:
    rows = [r for r in rows if r["pos"] < MAX_TABLE_POSITIONS]
    return records_table(rows, {"fingerprint": "fingerprint", "pos": "pos", "n": "n", "mean_b": "mean b",
                                "q10_b": "10%", "median_b": "median", "q90_b": "90%", "mean_pi": "mean pi"})


def _wide_profile(rows: list[dict], key: str) -> str:
    """One row per (fingerprint, key), mean b at positions 0..MAX_TABLE_POSITIONS-1 as columns."""
    if not rows:
        return ""
    width = min(MAX_TABLE_POSITIONS, max(r["pos"] for r in rows) + 1)
    wide = []
    for (fp, value), group in group_records(rows, ("fingerprint", key)).items():
        means = {r["pos"]: r["mean_b"] for r in group}
        wide.append({"fingerprint": fp[:8], key: value, **{str(t): means.get(t) for t in range(width)}})
    columns = ["fingerprint", key, *map(str, range(width))]
    return records_table(wide, dict(zip(columns, columns)))
