"""Which value a strategy label's lines are fixed to (``training/objective/label_values.py``)."""

from __future__ import annotations

import pytest
import torch

from tokweight.training.objective.clusters import one_to_one
from tokweight.training.objective.label_values import LabelValues


def choices(values: torch.Tensor, k: int) -> torch.Tensor:
    """R (B, K) whose argmin is ``values`` (B,): what the decoders choose."""
    return 1.0 - torch.nn.functional.one_hot(values, k).float()


def test_one_to_one_pairs_the_highest_scores_first_and_ties_column_c_with_row_c():
    score = torch.tensor([[0.0, 5.0, 1.0], [4.0, 4.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    assert one_to_one(score).tolist() == [1, 0, 3]  # (0, 1) at 5 first, then (1, 0) at 4, then (3, 2) at 3
    assert one_to_one(torch.zeros(4, 4)).tolist() == [0, 1, 2, 3]


def test_labels_take_value_k_until_the_decoders_choose_then_the_values_the_decoders_give_their_lines():
    k, n = 4, 16
    table = LabelValues.start(k, k, torch.device("cpu"))
    labels = torch.arange(k).repeat(n)  # (k n,)
    assert table.assign(labels).tolist() == labels.tolist()  # independent: label k, value k
    code = torch.tensor([2, 0, 3, 1])  # the decoders write label l's strategy under value code[l]
    for _ in range(50):
        table.update(labels, choices(code[labels], k))
    assert table.values().tolist() == code.tolist()
    assert torch.allclose(table.joint.sum(), torch.tensor(1.0))
    unlabelled = torch.tensor([-1, 2, -1, 0])
    assert table.assign(unlabelled).tolist() == [-1, 3, -1, 2]


def test_a_split_label_goes_to_the_value_that_takes_most_of_its_lines_and_the_others_keep_theirs():
    k = 3
    table = LabelValues.start(k, k, torch.device("cpu"))
    labels = torch.tensor([0] * 10 + [1] * 10 + [2] * 10)
    chosen = torch.tensor([1] * 7 + [2] * 3 + [2] * 10 + [0] * 10)  # label 0 split 7 / 3 over values 1 and 2
    for _ in range(50):
        table.update(labels, choices(chosen, k))
    assert table.values().tolist() == [1, 2, 0]


def test_fewer_labels_than_values_and_steps_without_labelled_lines():
    table = LabelValues.start(2, 4, torch.device("cpu"))
    labels = torch.tensor([0, 0, 1, 1, -1, -1])
    for _ in range(30):
        table.update(labels, choices(torch.tensor([3, 3, 1, 1, 0, 2]), 4))
    assert table.values().tolist() == [3, 1]
    before = table.joint.clone()
    table.update(torch.full((6,), -1), choices(torch.tensor([0, 1, 2, 3, 0, 1]), 4))  # no labelled line
    assert torch.equal(table.joint, before)


def test_the_table_survives_json_and_a_checkpoint_of_another_shape_is_refused():
    table = LabelValues.start(3, 3, torch.device("cpu"))
    table.update(torch.tensor([0, 1, 2]), choices(torch.tensor([1, 2, 0]), 3))
    again = LabelValues.start(3, 3, torch.device("cpu"), table.to_json())
    assert torch.equal(again.joint, table.joint)
    with pytest.raises(ValueError, match=r"label table is \(3, 3\), the run has 2 labels and k=3"):
        LabelValues.start(2, 3, torch.device("cpu"), table.to_json())


def test_a_value_no_labelled_line_chooses_leaves_the_pairing_finite():
    """A column decayed to 0 (a value no labelled line has chosen for thousands of steps, where denormals flush to
    zero) pairs the labels as before, not by a NaN's argmax."""
    joint = torch.tensor([[0.0, 0.0, 0.5], [0.5, 0.0, 0.0]])
    table = LabelValues.start(2, 3, torch.device("cpu"), joint.tolist())
    assert table.values().tolist() == [2, 0]
    assert torch.isfinite(one_to_one(torch.zeros(3, 3))).all()
