"""Schedules over a run's steps: the KL weight beta rises linearly from 0 over a warm-up, then stays; the
learning rate stays, then falls linearly to 0 over the end of the run.

From scratch the warm-up matters: under the exact E-step beta is also the E-step's temperature, and at the
full beta from step 0 it drowns the spread of R across latent values before the decoder has any.
"""

from __future__ import annotations


def warmed_up(value: float, step: int, warmup_steps: int) -> float:
    """``value`` at ``step`` (0-based) of a linear warm-up from 0 over ``warmup_steps``:
    value * min(1, (step + 1) / warmup_steps); ``value`` throughout without one."""
    if warmup_steps == 0:
        return value
    return value * min(1.0, (step + 1) / warmup_steps)


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
