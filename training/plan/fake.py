"""The fake world ``tokweight plan`` (``training/plan/estimate.py``) runs a configuration in: fake tensors whose index tensors keep
their values, a fake process group of N ranks, and torch's memory tracker read by kind.

torch's trackers are used as they are but for three things they do not offer: a peak over the whole process only
(``global_peak``: theirs also keeps every module's, a pass over every module after every op), no gradient hook on a
frozen parameter (which refuses one), and AdamW's state counted from a step's start under FSDP's tracker too.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import replace
from functools import partial

KINDS = {"parameters": ("Parameter", "Buffer", "Sharded Param"),
         "gradients": ("Gradient", "Sharded Grad"),
         "optimizer": ("Optstate", "OptState"),
         "activations": ("Activation", "Inputs", "Other")}
"""The tracker's categories by the kind a plan reports; every other one (temporaries of the backward, FSDP's
unsharded parameters and gradients, all-gather and reduce-scatter buffers) is a temporary."""


def by_kind(snapshot: dict) -> tuple[int, dict[str, int]]:
    """A tracker's peak snapshot ({device: {category: bytes}}) -> (peak, {kind: bytes})."""
    (dev_snap,) = snapshot.values() if snapshot else ({"Total": 0},)
    kinds = dict.fromkeys([*KINDS, "temporaries"], 0)
    for category, size in dev_snap.items():
        name = getattr(category, "value", category)
        if name == "Total":
            continue
        kinds[next((k for k, names in KINDS.items() if name in names), "temporaries")] += size
    return dev_snap.get("Total", 0), kinds


def reset_peak(tracker) -> None:
    """Start the tracker's peak again from what is live now (as its ``__enter__`` does), and its per-module records
    (it refuses a root module called again without)."""
    tracker.reset_mod_stats()
    tracker._peak_mem_snap = tracker.get_tracker_snapshot("current")
    tracker._peak_mem = {dev: snap["Total"] for dev, snap in tracker._peak_mem_snap.items()}


class NoHook:
    """A hook handle with nothing to remove."""

    def remove(self) -> None:
        pass


def global_peak(tracker, peak_state) -> None:
    """The tracker's peak over the whole process, updated after each op; torch's own also updates every module's
    peak, a pass over every module after every op: a cost that grows with the modules times the ops."""
    for dev, snap in tracker._curr_mem_snap.items():
        if tracker._peak_mem.get(dev, 0) < snap["Total"]:
            tracker._peak_mem[dev] = snap["Total"]
            tracker._peak_mem_snap[dev] = dict(snap)


def tracker_for(built, sharded: bool):
    """torch's memory tracker of the model and its optimizer: FSDP's under FSDP, with its global peak only
    (``global_peak``). MemTracker puts a gradient hook on every parameter it meets, which a frozen one refuses:
    frozen parameters are given none (their memory is counted all the same)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = FSDPMemTracker(built.model, built.opt) if sharded else MemTracker()
    tracker._update_peak_stats = partial(global_peak, tracker)
    for p in built.model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (NoHook(), NoHook())
    if not sharded:
        tracker.track_external(built.model, built.opt)
    return tracker


def track_optimizer(tracker, opt) -> None:
    """Count AdamW's state from the start (FSDP's tracker counts it only once a step has run under it)."""
    tracker._track_optimizer_states(tracker._ref_class.OPT, opt)


@contextlib.contextmanager
def fake_world(ranks: int, sharded: bool):
    """A fake process group of ``ranks`` (this process is rank 0) and its 1-D CPU mesh when ``sharded``; else None."""
    if not sharded:
        yield None
        return
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ValueError("tokweight plan --shard fsdp makes its own fake process group: run it outside torchrun")
    dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (ranks,))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def quiet():
    """FSDP warns of every module output that is a view (``engine.fully_shard_cvae`` says why that is safe), and the
    module tracker of the backbone's calls outside the CVAE's forward (the decode's): both left out."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")
        warnings.filterwarnings("ignore", message=r"The module hierarchy tracking maybe be messed up")
        yield


@contextlib.contextmanager
def fake_mode():
    """FakeTensorMode in which a batch's index tensors keep their values through the ops that read only them."""
    from torch._subclasses import fake_tensor

    limit = fake_tensor.CONSTANT_NUMEL_LIMIT
    fake_tensor.CONSTANT_NUMEL_LIMIT = 1 << 62  # only tensors made from constants alone stay constants
    try:
        with fake_tensor.FakeTensorMode(allow_non_fake_inputs=True) as mode:
            yield mode
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = limit


def as_constants(mode, batch):
    """The batch's tensors as fakes holding their values."""
    convert = lambda t: None if t is None else mode.fake_tensor_converter.from_real_tensor(mode, t, make_constant=True)
    zf, zc = (replace(b, input_ids=convert(b.input_ids), logit_pos=convert(b.logit_pos), targets=convert(b.targets),
                      mask=convert(b.mask)) for b in (batch.zfree, batch.zcond))
    return replace(batch, zfree=zf, zcond=zc, z_pos=convert(batch.z_pos), slot_pos=convert(batch.slot_pos),
                   last_pos=convert(batch.last_pos), b=convert(batch.b), t0=convert(batch.t0))
