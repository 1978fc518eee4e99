"""The KL weight beta over training: 0 -> beta linearly over a warm-up, then constant.

From scratch the warm-up matters: under the exact E-step beta is also the E-step's temperature,
and at the full beta from step 0 it drowns the spread of R across latent values before the
decoder has any (docs/results/from-scratch/).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BetaSchedule:
    beta: float = 0.3
    """The KL weight after the warm-up."""
    warmup_steps: int = 100
    """Steps of the linear ramp from 0 to beta (0: beta from the first step)."""

    def __post_init__(self):
        if self.beta < 0 or self.warmup_steps < 0:
            raise ValueError(f"need beta >= 0 and warmup_steps >= 0, got {self.beta} and {self.warmup_steps}")

    def at(self, step: int) -> float:
        """beta at ``step`` (0-based): beta * min(1, (step + 1) / warmup_steps)."""
        if self.warmup_steps == 0:
            return self.beta
        return self.beta * min(1.0, (step + 1) / self.warmup_steps)
