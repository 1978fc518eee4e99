"""The training step's optimizer (``step.build_optimizer``): AdamW, fused where every trained parameter is on CUDA."""

from types import SimpleNamespace

import torch

from tokweight.training.loop.step import build_optimizer, fuses


def on(*devices):
    return [SimpleNamespace(device=torch.device(d)) for d in devices]


def test_adamw_is_fused_when_every_parameter_is_on_cuda_only():
    assert fuses(on("cuda:0", "cuda:0")) and fuses(on("cuda"))
    assert not fuses(on("cpu")) and not fuses(on("cuda:0", "cpu")) and not fuses(on("meta")) and not fuses([])


def test_on_the_cpu_the_optimizer_is_torchs_default_adamw():
    params = [torch.nn.Parameter(torch.ones(3))]
    opt = build_optimizer(params, 1e-3)
    assert isinstance(opt, torch.optim.AdamW) and not opt.defaults["fused"]
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["weight_decay"] == 0.0 and opt.defaults["lr"] == 1e-3
