"""The device guard (``tests/support/device_guard.py``): a host tensor meeting the model's tensors fails here, on the
CPU, as it would crash on a GPU. First that the guard sees the bug class (the CUDA crash of
``spread_latent_embeddings``, as it was) and passes its fix; then every entry point's real path under it:
train (each latent, each z pathway, the E-step, three starts, LoRA and gradient checkpointing on a Hugging
Face backbone), eval, generate, encode and extract."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.device_guard import HostTensorMet, HostTensors
from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run as extract
from tokweight.training.config.components import CVAEConfig
from tokweight.training.config.use import EncodeConfig
from tokweight.training.decoding.encode import run as encode
from tokweight.training.config.use import EvalConfig
from tokweight.training.evaluation.evaluate import run_eval
from tokweight.training.config.use import GenerateConfig
from tokweight.training.decoding.generate import run as generate
from tokweight.training.loop.train import run as train
from tokweight.training.config.train import IOConfig, LoRAConfig, LossConfig, OptimConfig, TrainConfig

OLD_SPREAD = """
def spread(weight, ids, generator):  # spread_latent_embeddings before the fix
    ids = torch.tensor(ids)
    mean = weight[ids].double().mean(0)
    directions = torch.randn(weight.shape[1], len(ids), generator=generator, dtype=torch.float64)
    return torch.cat([mean[:, None], directions], 1)
"""

NEW_SPREAD = """
def spread(weight, ids, generator):
    ids = torch.tensor(ids, device=weight.device)
    mean = weight[ids].double().mean(0).cpu()
    directions = torch.randn(weight.shape[1], len(ids), generator=generator, dtype=torch.float64, device="cpu")
    return torch.cat([mean[:, None], directions], 1).to(weight.device)
"""


def tokweight_function(source: str):
    """``spread`` as if defined in a tokweight module (the guard tags what tokweight code makes)."""
    namespace = {"__name__": "tokweight.example", "torch": torch}
    exec(compile(source, "tokweight/example.py", "exec"), namespace)
    return namespace["spread"]


def test_the_guard_fails_the_old_crash_and_passes_its_fix():
    weight = torch.nn.Embedding(12, 8).weight
    with HostTensors(), pytest.raises(HostTensorMet, match=r"tokweight/example.py:4: .*__getitem__"):
        tokweight_function(OLD_SPREAD)(weight, [9, 10, 11], torch.Generator().manual_seed(0))
    with HostTensors():
        rows = tokweight_function(NEW_SPREAD)(weight, [9, 10, 11], torch.Generator().manual_seed(0))
        assert (rows[:, 1:] * 2).shape == (8, 3) and rows.device == weight.device
        rows + weight[:8, :4]  # moved: meets the weight
    # a host tensor that is moved is fine, one that is not fails; 0-d host scalars are fine (as on CUDA)
    meet = tokweight_function("def spread(weight, ids, generator):\n    return weight[:3] * torch.ones(3, 8)\n")
    with HostTensors(), pytest.raises(HostTensorMet, match="mul"):
        meet(weight, None, None)
    scalar = tokweight_function("def spread(weight, ids, generator):\n    return weight * torch.tensor(2.0)\n")
    with HostTensors():
        scalar(weight, None, None)


def train_config(data, ckpt, out, store=None, steps=3, **groups):
    policy = "precomputed" if store else "frozen"
    base = dict(io=IOConfig(checkpoint=str(ckpt), data=str(data), out=str(out), store=store and str(store),
                            num_workers=0, device="cpu"),
                loss=LossConfig(policy=policy), optim=OptimConfig(steps=steps, batch_size=8, starts=1))
    return TrainConfig(**{**base, **groups})


@pytest.mark.parametrize("cvae", [CVAEConfig(cond="prefix"), CVAEConfig(cond="token", slots=1), CVAEConfig(cond="memory", slots=1),
                                  CVAEConfig(cond="layernorm", slots=1), CVAEConfig(),
                                  CVAEConfig(latent="continuous", z_dim=2),
                                  CVAEConfig(latent="continuous", z_dim=2, cond="memory", slots=1)],
                         ids=["discrete-prefix", "token", "memory", "layernorm", "query (default)", "continuous",
                              "continuous-memory"])
def test_train_under_the_guard(tiny, tiny_store, tmp_path, cvae):
    data, ckpt = tiny
    with HostTensors():
        result = train(train_config(data, ckpt, tmp_path / "run", tiny_store, cvae=cvae))
    assert result["stop"]["step"] == 3


def test_three_starts_and_the_use_commands_under_the_guard(tiny, tiny_store, tmp_path):
    data, ckpt = tiny
    run = tmp_path / "run"
    cfg = train_config(data, ckpt, run, tiny_store, optim=OptimConfig(steps=4, batch_size=8, starts=2, start_steps=2))
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(json.dumps({"x": ["a", "b", "c"]}) + "\n")
    with HostTensors():
        assert train(cfg)["start"]["seed"] in (0, 1)
        run_eval(EvalConfig(run=str(run), data=str(data), split="test", decode_examples=4, device="cpu"))
        generate(GenerateConfig(run=str(run), input=str(inputs), out=str(tmp_path / "out.jsonl"), device="cpu"))
        generate(GenerateConfig(run=str(run), input=str(inputs), out=str(tmp_path / "sampled.jsonl"),
                                temperature=1.0, device="cpu"))
        encode(EncodeConfig(run=str(run), data=str(data), device="cpu"))
    assert len(json.loads((tmp_path / "out.jsonl").read_text())["outputs"]) == 4


def test_extract_under_the_guard(tiny, tmp_path):
    data, ckpt = tiny
    with HostTensors():
        summary = extract(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(tmp_path / "store"),
                                        progress=False, reader_process=False, device="cpu"))
    assert summary["parts"] > 0 and not summary["nothing_to_do"]


def test_a_hugging_face_backbone_with_lora_and_checkpointing_under_the_guard(hf_checkpoints, tiny, tmp_path):
    pytest.importorskip("peft")
    data, _ = tiny
    ckpt = hf_checkpoints["llama"]
    with HostTensors():
        train(train_config(data, ckpt, tmp_path / "lora", lora=LoRAConfig(rank=2)))
        train(train_config(data, ckpt, tmp_path / "ckpt", io=IOConfig(checkpoint=str(ckpt), data=str(data),
                                                                       out=str(tmp_path / "ckpt"), num_workers=0,
                                                                       device="cpu", grad_checkpointing=True)))
        run_eval(EvalConfig(run=str(tmp_path / "lora"), data=str(data), decode_examples=4, device="cpu"))


def test_every_command_runs_on_auto_by_default():
    """Each command's --device is "auto", given by the CLI or (None there) by its config's dataclass."""
    from tokweight.cli import main
    from tokweight.training.config.base import BaseTrainConfig

    def commands(group, prefix=()):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from commands(cmd, prefix + (name,))
            else:
                yield " ".join(prefix + (name,)), cmd

    cli = {name: opt.default for name, cmd in commands(main) for opt in cmd.params if "--device" in opt.opts}
    assert {"extract", "train", "eval", "generate", "encode", "train-base"} <= set(cli)
    assert set(cli.values()) <= {"auto", None}, cli
    configs = (ExtractConfig, IOConfig, EvalConfig, GenerateConfig, EncodeConfig, BaseTrainConfig)
    assert {c.__dataclass_fields__["device"].default for c in configs} == {"auto"}


def test_train_base_under_the_guard(tiny, tmp_path):
    from tokweight.config_files import preset_config
    from tokweight.training.config.base import BaseTrainConfig
    from tokweight.training.loop.train_base import run as train_base

    data, _ = tiny
    with HostTensors():
        result = train_base(preset_config(BaseTrainConfig, "base", "tiny", data=str(data), out=str(tmp_path / "base"),
                                          device="cpu", steps=2, eval_every=2))
    assert result["fingerprint"]
