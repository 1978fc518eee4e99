"""The KL weight beta over training: constant, linear warm-up, or cyclical (Fu et al. 2019).

(Free bits, the other guard against collapse, is a loss term: ``losses.free_bits_kl``,
with its refusal of lambda >= log K in ``losses.check_free_bits``.)
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("constant", "linear", "cyclical")


@dataclass(frozen=True)
class BetaSchedule:
    beta: float = 1.0
    """The KL weight reached (constant: always)."""
    kind: str = "constant"
    """"constant", "linear" (0 -> beta over warmup_steps) or "cyclical" (cycles x ramp then hold)."""
    warmup_steps: int = 0
    """Linear: steps of the ramp from 0 to beta."""
    cycles: int = 4
    """Cyclical: M, the number of cycles over the run."""
    ramp_ratio: float = 0.5
    """Cyclical: R, the fraction of each cycle spent ramping 0 -> beta (the rest holds beta)."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"beta schedule must be one of {KINDS}, got {self.kind!r}")
        if self.beta < 0 or self.warmup_steps < 0 or self.cycles < 1 or not 0 < self.ramp_ratio <= 1:
            raise ValueError("need beta >= 0, warmup_steps >= 0, cycles >= 1, 0 < ramp_ratio <= 1")
        if self.kind == "linear" and self.warmup_steps < 1:
            raise ValueError("a linear schedule needs warmup_steps >= 1")

    def at(self, step: int, total_steps: int) -> float:
        """beta at ``step`` (0-based) of a run of ``total_steps``.

        linear:   beta * min(1, (step + 1) / warmup_steps)
        cyclical: tau = (step mod (total/M)) / (total/M); beta * min(1, tau / R)
        """
        if self.kind == "constant":
            return self.beta
        if self.kind == "linear":
            return self.beta * min(1.0, (step + 1) / self.warmup_steps)
        period = max(total_steps / self.cycles, 1.0)
        tau = (step % period) / period
        return self.beta * min(1.0, tau / self.ramp_ratio)
