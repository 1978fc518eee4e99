"""A user task's results.md: the verdict in words, generated from the table's own numbers; what the store
predicted beside what was measured; every metric per arm and beta; the MI and control figure.

Every number of the verdict is formatted by the function that formats it in a table below
(``num``, ``delta``, ``show_beta``, ``show_predicted``), so the verdict quotes the tables, never a figure of
its own. Everything here reads plain data: the aggregated rows, the store's statistics and the job's
config as a dict (``own_task.view``).
"""

from __future__ import annotations

import math

from tokweight.report.plots import figure
from tokweight.report.tables import MISSING, fixed, markdown_table
from tokweight.experiments.cells import STATUSES
from tokweight.experiments.results import beta_c, machine, pm, show
from tokweight.training.config.use import KEPT_FRACTION, kept_threshold

NOT_PREDICTED = "n/a"
"""A predicted beta_c the store cannot give (no example carries a label: the KL cost is unknown)."""


def num(v) -> str:
    return fixed(v)


def delta(v) -> str:
    return MISSING if v is None else f"{v:+.3f}"


def show_beta(beta: float) -> str:
    return f"{beta:g}"


def by_arm(agg: list[dict]) -> dict[str, dict[float, dict]]:
    """arm -> beta -> its aggregated row, arms in first-seen order."""
    out: dict[str, dict[float, dict]] = {}
    for r in agg:
        out.setdefault(r["arm"], {})[r["beta"]] = r
    return out


# ---------------------------------------------------------------- the verdict


def predicted(row: dict, by_weighting: dict[str, float | None]) -> float | None:
    """The store's beta_c for an arm (store/sql/predicted_beta_c.sql): its weighting's, and for lambda < 1 the
    lambda-mix of uniform's and the weighting's (gain and objective mix alike; the cost is the same). The
    anchor term is 0 for the z that removes b and for the collapsed one, so it leaves the prediction alone."""
    own, uniform, lam = by_weighting.get(row["weighting"]), by_weighting.get("uniform"), row["lambda"]
    if own is None or (lam < 1 and uniform is None):
        return None
    return own if lam == 1 else (1 - lam) * uniform + lam * own


def show_predicted(beta: float | None) -> str:
    return NOT_PREDICTED if beta is None else show(beta)


def mi_text(row: dict) -> str:
    """The exact MI and I(z; label) of an aggregated row, as the results table shows their means."""
    return f"MI {num(row['mi_mean'])}, I(z; label) {num(row['strategy_mi_mean'])} at β = {show_beta(row['beta'])}"


def where_kept(arm: str, rows: dict[float, dict], kept: float | None) -> str:
    betas = sorted(rows)
    if kept is None:
        return f"{arm} keeps z at no β of the grid ({mi_text(rows[betas[0]])})"
    above = [b for b in betas if b > kept]
    if not above:
        return f"{arm} keeps z at every β up to {show_beta(kept)} ({mi_text(rows[kept])})"
    return (f"{arm} keeps z up to β = {show_beta(kept)} ({mi_text(rows[kept])}) and loses it above "
            f"({mi_text(rows[above[0]])})")


def kept_mi(rows: dict[float, dict]) -> dict[float, float | None]:
    """beta -> the seed-mean exact MI where eval called z used on most seeds, else None. An exact MI that decoding
    does not show keeps nothing: a latent that codes x (which the learned prior p(z|x) follows at no cost) has
    one and names no strategy."""
    return {b: r["mi_mean"] if 2 * r["seeds_z_used"] > r["n_seeds"] else None for b, r in rows.items()}


def arm_verdict(arm: str, rows: dict[float, dict], kept_at: float, stats: dict) -> str:
    """Where ``arm`` keeps z and loses it, the store's prediction, and at the largest beta that kept z (the
    smallest beta if none did) eval's verdict on z and the decoder's token-mean NLL averaged over q against the
    base model's (a soft q averages in the other values' NLL, so it can exceed the own-value NLL eval judges)."""
    kept = beta_c(kept_mi(rows), kept_at)
    at, base = rows[min(rows) if kept is None else kept], stats["base_nll_test"]
    forecast = predicted(at, stats["beta_c_predicted"])
    nll = at["recon_uniform_mean"]
    parts = [where_kept(arm, rows, kept)]
    parts += [] if forecast is None else [f"the store predicted β_c = {show_predicted(forecast)}"]
    seeds = ", ".join(f"{at.get(f'seeds {status}', 0)} {status}" for status in STATUSES)
    decoder = (f"at β = {show_beta(at['beta'])}, of {at['n_seeds']} seeds: {seeds}; the decoder's token-mean NLL "
               f"averaged over q(z | x, y) is {num(nll)} nats against the base model's {num(base)} "
               f"({delta(None if nll is None else nll - base)})")
    return "; ".join(parts + [decoder])


def verdict(agg: list[dict], k: int, stats: dict, seeds: tuple[int, ...]) -> list[str]:
    kept_at = kept_threshold(k)
    head = (f"On this task (test split, mean over seeds {', '.join(map(str, seeds))}; z counts as kept where the "
            f"exact MI is at least {KEPT_FRACTION:g} log K = {num(kept_at)} nats and eval calls z used on most seeds):")
    return [head, ""] + [f"- {arm_verdict(arm, rows, kept_at, stats)}." for arm, rows in by_arm(agg).items()]


# ---------------------------------------------------------------- the tables


def prediction_table(stats: dict) -> str:
    headers = ["examples", "mean T", "dilution (t0+1)/T", "T/(t0+1), store's t0", "T/(t0+1), labels' t0",
               "t0 exact (store vs labels)", "effective tokens", "gain ratio if z removed every b",
               "base token-mean NLL, test"]
    row = [str(stats["examples"]), fixed(stats["mean_T"], 2), num(stats["mean_dilution"]),
           fixed(stats["mean_amplification"], 2), fixed(stats["mean_amplification_true"], 2),
           num(stats["t0_share_exact"]), fixed(stats["mean_effective_tokens"], 2),
           fixed(stats["gain_ratio_if_z_removes_b"], 2), num(stats["base_nll_test"])]
    return markdown_table(headers, [row])


def beta_c_table(agg: list[dict], k: int, by_weighting: dict[str, float | None]) -> str:
    """Per arm: the beta_c the store predicted beside the measured one, the largest beta of the grid that kept z
    (``kept_mi``)."""
    kept_at = kept_threshold(k)
    rows = [[arm, show_predicted(predicted(next(iter(rs.values())), by_weighting)),
             show(beta_c(kept_mi(rs), kept_at))] for arm, rs in by_arm(agg).items()]
    return markdown_table(["arm", "predicted β_c (store)", "measured β_c (grid)"], rows)


PREDICTION_NOTE = ("Predicted β_c (store/sql/predicted_beta_c.sql, before any training): the reconstruction a z that "
                   "removes all of the base model's surprisal saves under the arm's objective, over its KL cost "
                   f"H(label); {NOT_PREDICTED} where no example carries a label. Measured β_c: the largest β of the "
                   "grid whose seed-mean exact MI kept z, with eval calling z used on most seeds ('none': no β did).")


def profile_table(profile: list[dict]) -> str:
    return markdown_table(["position in S", "examples", "mean b (nats)", "mean share π"],
                          [[str(p["pos"]), str(p["n"]), num(p["mean_b"]), num(p["mean_pi"])] for p in profile])


def with_chance(r: dict, metric: str) -> str:
    return f"{pm(r, metric)} ({num(r[f'chance_{metric}_mean'])})"


def results_table(agg: list[dict], base: float) -> str:
    headers = ["arm", "β", "exact MI", "I(z; label)", "KL", "usage perplexity", "exact match (chance)",
               "first token (chance)", "z used (seeds)", "token-mean NLL", "NLL − base"]
    rows = [[r["arm"], show_beta(r["beta"]), pm(r, "mi"), pm(r, "strategy_mi"), pm(r, "kl"),
             pm(r, "usage_perplexity"), with_chance(r, "exact_match"), with_chance(r, "first_token_match"),
             f"{r['seeds_z_used']}/{r['n_seeds']}", pm(r, "recon_uniform"),
             delta(None if r["recon_uniform_mean"] is None else r["recon_uniform_mean"] - base)]
            for r in sorted(agg, key=lambda r: r["beta"])]
    return markdown_table(headers, rows)


def measured_note(k: int) -> str:
    return (f"Test split, mean ± population std over seeds; nats. z is kept where the exact MI is at least "
            f"{KEPT_FRACTION:g} log K = {num(kept_threshold(k))}. Control: decoding each test example under the latent "
            "value its label is matched to (Hungarian), the share that reproduces its reference y exactly and in "
            "its first token; chance: the same examples under the other values. z used: seeds where `tokweight "
            "eval`'s verdict says so. Token-mean NLL: the decoder's, under q, against the base model's.")


def header(cfg: dict, command: str | None, wall_s: float, cells: int, reused: int) -> list[str]:
    b, ckpt, k = cfg["budget"], cfg["ckpt"], cfg["k"]
    return [f"- command: `{command or '(library call)'}`", f"- machine: {machine()}",
            f"- wall time: {wall_s / 60:.1f} min; {cells} cells, {reused} reused from earlier runs",
            f"- checkpoint: `{ckpt['path']}` ({ckpt['kind']}, {ckpt['parameters']:,} parameters, "
            f"{ckpt['fingerprint'][:12]})",
            f"- data: `{cfg['data']}` (key {cfg['data_key']}); K = {k} (log K = {math.log(k):.3f} nats)",
            f"- recipe `{cfg['recipe']}`, z pathway `{cfg['cond']}`"
            + (f", {cfg['slots']} slots" if cfg["cond"] == "prefix" else ""),
            f"- per cell: {b['steps']} steps, batch {b['batch_size']}, lr {b['lr']:g}, {b['decode_examples']} "
            "decoded examples",
            f"- seeds: {', '.join(map(str, cfg['seeds']))}", ""]


def render(cfg: dict, stats: dict, agg: list[dict], command: str | None, wall_s: float, cells: int,
           reused: int) -> str:
    """results.md; ``cfg`` is ``own_task.view``'s dict, ``stats`` the store's (``inputs.prepare``)."""
    base, k = stats["base_nll_test"], cfg["k"]
    out = ["# tokweight experiment: your own task", "", "## Verdict", ""]
    out += verdict(agg, k, stats, cfg["seeds"]) + [""] + header(cfg, command, wall_s, cells, reused)
    out += ["## What the store predicted, before any CVAE", "", prediction_table(stats), "",
            beta_c_table(agg, k, stats["beta_c_predicted"]), "", PREDICTION_NOTE, "",
            "### Surprisal profile (the base model's b by position)", "", profile_table(stats["profile"]), "",
            "## Measured: every arm and β", "", measured_note(k), "", results_table(agg, base), "",
            "![MI and control against beta](mi_and_control.png)", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- the figure


PANELS = (("mi", "exact MI (nats)"), ("exact_match", "exact match − chance"),
          ("first_token_match", "first token − chance"))
"""The figure's panels: (metric, axis label); a control rate is drawn as its gain over chance."""


def plot_arms(agg: list[dict], k: int):
    """Exact MI and the control's gains over chance against beta, one line per arm (seed means)."""
    fig, axes = figure(len(PANELS))
    for ax, (metric, label) in zip(axes, PANELS):
        for arm, rows in by_arm(agg).items():
            betas = sorted(rows)
            ax.plot(betas, [gain(rows[b], metric) for b in betas], marker="o", label=arm)
        ax.set(xscale="log", xlabel="β", ylabel=label)
    axes[0].axhline(kept_threshold(k), color="grey", ls=":", lw=1, label=f"{KEPT_FRACTION:g} log K (z kept above)")
    for ax in axes:
        ax.legend(fontsize=7)
    return fig


def gain(row: dict, metric: str) -> float:
    """The seed mean of ``metric``, less its chance where it has one (NaN where not measured: no point)."""
    mean, chance = row[f"{metric}_mean"], row.get(f"chance_{metric}_mean", 0.0)
    return math.nan if mean is None or chance is None else mean - chance
