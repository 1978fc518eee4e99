"""A training run's state: the live objects it trains with (``State``) and where it stands (``Progress``).

Everything in ``Progress`` is saved with each checkpoint (``callbacks.Checkpoint``), so a resumed run goes on
as if never stopped; the objects are rebuilt by ``setup.setup``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokweight.pipeline.data.errors import Skips
from tokweight.pipeline.ranks import Ranks
from tokweight.training.objective.baselines import Baseline
from tokweight.training.objective.clusters import Agreement, Clusters
from tokweight.training.objective.label_values import LabelValues
from tokweight.training.loop.convergence import Convergence
from tokweight.training.cvae.model import CVAE
from tokweight.training.loop.batches import StreamSpec
from tokweight.training.objective.global_batch import GlobalBatch
from tokweight.training.config.components import WeightingParams
from tokweight.training.objective.schedules import Schedule, lr_decay_window


@dataclass
class Progress:
    """Where a run stands."""

    step: int = 0  # optimizer steps taken
    convergence: Convergence = field(default_factory=Convergence)  # the stop rule's state
    converged_at: int | None = None  # the step the stop rule said the run converged: the lr's fall starts there
    stop: str | None = None  # why the run stopped: "converged" or "step cap"; None while it trains
    skips: Skips = field(default_factory=Skips)  # samples this rank's streams left out (train and val), per shard

    def decay_window(self, steps: int, lr_decay: float) -> tuple[int, int]:
        """[start, end) of the learning rate's fall to 0: the cap's last steps, or from where the run converged.
        The run ends at its end."""
        return lr_decay_window(steps, lr_decay, self.converged_at)

    def stop_reason(self, steps: int, lr_decay: float) -> str | None:
        if self.step < self.decay_window(steps, lr_decay)[1]:
            return None
        return "converged" if self.converged_at is not None else "step cap"


@dataclass
class State:
    """The live objects of a run, and its progress; the configs stay with the caller."""

    model: CVAE  # the CVAE itself (sharded in place under FSDP)
    engine: torch.nn.Module  # what the step calls: the model, or DistributedDataParallel around it (``engine.py``)
    opt: torch.optim.Optimizer
    baseline: Baseline
    params: WeightingParams
    spec: StreamSpec  # the training stream
    global_batch: GlobalBatch  # this rank's place in the data-parallel job
    ranks: Ranks
    device: torch.device
    meta: dict  # the run's part of the checkpoint's state.json (run_dir.save_checkpoint)
    schedule: Schedule  # what the objective does at each step, resolved from the run's config once
    strategy_names: tuple[str, ...] = ()  # an E-step that reads labels: label k is strategy_names[k]
    progress: Progress = field(default_factory=Progress)
    sharded: bool = False  # FSDP: parameters, gradients and AdamW's state are sharded over the ranks (``engine.py``)
    clusters: Clusters | None = None  # the base's grouping the E-step weighs in (``estep.cluster_weight``)
    agreement: Agreement | None = None  # which values its clusters tilt toward (``estep.cluster_map`` not "identity")
    label_values: LabelValues | None = None  # which value a label's lines take (``estep.label_map`` "matched")


def rng_states(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's global torch RNG states (dropout draws from them; every other draw of a run has its
    own seeded generator)."""
    states = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_states(states: dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore ``rng_states``' result (a resumed run's; nothing for a fresh one)."""
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)
