"""Training and evaluation metrics; each is defined by its formula in its docstring.

Evaluation metrics are computed from sufficient statistics (sums and counts) that one
``all_reduce`` can combine across ranks; ``finalize`` turns them into numbers.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def posterior_gradient_norms(recon: torch.Tensor, beta_kl: torch.Tensor, params: list[torch.nn.Parameter]) -> dict:
    """The seed note's diagnostic on the posterior parameters xi:

    grad_recon = || d recon / d xi ||_2,   grad_kl = || d (beta * KL term) / d xi ||_2,
    ratio = grad_recon / grad_kl. Both graphs are kept for the backward pass that follows.
    """
    def norm(value):
        if not value.requires_grad:
            return 0.0
        grads = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
        return math.sqrt(sum(float(g.pow(2).sum()) for g in grads if g is not None))

    g_recon, g_kl = norm(recon), norm(beta_kl)
    return {"grad_recon": g_recon, "grad_kl": g_kl, "grad_ratio": g_recon / g_kl if g_kl > 0 else float("inf")}
