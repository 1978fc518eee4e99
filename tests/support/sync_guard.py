"""A stand-in, on a CPU-only machine, for a GPU profiler's count of host syncs in a training step.

On a GPU the host queues kernels and runs ahead of the device, until it asks for something only the device
knows: a value (``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, ``float(t)``, ``.cpu()``, ``.numpy()``) or
the size of an output that depends on the data (``nonzero``, ``masked_select``, boolean-mask indexing,
``unique``, ``repeat_interleave`` of tensor repeats without ``output_size``). Then it waits for every kernel
queued before, and the device idles while the next ones are queued. SPEC §6: a step that does not log makes
no host sync. On a CPU nothing waits, so nothing shows it.

``HostSyncs`` records each such call. Two modes, entered together:

- a ``TorchFunctionMode`` sees the Python calls that read a tensor's data without dispatching an operator
  (``.tolist()``, ``.numpy()``, ``.cpu()``, ``.to("cpu")``, which on a CPU tensor return it as is; a
  ``torch.device`` object given to ``.to`` is taken to be the model's device, as ``tests/support/device_guard.py`` takes it);
- a ``TorchDispatchMode`` sees the operators that sync wherever they are called from, Python or C++ (a
  composite's internals, an autograd backward): ``_local_scalar_dense`` (what ``.item()``, ``bool``, ``int``
  and ``float`` dispatch), ``nonzero``, ``masked_select`` (``masked_scatter``'s backward), ``unique*``,
  ``repeat_interleave`` of tensor repeats without ``output_size``, and ``index`` / ``index_put`` with a boolean
  index.

Each record names the operation and the nearest line outside torch and this file that led to it. The one
exemption: a call made by torch's optimizers themselves (``torch/optim``), which keep their step counters on
the host unless they are fused or capturable (reading those waits for nothing). A CPU tensor is a device tensor
here: the guard cannot tell a host tensor from a device one on a CPU-only machine, so what a step needs on the
host it computes on the host when its batch is built, never from a tensor.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

TORCH_DIR = os.path.dirname(torch.__file__)
OPTIM_DIR = os.path.join(TORCH_DIR, "optim")
aten = torch.ops.aten

READS = {torch.Tensor.tolist: "tolist", torch.Tensor.numpy: "numpy", torch.Tensor.cpu: "cpu"}
SYNCING_OPS = {aten._local_scalar_dense.default: "item / bool / int / float", aten.nonzero.default: "nonzero",
               aten.masked_select.default: "masked_select",
               aten.masked_scatter_backward.default: "masked_scatter's backward (masked_select)",
               aten.unique_dim.default: "unique", aten._unique2.default: "unique", aten._unique.default: "unique",
               aten.unique_consecutive.default: "unique_consecutive"}


class HostSyncFound(AssertionError):
    """A step that should run without host syncs made some; the message lists them."""


@dataclass(frozen=True)
class Sync:
    what: str
    where: str  # "file:line" of the nearest frame outside torch and this file

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def _caller() -> str:
    """"path:line" of the nearest frame outside torch and this file."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(TORCH_DIR) and path != __file__:
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


MACHINERY = tuple(os.path.join(TORCH_DIR, name) for name in ("_dynamo", "_compile.py", "overrides.py", "utils/_"))
"""torch's own frames between an operator call and a mode (its dispatch and compile wrappers)."""


def _by_optimizer() -> bool:
    """Whether torch's optimizer code made the call: the nearest frame outside this file and torch's machinery
    is in torch/optim."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename == __file__ or frame.f_code.co_filename.startswith(MACHINERY)):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(OPTIM_DIR)


def _syncing_op(func, args, kwargs) -> str | None:
    """The name of a dispatched operator that syncs on these arguments, or None."""
    if func in SYNCING_OPS:
        return SYNCING_OPS[func]
    packet = getattr(func, "overloadpacket", None)
    if packet is aten.repeat_interleave and isinstance(args[0] if args else None, torch.Tensor):
        repeats = args[0] if func is aten.repeat_interleave.Tensor else (args[1] if len(args) > 1 else None)
        if isinstance(repeats, torch.Tensor) and repeats.numel() > 1 and kwargs.get("output_size") is None:
            return "repeat_interleave without output_size"
    if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        indices = args[1] if len(args) > 1 else ()
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
            return f"{packet.__name__} with a boolean mask"
    return None


class _Reads(TorchFunctionMode):
    def __init__(self, found: list[Sync]):
        super().__init__()
        self.found = found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = READS.get(func)
        if what is None and func is torch.Tensor.to and _to_host(args, kwargs):
            what = "to('cpu')"
        if what is not None and not _by_optimizer():
            self.found.append(Sync(what, _caller()))
        return func(*args, **kwargs)


def _to_host(args, kwargs) -> bool:
    """Whether ``Tensor.to(...)`` names the host: the string "cpu". A ``torch.device`` object is taken to be
    the model's device (what ``.to(x.device)`` passes), as ``tests/support/device_guard.py`` takes it."""
    device = kwargs.get("device")
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            device = a
    return isinstance(device, str) and device.startswith("cpu")


class _Ops(TorchDispatchMode):
    def __init__(self, found: list[Sync]):
        super().__init__()
        self.found = found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = _syncing_op(func, args, kwargs)
        if what is not None and not _by_optimizer():
            self.found.append(Sync(what, _caller()))
        return func(*args, **kwargs)


class HostSyncs:
    """``with HostSyncs() as syncs:`` records in ``syncs.found`` every host sync made inside."""

    def __init__(self):
        self.found: list[Sync] = []
        self._modes = (_Reads(self.found), _Ops(self.found))

    def __enter__(self) -> HostSyncs:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


def without_syncs(train_step):
    """``train_step`` wrapped: a step that does not log runs under ``HostSyncs`` and raises HostSyncFound
    listing what synced; a logged step (its metrics record reads values back) runs as is. ``counts`` holds the
    number of guarded steps and of syncs found."""

    def guarded(state, batch, cfg, logged: bool):
        if logged:
            return train_step(state, batch, cfg, logged)
        with HostSyncs() as syncs:
            out = train_step(state, batch, cfg, logged)
        guarded.counts["steps"] += 1
        guarded.counts["syncs"] += len(syncs.found)
        if syncs.found:
            lines = sorted({str(s) for s in syncs.found})
            raise HostSyncFound(f"{len(syncs.found)} host syncs in a step that does not log:\n" + "\n".join(lines))
        return out

    guarded.counts = {"steps": 0, "syncs": 0}
    return guarded
