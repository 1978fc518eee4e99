"""When a train run converges: once validation stops improving (it then ends after the learning rate's fall,
``schedules.lr_decay_window``), else it trains to its step cap.

The rule (``components.StopRule``) reads the periodic validations (``LogConfig.eval_every``, on the first ``eval_examples``
val examples), in order:

- counted: the validations at or after the step where the objective stops changing
  (``schedules.Schedule.settled_from``: the end of beta's warm-up, the anchor term's start, the end of an
  E-step warm start); before it the objective itself moves, so a plateau there says nothing;
- improved: the val objective recon + beta * KL (nats, at beta after its warm-up) fell more than
  ``min_delta_objective`` below its best so far, or the MI (discrete: the exact I(z; x, y); continuous:
  the Monte Carlo estimate) rose more than ``min_delta_mi`` above its best so far; the first counted
  validation sets both bests;
- converged: ``patience`` consecutive counted validations without an improvement.

Pure functions of the validations' numbers: every rank, reading the same gathered metrics, decides
the same; the rule's state (``Convergence``) is saved with each checkpoint, so a resumed run decides
what the uninterrupted one decides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from tokweight.training.config.components import StopRule


@dataclass(frozen=True)
class Convergence:
    """The rule's state after the validations so far."""

    best_objective: float | None = None
    best_mi: float | None = None
    best_step: int | None = None
    """The last counted validation that improved either number (the first counted one included)."""
    stale: int = 0
    """Counted validations since ``best_step``."""

    def to_json(self) -> dict:
        return asdict(self)


def val_objective(metrics: dict, beta: float) -> float:
    """recon + beta * KL of a validation's metrics (nats per example)."""
    return metrics["recon"] + beta * metrics["kl"]


def val_mi(metrics: dict) -> float:
    """The MI a validation reports: exact for a discrete latent, the Monte Carlo estimate for a continuous one."""
    return metrics["mi"] if "mi" in metrics else metrics["mi_estimate"]


def observe(state: Convergence, rule: StopRule, step: int, objective: float, mi: float) -> Convergence:
    """The state after a counted validation at ``step``."""
    if state.best_step is None:
        return Convergence(objective, mi, step, 0)
    better_objective = objective < state.best_objective - rule.min_delta_objective
    better_mi = mi > state.best_mi + rule.min_delta_mi
    if not (better_objective or better_mi):
        return replace(state, stale=state.stale + 1)
    return Convergence(min(objective, state.best_objective), max(mi, state.best_mi), step, 0)


def converged(state: Convergence, rule: StopRule) -> bool:
    return rule.patience > 0 and state.stale >= rule.patience
