"""A stand-in, on a CPU-only machine, for CUDA's rule that the tensors of one operation share a device.

On a GPU, a tensor that tokweight makes on the host (a factory called without ``device=``, or with the
string ``"cpu"``; ``.cpu()``) and then combines with the model's tensors raises "Expected all tensors to be
on the same device". On a CPU-only machine both are CPU tensors, so the bug is invisible: ``train`` crashed on
the first GPU it met because ``spread_latent_embeddings`` concatenated a CPU draw with the embedding's mean.

``HostTensors`` (a ``TorchFunctionMode``) makes the two sides visible. It tags as *host* every tensor that a
factory makes when its nearest non-torch caller is tokweight code and no device object was given (none, or the
literal ``"cpu"``), and every ``.cpu()`` / ``.to("cpu")``; it propagates the tag through operations whose
tensor inputs are all host; ``.to(<torch.device>)`` (what ``.to(x.device)`` or ``.to(device)`` passes) and
``.cuda()`` move a tensor to "the device" and clear it. An operation that meets a host tensor and a
device tensor, both with at least one dimension (CUDA accepts 0-d CPU scalars), raises ``HostTensorMet``
naming the operation and the tokweight line that ran it. ``copy_`` is exempt: it copies across devices.

Tensors made by torch's own modules (``nn.Linear``'s weights) or by another library are device tensors:
modules are built on the host and moved whole, and other libraries are not policed here. Tensors made in a
DataLoader worker process are not seen: run the guarded entry points with ``num_workers=0``.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

TAG = "_tokweight_host"
TORCH_DIR = os.path.dirname(torch.__file__)
FACTORIES = {torch.tensor, torch.as_tensor, torch.from_numpy, torch.zeros, torch.ones, torch.empty, torch.full,
             torch.arange, torch.eye, torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace,
             torch.logspace, torch.normal, torch.asarray, torch.scalar_tensor}
CROSS_DEVICE = {torch.Tensor.copy_}  # legal across devices


class HostTensorMet(RuntimeError):
    """A host tensor and a device tensor met in one operation: on a GPU, a crash."""


def is_host(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, TAG, False)


def _tag(out, host: bool):
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor):
            try:
                setattr(t, TAG, host)
            except (AttributeError, RuntimeError):  # a tensor type without a __dict__
                pass
    return out


def _caller():
    """(module name, "file:line") of the nearest frame outside torch and this file."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(TORCH_DIR) and path != __file__:
            return frame.f_globals.get("__name__", ""), f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return "", "?"


def _host_device(device) -> bool:
    """Whether a factory's or ``.to``'s device argument means the host: none, or a string naming the CPU. A
    ``torch.device`` object is taken to be the model's device (``x.device``, a resolved ``--device``)."""
    return device is None or (isinstance(device, str) and device.startswith("cpu"))


def _to_device(args, kwargs):
    """The device ``Tensor.to(...)`` is given, or ``False`` if none (a dtype only)."""
    if "device" in kwargs:
        return kwargs["device"]
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            return a
        if isinstance(a, torch.Tensor):
            return a.device if not is_host(a) else "cpu"
    return False


class HostTensors(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            out = func(*args, **kwargs)
            module, _ = _caller()
            if module.startswith("tokweight") and _host_device(kwargs.get("device")):
                _tag(out, True)
            return out
        if func in (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda):
            device = "cpu" if func is torch.Tensor.cpu else None if func is torch.Tensor.cuda else _to_device(args, kwargs)
            out = func(*args, **kwargs)
            if device is False:  # a dtype change keeps the tensor where it was
                return _tag(out, is_host(args[0]))
            return _tag(out, isinstance(device, str) and device.startswith("cpu"))
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim() > 0]
        host = [t for t in tensors if is_host(t)]
        if host and len(host) < len(tensors) and func not in CROSS_DEVICE:
            _, where = _caller()
            name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
            raise HostTensorMet(f"{where}: {name} combines a host tensor {tuple(host[0].shape)} with device tensors: "
                                "make it on the device of the tensors it meets (device=x.device) or move it (.to(x.device))")
        out = func(*args, **kwargs)
        if host and len(host) == len(tensors):
            _tag(out, True)
        return out
