"""Which latent value a strategy label's lines are fixed to (``estep.labelled`` with ``estep.label_map`` "matched").

A label says which lines share a strategy; it cannot say which of K interchangeable values should write it. Fixed to
value k for label k from step 0, a few labelled lines fight the code the unlabelled lines set in the first steps
(every permutation of the values reconstructs as well), and lose: the decoders keep the unlabelled lines' code, and
each labelled line is left on a value that writes another strategy. ``LabelValues`` keeps the running joint of a
labelled line's label and its decoders' choice (argmin R) and gives each label one value, the pairs the decoders
agree on most (greedy, one to one, on the device); the E-step fixes the labelled lines to their label's value. So
every line of a label goes to one value (a value that writes one strategy on some inputs and another on the rest is
pulled apart), whichever index the code gave the strategy. The table starts independent, where the pairing is label
k to value k, and a checkpoint keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokweight.training.objective.clusters import AGREEMENT_DECAY, one_to_one, pointwise_mi
from tokweight.training.objective.estep import one_hot
from tokweight.training.objective.global_batch import LOCAL, GlobalBatch


@dataclass
class LabelValues:
    """The running joint P(label, choice) of the labelled lines (L labels x K values, L <= K, on the run's device;
    each step's labelled lines enter with weight 1 - decay, every rank the same table) and the values it pairs
    the labels with."""

    joint: torch.Tensor  # (L, K), summing to 1
    decay: float = AGREEMENT_DECAY

    @classmethod
    def start(cls, labels: int, k: int, device: torch.device, saved: list | None = None) -> LabelValues:
        """Independent labels and values, or a checkpoint's table (``saved``)."""
        if saved is None:
            joint = torch.full((labels, k), 1.0 / (labels * k))
        else:
            joint = torch.tensor(saved, dtype=torch.float32)
            if joint.shape != (labels, k):
                raise ValueError(f"the checkpoint's label table is {tuple(joint.shape)}, the run has {labels} labels "
                                 f"and k={k}: resume with the data and k it was trained on")
        return cls(joint.to(device))

    def values(self) -> torch.Tensor:
        """(L,) the value each label is paired with: label l and the value its lines' decoders choose most beyond
        chance (pointwise mutual information), one to one."""
        return one_to_one(pointwise_mi(self.joint).T)

    def assign(self, labels: torch.Tensor) -> torch.Tensor:
        """(B,) each labelled line's value, -1 where ``labels`` (B,) is -1 (unlabelled)."""
        labels = labels.to(self.joint.device)
        return torch.where(labels >= 0, self.values()[labels.clamp(min=0)], labels)

    @torch.no_grad()
    def update(self, labels: torch.Tensor, R: torch.Tensor, batch: GlobalBatch = LOCAL) -> None:
        """Fold in a step's labelled lines (``labels`` (B,) their label index, -1 for the rest) against the one-hot
        of argmin R (B, K), over the global batch, in place and on the device; a step without any leaves it."""
        L, K = self.joint.shape
        labels = labels.to(R.device)
        rows = one_hot(labels.clamp(min=0), L, torch.float32) * (labels >= 0)[:, None].float()  # (B, L)
        counts = batch.average(rows.T @ one_hot(R.argmin(-1), K, torch.float32))  # (L, K), / world
        n = counts.sum()
        folded = self.joint * self.decay + (1 - self.decay) * counts / n.clamp(min=1e-12)
        self.joint.copy_(torch.where(n > 0, folded, self.joint))

    def to_json(self) -> list:
        return self.joint.tolist()
