"""Schedules over a run's steps: what the objective does at each step (``Schedule``), and the learning rate.

``Schedule`` is resolved once from the run's TrainConfig (``Schedule.of``, at setup); ``schedule.at(step)`` is that
step's terms (``StepSchedule``), which the objective (``loss.step_loss``), the step's labels, validation, eval
and encode read, and nothing else decides:

- beta, the KL weight: rises linearly from 0 over ``loss.beta_warmup_steps``, then stays. From scratch the warm-up
  matters: under the exact E-step beta is also the E-step's temperature, and at the full beta from step 0 it drowns
  the spread of R across latent values before the decoder has any;
- the anchor term's weight: 0 before ``loss.anchor_start_step`` (None: the warm-up's end), ``loss.anchor_weight``
  from there;
- the E-step: its objective on (``em``) until ``estep.until_step`` (0: every step; never in mode "off"), and its
  settings as they act at the step: the hardening (``estep.harden``) from ``estep.harden_from`` on, none before it,
  nor while it is None (a start, not yet compared);
- the likelihood read: where the hardening acts and ``cvae.posterior_likelihood`` is on, the posterior reads y's
  likelihood on the examples the E-step is sure of (``estep.read_likelihood``): never in a start, whose comparison
  reads the head alone, nor at K = 2.

A model trained N steps is validated, evaluated and encoded with step N - 1's terms (its posterior as the last
step read it). The learning rate stays, then falls linearly to 0 over the end of the run (``lr_decay_window``,
``lr_at``): it depends on where the stop rule said the run converged, so it is the run's progress, not the config's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tokweight.training.config.components import EStepConfig
from tokweight.training.config.train import TrainConfig


def warmed_up(value: float, step: int, warmup_steps: int) -> float:
    """``value`` at ``step`` (0-based) of a linear warm-up from 0 over ``warmup_steps``:
    value * min(1, (step + 1) / warmup_steps); ``value`` throughout without one."""
    if warmup_steps == 0:
        return value
    return value * min(1.0, (step + 1) / warmup_steps)


@dataclass(frozen=True)
class StepSchedule:
    """What the objective does at one step."""

    step: int
    beta: float
    """The KL weight (and the E-step's temperature under ``follow_beta``)."""
    anchor_weight: float
    """The anchor term's weight; 0: the term is measured, not optimised."""
    em: bool
    """Whether the E-step objective is the one optimised (else the plain objective E_q[R] + beta KL)."""
    estep: EStepConfig
    """The E-step as it acts at this step: ``harden`` 0 where the hardening does not act yet."""
    reads_likelihood: bool
    """Whether the posterior reads y's likelihood on the examples the E-step is sure of."""


@dataclass(frozen=True)
class Schedule:
    """A run's schedule, resolved from its TrainConfig (``of``)."""

    beta: float
    beta_warmup_steps: int
    anchor_weight: float
    anchor_start: int
    """The first step (0-based) at which the anchor term acts."""
    estep: EStepConfig
    """The run's resolved E-step (``harden_from`` None: the hardening never acts)."""
    posterior_likelihood: bool

    @classmethod
    def of(cls, cfg: TrainConfig) -> Schedule:
        """The schedule of ``cfg``, whose E-step (``harden_from`` included) the TrainConfig resolved."""
        loss = cfg.loss
        anchor_start = loss.beta_warmup_steps if loss.anchor_start_step is None else loss.anchor_start_step
        return cls(loss.beta, loss.beta_warmup_steps, loss.anchor_weight, anchor_start, cfg.estep,
                   bool(cfg.cvae.posterior_likelihood))

    def at(self, step: int) -> StepSchedule:
        """Step ``step``'s (0-based) terms."""
        estep = self.estep
        em = estep.mode not in (None, "off") and (estep.until_step == 0 or step < estep.until_step)
        hardens = estep.harden_from is not None and step >= estep.harden_from
        acting = estep if not estep.harden or hardens else replace(estep, harden=0.0)
        return StepSchedule(step, warmed_up(self.beta, step, self.beta_warmup_steps),
                            self.anchor_weight if step >= self.anchor_start else 0.0, em, acting,
                            self.posterior_likelihood and acting.harden > 0)

    @property
    def settled_from(self) -> int:
        """The step from which the objective stops changing: beta's warm-up over, the anchor term on (when it ever
        is), an E-step warm start (``until_step``) over. The stop rule counts validations from there."""
        anchor = self.anchor_start if self.anchor_weight > 0 else 0
        until = self.estep.until_step if self.estep.mode != "off" else 0
        return max(self.beta_warmup_steps, anchor, until)


def lr_decay_window(steps: int, fraction: float, converged_at: int | None = None) -> tuple[int, int]:
    """[start, end) of the learning rate's linear fall to 0 at the end of a run, ``fraction`` of its steps:
    the last round(fraction * steps) of a run that trains to its cap of ``steps``; for a run whose stop rule
    said it converged at step ``converged_at``, the steps from there that make ``fraction`` of the run's
    length (within the cap). fraction 0: no fall, and a converged run stops where it converged."""
    if converged_at is None:
        return steps - round(fraction * steps), steps
    return converged_at, min(steps, round(converged_at / (1 - fraction)))


def lr_at(lr: float, step: int, window: tuple[int, int]) -> float:
    """The learning rate of step ``step`` (0-based): ``lr`` before the window, then linearly to 0 at its end
    (the window's last step takes lr / its length)."""
    start, end = window
    return lr if step < start else lr * (end - step) / (end - start)
