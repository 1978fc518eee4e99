"""The inspection report's plots, each a ``Figure`` (or None when there is nothing to draw) from the
store's inspection (``store.inspection``): its profile records and per-example columns."""

from __future__ import annotations

import numpy as np

from tokweight.report.plots import figure
from tokweight.report.tables import group_records


def inspection_plots(profiles: dict[str, list[dict]], per_example: dict) -> dict:
    """{file name: Figure or None}: the four plots of report.md."""
    return {
        "profile.png": plot_profile(profiles["profile_by_position"], profiles["profile_by_strategy"]),
        "t0_confusion.png": plot_t0(per_example),
        "amplification.png": plot_amplification(per_example),
        "concentration.png": plot_concentration(per_example),
    }


def plot_profile(by_position: list[dict], by_strategy: list[dict]):
    """Mean b by position with its 10-90% band, per fingerprint; mean b by position per strategy."""
    if not by_position:
        return None
    fig, (ax, ax_s) = figure(2, height=3.6)
    for (fp,), rows in group_records(by_position, ("fingerprint",)).items():
        pos = [r["pos"] for r in rows]
        line, = ax.plot(pos, [r["mean_b"] for r in rows], marker=".", label=f"{fp[:8]} mean")
        ax.fill_between(pos, [r["q10_b"] for r in rows], [r["q90_b"] for r in rows], alpha=0.2, color=line.get_color())
    ax.set(xlabel="position in S (0-based)", ylabel="b (nats)", title="surprisal by position (band: 10-90%)")
    ax.legend(fontsize=7)
    for (fp, strategy), rows in group_records(by_strategy, ("fingerprint", "strategy")).items():
        ax_s.plot([r["pos"] for r in rows], [r["mean_b"] for r in rows], marker=".", label=f"{fp[:8]} {strategy}")
    ax_s.set(xlabel="position in S (0-based)", ylabel="mean b (nats)", title="by strategy")
    ax_s.legend(fontsize=7)
    return fig


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
