"""`tokweight plan` (``training/plan/estimate.py``): the peak a training step reaches on fake tensors is the peak
the same step reaches on real ones, within 15%, for four small configurations (the built-in GPT, a Llama from its
config.json, a LoRA one in bfloat16 with its frozen weights held in bfloat16, a LoRA one with gradient
checkpointing); measured by torch's MemTracker over the real CPU step, the same accounting the plan reads, so what
is checked is that the fake run is the run. FLOP counting and FSDP's first clip leave the peak as a run's. The
CLI's --json, the largest batch's search, the one-line error of a bad config, and train's one line when CUDA runs
out of memory.
"""

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.data.errors import Skips
from tokweight.training.objective.global_batch import GlobalBatch
from tokweight.training.loop.state import Progress
from tokweight.training.config.plan import PlanConfig
from tokweight.training.plan.estimate import largest_batch, plan_command, run_phases, train_peak
from tokweight.training.plan.build import cvae_of, model_spec

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_LLAMA = {"model_type": "llama", "vocab_size": 48, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def llama_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


@pytest.mark.parametrize("name,fields", [
    ("gpt", dict(model="gpt-tiny", dtype="float32")),
    ("llama", dict(model="llama", dtype="float32")),
    ("llama-lora-bf16", dict(model="llama", lora_rank=4, dtype="bfloat16")),
    ("llama-lora-checkpointing", dict(model="llama", lora_rank=4, dtype="float32", grad_checkpointing=True)),
])
def test_the_fake_step_peaks_within_15_percent_of_the_real_one(name, fields, llama_config):
    pytest.importorskip("transformers")
    if "lora_rank" in fields:
        pytest.importorskip("peft")
    cfg = PlanConfig(**(fields | {"model": llama_config if fields["model"] == "llama" else fields["model"]}),
                     batch_size=2, seq_len=16)
    spec = model_spec(cfg.model)
    fake = run_phases(cfg, spec, cfg.batch_size, None, fake=True, every=False)[1]["train"]
    built, phases = run_phases(cfg, spec, cfg.batch_size, None, fake=False, every=False)
    real = phases["train"]
    assert real.peak > 0 and abs(fake.peak - real.peak) <= 0.15 * real.peak, (fake, real)
    # tied and frozen weights as the real model holds them (fake buffers shared in the real one are counted apart)
    assert abs(fake.kinds["parameters"] - real.kinds["parameters"]) <= 64
    trained = [p for p in built.model.parameters() if p.requires_grad]
    moments = 2 * sum(4 * p.numel() for p in trained)  # AdamW's two float32 moments, and a step count per parameter
    assert moments < fake.kinds["optimizer"] <= moments + 4 * len(trained)
    assert sum(fake.kinds.values()) == fake.peak
    if fields["dtype"] == "bfloat16":  # a LoRA run's frozen matrices are held in bfloat16, the trained ones in float32
        dtypes = {p.dtype for p in built.model.parameters() if not p.requires_grad and p.dim() == 2}
        assert dtypes == {torch.bfloat16}


def test_counting_the_flops_leaves_the_checkpointed_step_s_peak_as_it_is(llama_config):
    """FlopCounterMode's module tracker holds every layer's output for the backward; a step counted under it
    peaks as if nothing were checkpointed. The plan counts the step's FLOPs in a step of its own."""
    pytest.importorskip("transformers")
    cfg = PlanConfig(model=llama_config, dtype="float32", batch_size=4, seq_len=48, grad_checkpointing=True,
                     eval_batch_size=2)
    spec = model_spec(cfg.model)
    plain = run_phases(cfg, spec, cfg.batch_size, None, fake=False, every=False)[1]["train"]
    counted = run_phases(cfg, spec, cfg.batch_size, None, fake=False, every=True)[1]["train"]
    assert counted.peak == plain.peak and counted.flops > 0 and plain.flops == 0
    whole = run_phases(replace(cfg, grad_checkpointing=False), spec, cfg.batch_size, None, fake=False,
                       every=False)[1]["train"]
    assert plain.kinds["activations"] < 0.8 * whole.kinds["activations"]  # checkpointing frees what it should


def test_the_json_plan_has_every_phase_by_kind_and_the_flops():
    result = CliRunner().invoke(main, ["plan", "--model", "gpt-tiny", "--batch-size", "2", "--seq-len", "16",
                                       "--no-search", "--json", "--eval-batch-size", "2"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    for phase in ("train", "validation", "decode"):
        assert set(plan[phase]["kinds"]) == {"parameters", "gradients", "optimizer", "activations", "temporaries"}
        assert sum(plan[phase]["kinds"].values()) == plan[phase]["peak"] > 0
        assert plan[phase]["flops"] > 0
    assert plan["train"]["flops"] > 2 * plan["validation"]["flops"]  # a backward costs about two forwards
    assert 0 < plan["train"]["kinds"]["optimizer"] - 8 * plan["trainable"] < 1024  # AdamW's moments and step counts
    assert plan["fits"] and plan["largest_batch"] is None and plan["config"]["batch_size"] == 2


def test_the_plan_runs_the_passes_as_a_gpu_run_would():
    """``merge_passes`` reaches the planned model as train resolves it on CUDA: on by default, off with gradient
    checkpointing or where the run turns it off; a plan command names a setting the run made."""
    spec = model_spec("gpt-tiny")
    for fields, merged in (({}, True), ({"grad_checkpointing": True}, False), ({"merge_passes": False}, False)):
        model, _ = cvae_of(spec, PlanConfig(model="gpt-tiny", seq_len=16, **fields).train_config())
        assert model.merge_passes is merged and model.merges_passes is merged, fields
    assert plan_command(PlanConfig(model="m", merge_passes=False)).endswith(" --set merge_passes=false")
    assert "merge_passes" not in plan_command(PlanConfig(model="m"))


def test_the_largest_batch_fits_and_a_few_more_examples_do_not():
    """The search, over real CPU steps (the fake ones peak alike, above; these are quicker)."""
    cfg = PlanConfig(model="gpt-tiny", batch_size=2, seq_len=16)
    spec = model_spec(cfg.model)
    first = run_phases(cfg, spec, 2, None, fake=False, every=False)[1]["train"]
    p4 = train_peak(cfg, spec, None, 4, fake=False)
    budget = first.peak + 3.5 * (p4 - first.peak) / 2  # room for about 5.5 examples
    searched = []
    found = largest_batch(cfg, spec, None, budget, (2, first), searched, fake=False)
    peaks = dict(searched)
    assert 3 <= found <= 5 and peaks[found] <= budget
    assert train_peak(cfg, spec, None, found + 3, fake=False) > budget


def test_a_bad_model_config_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["plan", "--model", str(tmp_path / "nope.json")])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "nope.json: no such model config" in result.output
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    result = CliRunner().invoke(main, ["plan", "--model", str(tmp_path)])
    assert result.exit_code == 1 and "neither a Hugging Face config" in result.output


def test_train_says_in_one_line_which_batch_fits_when_cuda_runs_out_of_memory(tmp_path, monkeypatch):
    """A run's checkpoint directory (the built-in GPT's config.json) is planned when the step raises CUDA's
    out-of-memory error, simulated here: the error is one line naming the batch that fits."""
    from tokweight.training.plan import estimate as plan_module
    from tokweight.training.loop import train
    from tokweight.training.config.train import IOConfig, OptimConfig, TrainConfig

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model": model_spec("gpt-tiny")}))
    cfg = TrainConfig(IOConfig(checkpoint=str(ckpt), data="d", out="o", store="s"),
                      optim=OptimConfig(batch_size=64))
    planned = []
    monkeypatch.setattr(plan_module, "device_memory", lambda device: 40.0)  # GiB
    monkeypatch.setattr(plan_module, "plan", lambda cfg: planned.append(cfg) or SimpleNamespace(
        config=cfg, largest_batch=5, largest_eval_batch=None))
    error = plan_module.out_of_memory(cfg, 1, 16, torch.device("cpu"))
    assert isinstance(error, RuntimeError) and "\n" not in str(error)
    assert str(error) == ("out of device memory at --batch-size 64 per rank (16-token sequences); the largest batch "
                          "that fits 40 GiB per rank (less 10% headroom) is --batch-size 5")
    (asked,) = planned  # the run's configuration, on the device's memory
    assert (asked.model, asked.batch_size, asked.seq_len, asked.memory_gib, asked.cvae, asked.eval_batch_size) == \
        (str(ckpt), 64, 16, 40.0, cfg.cvae, 128)
    assert model_spec(asked.model)["d_model"] == 32  # the run's checkpoint directory is plannable

    def refused(cfg):
        raise ValueError("tokweight plan --shard fsdp makes its own fake process group: run it outside torchrun")

    monkeypatch.setattr(plan_module, "plan", refused)
    line = str(plan_module.out_of_memory(cfg, 1, 16, torch.device("cpu")))
    assert "\n" not in line and line.endswith(f"run tokweight plan --model {ckpt} --k 4 --batch-size 64 --seq-len 16 "
                                              "--dtype float32 --lora-rank 0 --shard ddp --ranks 1 --memory 40 "
                                              "--eval-batch-size 128")

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(train, "train_step", oom)
    monkeypatch.setattr(train, "TrainStream", OneBatchStream)
    monkeypatch.setattr(plan_module, "out_of_memory", lambda *args: RuntimeError(f"planned {args[1:3]}"))
    state = State(progress=Progress(), global_batch=GlobalBatch(0, 1), device=torch.device("cpu"), spec=None)
    with pytest.raises(RuntimeError, match=r"planned \(1, 16\)"):  # one rank, the batch's 16 tokens
        train.fit(state, replace(cfg, io=replace(cfg.io, out=str(tmp_path / "run"))))


def test_a_validation_that_does_not_fit_where_training_does_is_named_with_the_evaluation_batch_that_fits():
    """8B LoRA with checkpointing trains 42 examples at 512 tokens in 80 GiB but validates 128 in 89 GiB: the plan's
    line (and train's, when CUDA runs out of memory) names the validation, not the training batch. Here on the
    built-in GPT, with a memory between the two."""
    from tokweight.training.plan.estimate import GIB, fits_line, plan

    base = PlanConfig(model="gpt-tiny", dtype="float32", batch_size=2, seq_len=16, eval_batch_size=64)
    first = plan(base, search=False)
    budget = (first.train.peak + first.validation.peak) / 2  # training fits, validation does not
    cfg = replace(base, memory_gib=budget / 0.9 / GIB)
    found = plan(cfg)
    assert found.largest_batch >= 2 and 0 < found.largest_eval_batch < 64
    line = fits_line(found)
    assert "\n" not in line and line.endswith(f"about {found.largest_eval_batch} examples fit (train --set "
                                              f"log.eval_batch_size={found.largest_eval_batch})")
    assert "a validation forward at log.eval_batch_size 64 needs" in line
    from tokweight.commands.plan import table
    assert "; its validation does not" in table(found)
    fits = plan(replace(cfg, eval_batch_size=found.largest_eval_batch), search=False)
    assert fits.validation.peak <= budget
    more = plan(replace(cfg, eval_batch_size=found.largest_eval_batch + 4), search=False)
    assert more.validation.peak > budget  # near the largest: a few more do not fit
    assert plan(replace(cfg, eval_batch_size=8)).largest_eval_batch is None  # a validation that fits says nothing


class State(SimpleNamespace):
    """What ``train.fit`` reads of a run's state before its step."""


class OneBatchStream:
    """A training stream of one batch of 16-token sequences (fit reads their length when the step fails)."""

    skips, bytes_read = Skips(), 0

    def __init__(self, *args):
        pass

    def batches(self, workers, start):
        batch = SimpleNamespace(zfree=SimpleNamespace(input_ids=torch.zeros(2, 16, dtype=torch.long)))
        batch.to = lambda device: batch
        yield batch


def test_fsdp_over_four_fake_ranks_holds_a_quarter_of_the_model_and_its_optimizer_state():
    """FSDP2 over a fake process group of 4 ranks: each rank's parameters and AdamW's state are a quarter of one
    process's (FSDP pads each tensor's dim 0 to a multiple of the ranks)."""
    plans = {}
    for ranks in (1, 4):
        result = CliRunner().invoke(main, ["plan", "--model", "gpt-tiny", "--batch-size", "2", "--seq-len", "16",
                                           "--shard", "fsdp", "--ranks", str(ranks), "--dtype", "float32",
                                           "--eval-batch-size", "2", "--no-search", "--json"])
        assert result.exit_code == 0, result.output
        plans[ranks] = json.loads(result.output)
    one, four = plans[1]["train"]["kinds"], plans[4]["train"]["kinds"]
    assert plans[4]["parameters"] == plans[1]["parameters"]  # the whole model's count, not a shard's
    for kind in ("parameters", "optimizer"):
        assert one[kind] / 4 <= four[kind] <= one[kind] / 4 * 1.1, kind


def test_after_the_plan_makes_adamw_s_state_a_clip_of_sharded_fake_gradients_allocates_nothing():
    """A first clip of sharded gradients on fakes allocates the whole gradients (DTensor infers its shapes on
    tensors of their size), which a run's never does: the plan clips once before it measures, as it makes AdamW's
    state, and a step's clip then counts what a run's would."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from tokweight.training.plan.build import build
    from tokweight.training.plan.estimate import optimizer_state
    from tokweight.training.plan.fake import fake_mode, fake_world

    cfg = PlanConfig(model="gpt-tiny", dtype="float32", shard="fsdp", ranks=4)
    with fake_world(4, True) as mesh, fake_mode():
        built = build(model_spec(cfg.model), cfg.train_config(), mesh, fake=True)
        optimizer_state(built)
        params = [p for p in built.model.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.ones_like(p)
        tracker = MemTracker()
        tracker.track_external(built.model)
        with tracker:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        (peak,) = tracker.get_tracker_snapshot("peak").values()
    shards = sum(p.to_local().numel() * p.element_size() for p in params)
    assert peak["Total"] <= 2 * shards + 4096  # the parameters and their gradients, a rank's shards, and a few norms
