"""The sync guard (``tests/support/sync_guard.py``): a step that does not log makes no host sync (SPEC §6), which a
CPU-only suite cannot see by itself. First that the guard sees each kind of sync (and not what does not sync);
then ``train``'s steps under it: the default recipe, each z pathway, a continuous latent, the frozen and dynamic
policies, example-inverse's batch normalisation, labelled examples' weights, a Hugging Face Llama whole and with
LoRA."""

from __future__ import annotations

import pytest
import torch

from tests.support.sync_guard import HostSyncFound, HostSyncs, without_syncs
from tokweight.training.loop import train as train_module
from tokweight.training.config.components import CVAEConfig, EStepConfig
from tokweight.training.loop.step import train_step
from tokweight.training.loop.train import run as train
from tokweight.training.config.train import IOConfig, LoRAConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

X = torch.randn(4, 3, requires_grad=True)
MASK = X.detach() > 0
SYNCS = {
    "item": lambda: X.detach().sum().item(), "bool": lambda: bool(X.detach().sum() > 0), "int": lambda: int(X.detach().argmax()),
    "float": lambda: float(X.detach().sum()), "tolist": lambda: X.tolist(), "cpu": lambda: X.cpu(),
    "numpy": lambda: X.detach().numpy(), "to cpu": lambda: X.to("cpu"), "nonzero": lambda: MASK.nonzero(),
    "where of one argument": lambda: torch.where(MASK), "masked_select": lambda: X.masked_select(MASK),
    "boolean index": lambda: X[MASK], "boolean index_put": lambda: X.detach().clone().__setitem__(MASK, 0.0),
    "unique": lambda: torch.unique(MASK),
    "repeat_interleave of tensor repeats": lambda: torch.arange(4).repeat_interleave(torch.tensor([1, 2, 0, 1])),
    "masked_scatter's backward": lambda: torch.zeros(4, 3).masked_scatter(MASK, X.flatten()).sum().backward(),
}
NO_SYNCS = {
    "arithmetic": lambda: (X * 2).sum(), "a long index": lambda: X[torch.tensor([0, 2])],
    "repeat_interleave of an int": lambda: X.repeat_interleave(3, 0),
    "repeat_interleave with output_size": lambda: torch.arange(4).repeat_interleave(torch.tensor([1, 2, 0, 1]),
                                                                                     output_size=4),
    "index_put of long indices, backward": lambda: torch.zeros(12).index_put((torch.tensor([1, 5]),),
                                                                             X.flatten()[:2]).sum().backward(),
    "AdamW's step (its host step counter)": lambda: adamw_step(),
}


def adamw_step():
    p = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.AdamW([p])
    p.grad = torch.randn(3)
    opt.step()


@pytest.mark.parametrize("name", SYNCS)
def test_the_guard_sees_each_kind_of_sync(name):
    with HostSyncs() as syncs:
        SYNCS[name]()
    assert syncs.found and all("tests/training/loop/test_sync_guard.py" in s.where for s in syncs.found), syncs.found


@pytest.mark.parametrize("name", NO_SYNCS)
def test_the_guard_passes_what_does_not_sync(name):
    with HostSyncs() as syncs:
        NO_SYNCS[name]()
    assert not syncs.found, syncs.found


def test_a_guarded_step_that_syncs_fails_and_a_logged_step_is_not_guarded():
    def step(state, batch, cfg, logged):
        return X.detach().sum().item()

    guarded = without_syncs(step)
    assert guarded(None, None, None, logged=True) == pytest.approx(X.detach().sum().item())
    with pytest.raises(HostSyncFound, match=r"test_sync_guard.py:\d+: item"):
        guarded(None, None, None, logged=False)


def guarded_run(monkeypatch, cfg: TrainConfig, groups: list | None = None) -> dict:
    """``train(cfg)`` with every step that does not log under the guard; the guard's counts. ``groups``: each
    step's number of length groups appended to it."""
    def step(state, batch, cfg, logged):
        if groups is not None:
            groups.append(1 if batch.groups is None else len(batch.groups.parts))
        return train_step(state, batch, cfg, logged)

    guarded = without_syncs(step)
    monkeypatch.setattr(train_module, "train_step", guarded)
    train(cfg)
    return guarded.counts


def config(data, ckpt, out, store=None, steps=3, length_groups=None, merge_passes=None, **groups) -> TrainConfig:
    """``steps`` steps, only the last one logged: the others run guarded."""
    base = dict(io=IOConfig(checkpoint=str(ckpt), data=str(data), out=str(out), store=store and str(store),
                            num_workers=0, device="cpu", length_groups=length_groups, merge_passes=merge_passes),
                loss=LossConfig(policy="precomputed" if store else "frozen"),
                optim=OptimConfig(steps=steps, batch_size=8, starts=1),
                log=LogConfig(log_every=100, grad_diag_every=0, eval_every=0, eval_examples=16))
    return TrainConfig(**{**base, **groups})


@pytest.mark.parametrize("groups", [
    {}, {"cvae": CVAEConfig(cond="prefix")}, {"cvae": CVAEConfig(cond="token", slots=1)},
    {"cvae": CVAEConfig(cond="memory", slots=1)}, {"cvae": CVAEConfig(cond="layernorm", slots=1)},
    {"cvae": CVAEConfig(latent="continuous", z_dim=2)}, {"loss": LossConfig(policy="frozen")},
    {"loss": LossConfig(policy="dynamic")}, {"loss": LossConfig(weighting="example-inverse")},
    {"estep": EStepConfig(labelled=0.2)},
    {"estep": EStepConfig(cluster_weight=1.0, cluster_relative=False, cluster_map="identity")},
    {"estep": EStepConfig(cluster_weight=0.0)}, {"length_groups": 3},
    {"length_groups": 3, "cvae": CVAEConfig(latent="continuous", z_dim=2)}, {"merge_passes": True},
    {"merge_passes": True, "length_groups": 3, "cvae": CVAEConfig(cond="prefix")}],
    ids=["default", "prefix", "token", "memory", "layernorm", "continuous", "frozen", "dynamic", "example-inverse",
         "labelled", "clusters-nats", "clusters-off", "length-groups", "length-groups-continuous", "merged",
         "merged-groups-prefix"])
def test_a_step_that_does_not_log_makes_no_host_sync(tiny, tiny_store, tmp_path, monkeypatch, groups):
    data, ckpt = tiny
    parts = []
    counts = guarded_run(monkeypatch, config(data, ckpt, tmp_path / "run", tiny_store, **groups), parts)
    assert counts == {"steps": 2, "syncs": 0}
    assert min(parts) == max(parts) == (1 if "length_groups" not in groups else 3)  # the batches ran in groups


@pytest.mark.parametrize("lora", [0, 2], ids=["whole", "lora"])
def test_a_hugging_face_step_makes_no_host_sync(hf_checkpoints, tiny, tmp_path, monkeypatch, lora):
    if lora:
        pytest.importorskip("peft")
    data, _ = tiny
    cfg = config(data, hf_checkpoints["llama"], tmp_path / "run", lora=LoRAConfig(rank=lora))
    assert guarded_run(monkeypatch, cfg) == {"steps": 2, "syncs": 0}


def test_a_batch_carries_its_widths_and_s_tokens_as_host_ints():
    """What the step slices with, counted from the examples when the batch is built: the values the step read
    back from the device before."""
    from tokweight.pipeline.data.samples import Sample
    from tokweight.pipeline.tokens.vocab import Vocab
    from tokweight.training.loop.batches import collate_examples, encode

    vocab = Vocab(("a", "b", "c"), k_max=2)
    samples = [Sample("k0", ("a", "b", "c"), ("b",)), Sample("k1", ("c",), ("a", "b", "c", "a"))]
    batch = collate_examples(list(encode([("s.tar", s) for s in samples], vocab, 2, 64)))
    free_len, cond_len = batch.last_pos + 1, (batch.zcond.input_ids != 0).sum(1)
    assert batch.widths.prefix == int(batch.z_pos.max())
    assert batch.widths.free_suffix == int((free_len - batch.z_pos).max())
    assert batch.widths.cond_suffix == int((cond_len - batch.z_pos).max()) == int((free_len + 2 + 2 - batch.z_pos).max())
    assert batch.zfree.s_tokens == batch.zcond.s_tokens == int(batch.zfree.mask.sum()) == 2 + 5
    moved = batch.to("cpu")
    assert moved.widths == batch.widths and moved.zcond.s_tokens == batch.zcond.s_tokens

