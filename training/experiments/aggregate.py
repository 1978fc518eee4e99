"""Cells' rows -> one row per compared configuration: mean and population std over seeds."""

from __future__ import annotations

import numpy as np

from tokweight.training.experiments.cells import DIAGNOSTICS, METRICS

GROUP_KEYS = ("group", "setting", "latent", "cond", "weighting", "beta")


def mean_std(values: list) -> tuple[float | None, float | None]:
    """Mean and population std of the values that exist (None: no value)."""
    vals = [v for v in values if v is not None]
    return (float(np.mean(vals)), float(np.std(vals))) if vals else (None, None)


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per (group, setting, latent, pathway, weighting, beta): mean and std over seeds of METRICS."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in GROUP_KEYS), []).append(r)
    return [seed_stats(dict(zip(GROUP_KEYS, key)), rs) for key, rs in groups.items()]


def seed_stats(group: dict, rows: list[dict]) -> dict:
    """The group's columns, the seeds it has, and mean and std of every metric over them."""
    out = {**group, "recipe": rows[0]["recipe"], "ratio_true": rows[0]["ratio_true"],
           "ratio_inspect": rows[0]["ratio_inspect"], "n_seeds": len(rows),
           "seeds": ";".join(str(r["seed"]) for r in rows)}
    for m in METRICS + DIAGNOSTICS:
        out[f"{m}_mean"], out[f"{m}_std"] = mean_std([r.get(m) for r in rows])  # cells older than a metric lack it
    return out
