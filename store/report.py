"""`tokweight inspect`: run every estimator of store/sql/ and write a report a researcher reads top to bottom.

OUT/report.md (tables and PNGs), OUT/summary.json (the headline numbers per fingerprint),
OUT/config.json (the resolved config) and OUT/*.csv (the full profile and confusion
tables). Every number comes from SQL over the views of store.sql: the files of store/sql/,
and the collapse-threshold prediction (``PREDICTED_BETA_C``) below.
Plots use matplotlib's object API (``Figure``, Agg canvas): no pyplot state.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tokweight.store.durable import write_json_atomic
from tokweight.store.plots import figure, save_figures
from tokweight.store.sql import QUANTILE_TOKENS, EstimatorParams, connect, read_sql
from tokweight.store.tables import records_table

PREDICTED_BETA_C = """
-- The beta below which a z that removes all of the base model's surprisal pays for itself, per
-- weighting: the reconstruction it gains (a z with l_t(z) = 0 wherever b_t > 0) over the KL it costs,
-- I(z; y | x) = H(strategy) for a z that names the strategy (x does not tell it on a synthetic task).
-- Gains per example, averaged: uniform sum b / T; sum: sum b; surprisal-share: sum b^2 / sum b (a
-- b-weighted mean of b; a degenerate example falls back to uniform). RESEARCH-NOTES, "Where beta = 1
-- stands"; the survival sweep found the gains follow this, not T/(t0+1).
WITH labelled AS (
    SELECT fingerprint, strategy, count(*) AS n FROM examples WHERE strategy IS NOT NULL GROUP BY ALL),
cost AS (
    SELECT fingerprint, -sum(n / total * ln(n / total)) AS kl_cost
    FROM (SELECT *, sum(n) OVER (PARTITION BY fingerprint) AS total FROM labelled) GROUP BY fingerprint),
gain AS (
    SELECT fingerprint, avg(b_sum / T) AS uniform, avg(b_sum) AS "sum",
           avg(CASE WHEN degenerate THEN b_sum / T ELSE b_sq_sum / b_sum END) AS "surprisal-share"
    FROM examples GROUP BY fingerprint)
SELECT fingerprint, weighting, gain_nats, kl_cost AS kl_cost_nats, gain_nats / kl_cost AS beta_c_predicted
FROM (UNPIVOT gain ON uniform, "sum", "surprisal-share" INTO NAME weighting VALUE gain_nats)
LEFT JOIN cost USING (fingerprint)
ORDER BY fingerprint, list_position(['uniform', 'sum', 'surprisal-share'], weighting)
"""

PROFILE_QUERIES = ("profile_by_position", "profile_by_strategy", "profile_by_T")
MAX_TABLE_POSITIONS = 16  # wider profiles go to the CSV files only


@dataclass(frozen=True)
class InspectConfig:
    """What `tokweight inspect` reads and where it writes."""

    store: str
    """Store root (holding fingerprint=<fp>/ directories)."""
    out: str
    """Report directory; created if missing, its report files overwritten."""
    data: str | None = None
    """Dataset the store was extracted from: its strategy/t0 fill in what stored rows lack."""
    fingerprints: tuple[str, ...] = ()
    """Fingerprints to report side by side; empty: all in the store."""
    q: float = 0.9
    """Cumulative share for t0_share."""
    tau: float = 0.1
    """Threshold in nats for t0_threshold."""
    eps: float = 1e-6
    """Degenerate-example threshold on sum b."""
    exact_quantiles: bool = False
    """The per-position profile's quantiles over every example (default: a key-hash sample of examples
    above store.sql.QUANTILE_TOKENS tokens; the profile's n_quantile column says how many were read)."""

    def __post_init__(self):
        EstimatorParams(self.q, self.tau, self.eps)  # validates
        if not self.store:
            raise ValueError("store must be a path")

    @property
    def params(self) -> EstimatorParams:
        return EstimatorParams(self.q, self.tau, self.eps)


def run(cfg: InspectConfig, ground_truth: pa.Table | None = None) -> dict:
    """Write the report files and return the summary. ``ground_truth``: (fingerprint, shard, key,
    strategy, t0) rows that fill in what the store lacks; reading them from ``cfg.data`` takes the
    data layer (``pipeline.inspect``), which the store does not import."""
    if cfg.data and ground_truth is None:
        raise ValueError(f"the labels of {cfg.data} must be read by the caller: use pipeline.inspect.run")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    con = connect(cfg.store, cfg.fingerprints, cfg.params, ground_truth=ground_truth,
                  quantile_tokens=None if cfg.exact_quantiles else QUANTILE_TOKENS)
    summary_rows = _records(con.sql(read_sql("summary")))
    manifests = _records(con.sql("SELECT * EXCLUDE (manifest) FROM manifests ORDER BY fingerprint"))
    # each query runs once, into Arrow: the CSV file and the report's rows both read that result
    tables = {name: con.from_arrow(con.sql(read_sql(name)).to_arrow_table())
              for name in (*PROFILE_QUERIES, "t0_confusion")}
    for name, rel in tables.items():
        rel.write_csv(str(out / f"{name}.csv"))
    profiles = {name: _records(tables[name]) for name in PROFILE_QUERIES}
    confusion = _records(tables["t0_confusion"])
    per_example = con.sql("SELECT fingerprint, T, t0, t0_share, amplification, amplification_true, "
                          "share_entropy, effective_tokens, max_share FROM examples").fetchnumpy()

    plots = {
        "profile.png": plot_profile(profiles["profile_by_position"], profiles["profile_by_strategy"]),
        "t0_confusion.png": plot_t0(per_example),
        "amplification.png": plot_amplification(per_example),
        "concentration.png": plot_concentration(per_example),
    }
    saved = save_figures(plots, out)
    summary = {"store": str(Path(cfg.store).resolve()), "params": asdict(cfg.params),
               "fingerprints": [{**m_row, **s_row} for m_row, s_row in _pair(manifests, summary_rows)],
               "predicted_beta_c": predicted_beta_c(con)}
    write_json_atomic(out / "summary.json", summary)
    write_json_atomic(out / "config.json", asdict(cfg))
    (out / "report.md").write_text(render_report(cfg, summary, profiles, confusion, saved))
    return summary


def predicted_beta_c(con) -> list[dict]:
    """Per fingerprint and weighting: the z-gain, its KL cost and beta_c = gain / cost (``PREDICTED_BETA_C``);
    cost and beta_c are None where no example carries a strategy label."""
    return _records(con.sql(PREDICTED_BETA_C))


def _records(rel) -> list[dict]:
    return [{k: _plain(v) for k, v in row.items()} for row in rel.to_arrow_table().to_pylist()]


def _plain(v):
    """JSON-safe: NaN/inf become None (JSON has neither)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _pair(manifests: list[dict], summaries: list[dict]):
    by_fp = {s["fingerprint"]: s for s in summaries}
    for m in manifests:
        yield ({"fingerprint": m["fingerprint"], "format": m["format"], "complete": m["complete"],
                "skipped": json.loads(m["skipped"])}, by_fp.get(m["fingerprint"], {}))


# ---------------------------------------------------------------- plots (each returns a Figure or None)


def plot_profile(by_position: list[dict], by_strategy: list[dict]):
    """Mean b by position with its 10-90% band, per fingerprint; mean b by position per strategy."""
    if not by_position:
        return None
    fig, (ax, ax_s) = figure(2, height=3.6)
    for (fp,), rows in _group(by_position, ("fingerprint",)).items():
        pos = [r["pos"] for r in rows]
        line, = ax.plot(pos, [r["mean_b"] for r in rows], marker=".", label=f"{fp[:8]} mean")
        ax.fill_between(pos, [r["q10_b"] for r in rows], [r["q90_b"] for r in rows], alpha=0.2, color=line.get_color())
    ax.set(xlabel="position in S (0-based)", ylabel="b (nats)", title="surprisal by position (band: 10-90%)")
    ax.legend(fontsize=7)
    for (fp, strategy), rows in _group(by_strategy, ("fingerprint", "strategy")).items():
        ax_s.plot([r["pos"] for r in rows], [r["mean_b"] for r in rows], marker=".", label=f"{fp[:8]} {strategy}")
    ax_s.set(xlabel="position in S (0-based)", ylabel="mean b (nats)", title="by strategy")
    ax_s.legend(fontsize=7)
    return fig


def _group(records: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return groups


def _fp_masks(ex: dict) -> dict[str, np.ndarray]:
    fps = np.asarray(ex["fingerprint"]).astype(str)
    return {fp: fps == fp for fp in sorted(set(fps))}


def _valid(*arrays) -> np.ndarray:
    """Rows where every (masked) array has a value."""
    keep = np.ones(len(arrays[0]), bool)
    for a in arrays:
        keep &= ~np.ma.getmaskarray(a)
    return keep


def plot_t0(ex: dict):
    """Confusion counts of t0_share against the ground-truth t0, one panel per fingerprint."""
    masks = {fp: m & _valid(ex["t0"], ex["t0_share"]) for fp, m in _fp_masks(ex).items()}
    masks = {fp: m for fp, m in masks.items() if m.any()}
    if not masks:
        return None
    from matplotlib.colors import LogNorm

    fig, axes = figure(len(masks), width=4.5, height=4.0)
    for ax, (fp, m) in zip(axes, masks.items()):
        truth, est = np.asarray(ex["t0"])[m].astype(int), np.asarray(ex["t0_share"])[m].astype(int)
        size = int(max(truth.max(), est.max())) + 1
        counts = np.zeros((size, size), int)
        np.add.at(counts, (est, truth), 1)
        image = ax.imshow(np.ma.masked_equal(counts, 0), origin="lower", cmap="viridis", norm=LogNorm())
        ax.plot([0, size - 1], [0, size - 1], color="white", lw=0.8, ls="--")
        ax.set(xlabel="ground-truth t0", ylabel="t0_share estimate",
               title=f"{fp[:8]}: exact {np.mean(truth == est):.1%}")
        fig.colorbar(image, ax=ax, label="examples")
    return fig


def plot_amplification(ex: dict):
    """Histograms of T/(t0+1): estimated (t0_share) and ground truth, per fingerprint."""
    fig, (ax,) = figure(1, width=6.0, height=3.6)
    drawn = False
    for fp, m in _fp_masks(ex).items():
        for column, label, style in (("amplification", "t0_share", "step"), ("amplification_true", "true t0", "bar")):
            values = np.asarray(ex[column])[m & _valid(ex[column])]
            if values.size:
                ax.hist(values, bins=40, histtype=style, alpha=0.5 if style == "bar" else 1.0,
                        label=f"{fp[:8]} {label}")
                drawn = True
    if not drawn:
        return None
    ax.set(xlabel="predicted amplification T / (t0 + 1)", ylabel="examples", title="dilution of the latent's signal")
    ax.legend(fontsize=7)
    return fig


def plot_concentration(ex: dict):
    """Histograms of effective tokens / T, entropy of pi and max share (non-degenerate examples)."""
    panels = (("effective_tokens", "effective tokens / T", True), ("share_entropy", "entropy of pi (nats)", False),
              ("max_share", "max share max_t pi_t", False))
    fig, axes = figure(3, width=4.0, height=3.6)
    drawn = False
    for fp, m in _fp_masks(ex).items():
        keep = m & _valid(ex["effective_tokens"])
        if not keep.any():
            continue
        drawn = True
        for ax, (column, label, per_T) in zip(axes, panels):
            values = np.asarray(ex[column])[keep] / (np.asarray(ex["T"])[keep] if per_T else 1)
            ax.hist(values, bins=40, histtype="step", label=fp[:8])
            ax.set(xlabel=label, ylabel="examples")
    if not drawn:
        return None
    axes[0].legend(fontsize=7)
    fig.suptitle("weight concentration over pi_t = b_t / sum b")
    return fig


# ---------------------------------------------------------------- markdown


def _pct(v) -> str:
    return "–" if v is None else f"{v:.1%}"


def render_report(cfg: InspectConfig, summary: dict, profiles: dict, confusion: list[dict], plots: list[str]) -> str:
    fps = summary["fingerprints"]
    p = cfg.params
    sections = [
        f"# Baseline-store inspection: `{summary['store']}`",
        "Per-token surprisal `b_t = -log p(y_t | x, y_<t)` (nats) of the frozen base model, over the supervised "
        "set S (positions 0..T-1). This report runs the estimators of `store/sql/*.sql`; every number can be "
        f"recomputed with `tokweight sql {cfg.store} \"...\"` over the views `examples` and `tokens`.",
        "## Definitions",
        f"- **t0_share** (q = {p.q}): the first position t with `cumsum_b[t] >= q * sum b`, read from the stored "
        "running sum.\n"
        f"- **t0_threshold** (tau = {p.tau} nats): the last position with `b_t > tau`; none if no position exceeds tau.\n"
        "- **dilution** `(t0 + 1) / T` and **predicted amplification** `T / (t0 + 1)`: positions 0..t0 carry the "
        "strategy, i.e. t0 + 1 tokens. The ground-truth t0 is the first position at which the prefix of S fits "
        "one strategy only.\n"
        "- **Weight concentration** over `pi_t = b_t / sum b`: entropy `-sum pi ln pi` (nats; ln T when uniform), "
        "effective number of tokens `1 / sum pi^2` (T when uniform, 1 when one token carries all), max share.\n"
        f"- **Degenerate** examples have `sum b < eps` (eps = {p.eps:g}): pi is undefined, so they are counted and "
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
    sections += ["## Surprisal profile by position", _plot_md("profile.png", plots),
                 _profile_table(profiles["profile_by_position"]),
                 "Full tables: `profile_by_position.csv`, `profile_by_strategy.csv`, `profile_by_T.csv`.",
                 "### Mean b by position, per strategy",
                 _wide_profile(profiles["profile_by_strategy"], "strategy"),
                 "### Mean b by position, per length T",
                 _wide_profile(profiles["profile_by_T"], "T")]
    sections += ["## t0 estimates against the ground truth", _t0_table(fps), _plot_md("t0_confusion.png", plots)]
    if not any(f.get("with_true_t0") for f in fps):
        sections.append("No example carries a ground-truth t0 (pass `--data` if the dataset has it).")
    sections += ["Full confusion counts: `t0_confusion.csv`." if confusion else "",
                 "## Dilution and predicted amplification",
                 records_table(fps, {"fingerprint": "fingerprint", "mean_dilution": "mean (t0_share+1)/T",
                                     "mean_amplification": "mean T/(t0_share+1)",
                                     "median_amplification": "median T/(t0_share+1)",
                                     "mean_amplification_true": "mean T/(t0+1), true",
                                     "median_amplification_true": "median T/(t0+1), true"}),
                 _plot_md("amplification.png", plots),
                 "## Weight concentration",
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
    return "\n\n".join(s for s in sections if s) + "\n"


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
    for (fp, value), group in _group(rows, ("fingerprint", key)).items():
        means = {r["pos"]: r["mean_b"] for r in group}
        wide.append({"fingerprint": fp[:8], key: value, **{str(t): means.get(t) for t in range(width)}})
    columns = ["fingerprint", key, *map(str, range(width))]
    return records_table(wide, dict(zip(columns, columns)))
