"""A train run's figures, each a ``Figure`` (or None when the run has nothing to draw) from its directory: the
posterior's usage per latent value over steps, the KL and the exact MI over steps, each start's validation
objective, the base model's surprisal profile with the reconstruction weights; and eval's figure of which
strategies each latent value's decodes execute. The trackers get them as images at the end of a run
(``tokweight.commands.tracking``); eval writes its figure beside eval.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tokweight.report.plots import figure


def run_figures(run: str | Path) -> dict:
    """{file name: Figure or None} of a train run's directory (its metrics.jsonl, starts/, config.json and the store
    its checkpoint names)."""
    from tokweight.training.loop.run_dir import read_config, read_metrics

    run = Path(run)
    records, cfg = read_metrics(run), read_config(run)
    k = cfg.cvae.k if cfg.cvae.latent == "discrete" else None
    return {"usage.png": plot_usage(records),
            "kl_mi.png": plot_kl_mi(records, k),
            "starts.png": plot_starts(start_records(run), cfg.loss.beta),
            "surprisal_profile.png": plot_surprisal_profile(profile_of(run, cfg.io.store))}


def start_records(run: Path) -> dict[str, list[dict]]:
    """{start: its metrics.jsonl records} of RUN/starts/seed-S/ (empty for a run of one start)."""
    from tokweight.training.loop.run_dir import read_metrics

    return {path.name: read_metrics(path) for path in sorted((run / "starts").glob("seed-*"))
            if (path / "metrics.jsonl").is_file()}


def profile_of(run: Path, store: str | None) -> list[dict]:
    """The run's baseline's per-position profile (store/sql/profile_by_position.sql: mean b and mean pi by position
    in S), [] where the run reads no store or its checkpoint names no baseline."""
    from tokweight.store.sql import connect, read_sql
    from tokweight.training.loop.run_dir import committed_checkpoint

    state = committed_checkpoint(run) / "state.json"
    if not store or not state.is_file():
        return []
    fingerprint = json.loads(state.read_text()).get("baseline_fingerprint")
    if not fingerprint:
        return []
    table = connect(store, [fingerprint]).sql(read_sql("profile_by_position")).to_arrow_table()
    return table.to_pylist()


def usage_table(records: list[dict]) -> tuple[list[int], np.ndarray]:
    """(steps, (steps, K) usage) of the records that carry ``usage``."""
    rows = [r for r in records if isinstance(r.get("usage"), list)]
    return [r["step"] for r in rows], np.array([r["usage"] for r in rows], dtype=float)


def plot_usage(records: list[dict]):
    """The posterior's mean q per latent value over steps: training batches (lines), validations (dots)."""
    train = [r for r in records if "split" not in r]
    val = [r for r in records if r.get("split") == "val"]
    steps, usage = usage_table(train)
    if not steps:
        return None
    fig, (ax,) = figure(1, width=6.0, height=3.6)
    for k in range(usage.shape[1]):
        line, = ax.plot(steps, usage[:, k], label=f"z={k}")
        v_steps, v_usage = usage_table(val)
        if v_steps:
            ax.plot(v_steps, v_usage[:, k], "o", ms=3, color=line.get_color())
    ax.set(xlabel="step", ylabel="mean q(z | x, y)", ylim=(0, 1), title="usage per latent value (dots: validation)")
    ax.legend(fontsize=7, ncol=2)
    return fig


def plot_kl_mi(records: list[dict], k: int | None):
    """KL(q || p) over steps (training batches and validations) and the validations' exact MI against log K."""
    train = [r for r in records if "split" not in r and "kl" in r]
    val = [r for r in records if r.get("split") == "val" and "kl" in r]
    if not train and not val:
        return None
    fig, (ax,) = figure(1, width=6.0, height=3.6)
    ax.plot([r["step"] for r in train], [r["kl"] for r in train], label="KL (train)")
    ax.plot([r["step"] for r in val], [r["kl"] for r in val], "s-", ms=3, label="KL (val)")
    mi = [r for r in val if "mi" in r]
    if mi:
        ax.plot([r["step"] for r in mi], [r["mi"] for r in mi], "o-", ms=3, label="exact MI (val)")
    if k:
        ax.axhline(math.log(k), color="grey", ls="--", lw=0.8, label="log K")
    ax.set(xlabel="step", ylabel="nats", title="KL and exact MI")
    ax.legend(fontsize=7)
    return fig


def plot_starts(starts: dict[str, list[dict]], beta: float):
    """Each start's validation objective (recon + beta KL, nats per example) over its steps."""
    from tokweight.training.loop.convergence import val_objective

    curves = {name: [r for r in records if r.get("split") == "val" and "recon" in r] for name, records in starts.items()}
    curves = {name: rows for name, rows in curves.items() if rows}
    if not curves:
        return None
    fig, (ax,) = figure(1, width=6.0, height=3.6)
    for name, rows in curves.items():
        ax.plot([r["step"] for r in rows], [val_objective(r, beta) for r in rows], "o-", ms=3, label=name)
    ax.set(xlabel="step", ylabel="recon + beta KL (nats)", title="validation objective of each start")
    ax.legend(fontsize=7)
    return fig


def plot_surprisal_profile(profile: list[dict]):
    """Mean b by position in S (left axis) and the surprisal-share reconstruction weight pi_t = b_t / sum b by
    position (right axis), beside the uniform weight 1/T's mean."""
    rows = [r for r in profile if r.get("mean_b") is not None]
    if not rows:
        return None
    fig, (ax,) = figure(1, width=6.0, height=3.6)
    pos = [r["pos"] for r in rows]
    ax.plot(pos, [r["mean_b"] for r in rows], marker=".", label="mean b")
    ax.fill_between(pos, [r["q10_b"] or 0.0 for r in rows], [r["q90_b"] or 0.0 for r in rows], alpha=0.2)
    ax.set(xlabel="position in S (0-based)", ylabel="b (nats)", title="surprisal profile and reconstruction weights")
    weights = ax.twinx()
    weights.plot(pos, [r["mean_pi"] or 0.0 for r in rows], color="C1", marker=".", label="surprisal-share pi_t")
    weights.axhline(1.0 / len(pos), color="C2", ls="--", lw=0.8, label="uniform 1/T (longest T)")
    weights.set_ylabel("mean weight")
    weights.legend(fontsize=7, loc="upper right")
    ax.legend(fontsize=7, loc="upper center")
    return fig


def plot_strategies(evaluated: dict):
    """eval's share of each latent value's decodes that execute each strategy (synthetic data), or, label-free,
    the strategies its decodes reproduce (``verdict.value_report``); None where eval measured neither."""
    decode = evaluated.get("decode") or {}
    table = decode.get("executes")
    if not table and evaluated.get("values"):
        table = {v: r["decodes"] or {} for v, r in evaluated["values"]["values"].items()}
    if not table:
        return None
    values = list(table)
    names = sorted({n for row in table.values() for n in row})
    if not names:
        return None
    shares = np.array([[table[v].get(n, 0.0) for n in names] for v in values], dtype=float)
    fig, (ax,) = figure(1, width=max(4.0, 0.7 * len(names) + 2.5), height=max(3.0, 0.45 * len(values) + 1.5))
    image = ax.imshow(shares, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(values)), [f"z={v}" for v in values], fontsize=7)
    for i in range(len(values)):
        for j in range(len(names)):
            ax.text(j, i, f"{shares[i, j]:.2f}", ha="center", va="center", fontsize=6,
                    color="white" if shares[i, j] < 0.5 else "black")
    ax.set(xlabel="strategy", ylabel="latent value", title="strategies each latent value's decodes execute")
    fig.colorbar(image, ax=ax, label="share of decodes")
    return fig
