"""When z counts as kept, and beta_c: the largest beta of a table that kept it; bisection between grid betas."""

from __future__ import annotations

import math

KEPT_FRACTION = 0.5
"""z counts as kept when the exact MI is at least this fraction of log S."""
PREDICTION_TOLERANCE = 1.5
"""The factor within which a measured beta_c counts as predicted by the store (issue #18's target)."""
NO_BETA = "none"
"""What a table says when no beta of the grid kept z (beta_c does not exist; it is not 0)."""
CRITERIA = {"mi": "exact I(z; x,y)", "strategy_mi": "exact I(z; strategy)"}
"""Per-cell MI columns beta_c is computed from: the issue's definition, and its strategy-only variant."""


def beta_c(mi_by_beta: dict[float, float | None], threshold: float) -> float | None:
    """The largest beta whose MI >= threshold; None when no beta in the table kept z."""
    kept = [b for b, mi in mi_by_beta.items() if mi is not None and mi >= threshold]
    return max(kept) if kept else None


def bracket(betas: tuple[float, ...], found: float | None) -> tuple[float, float] | None:
    """(beta_c, the next grid beta above it): where bisection looks; None at either end of the grid."""
    if found is None or found >= betas[-1]:
        return None
    return found, min(b for b in betas if b > found)


def show(beta: float | None) -> str:
    return NO_BETA if beta is None else f"{beta:.4g}"


def midpoint(span: tuple[float, float]) -> float:
    """The log-scale midpoint of (lo, hi), to 4 significant digits (a readable key and label)."""
    return float(f"{math.sqrt(span[0] * span[1]):.4g}")


def narrow(span: tuple[float, float], mid: float, mi: float, threshold: float) -> tuple[float, float]:
    """span = (a beta that kept z, a larger one that did not): the half that still brackets beta_c,
    given the MI measured at its midpoint."""
    return (mid, span[1]) if mi >= threshold else (span[0], mid)


def suffix(metric: str) -> str:
    """Column suffix of a criterion: "" for the definition ("mi"), "_strategy_mi" for the variant."""
    return "" if metric == "mi" else f"_{metric}"
