import torch

from tokweight.training.evaluation.metrics import informative_token_spread


def test_spread_over_copies_at_the_most_surprising_unmasked_token():
    nll = torch.tensor([[[0.1, 2.0, 5.0], [0.3, 0.5, 0.0]],  # (B=2, K=2, T=3)
                        [[1.0, 0.0, 0.0], [4.0, 0.0, 0.0]]])
    b = torch.tensor([[0.0, 0.9, 7.0],  # position 2 is masked: t* = 1, spread |2.0 - 0.5|
                      [1.2, 0.1, 0.0]])  # t* = 0, spread |1.0 - 4.0|
    mask = torch.tensor([[True, True, False], [True, True, True]])
    torch.testing.assert_close(informative_token_spread(nll, b, mask), torch.tensor([1.5, 3.0]))
