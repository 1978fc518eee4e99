"""A train run's directory: written by ``train.run``, resumed by it, read by eval and the experiments.

RUN/config.json    the resolved TrainConfig (``to_json``)
RUN/metrics.jsonl  one line per logged step and per validation, then the run's stop line ({"stop": ...})
RUN/checkpoint/    model.safetensors (the trained parameters and the buffers; a LoRA run's frozen backbone is
                   left out: its init checkpoint's, ``load_run`` reads it again), optimizer.safetensors
                   (AdamW's state as "<param>.<name>"),
                   rng.safetensors (each rank's torch RNG states as "<generator>.<rank>"),
                   vocab.json (with the latent tokens the run appended, if any) and state.json (step,
                   the CVAE config, the fingerprints, template and model config the run started from,
                   its embeddings grown by those latent tokens, the dataset's mean b, AdamW's param
                   groups, the ranks, the stop rule's state and metrics.jsonl's size at that step)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.models.dtypes import torch_dtype
from tokweight.pipeline.models.gpt import GPT, ModelConfig
from tokweight.pipeline.tokens.templates import Template
from tokweight.pipeline.tokens.vocab import Vocab, load_vocab
from tokweight.training.config.migrations import train_config_from
from tokweight.training.config.components import CVAEConfig
from tokweight.training.cvae.model import CVAE, add_latent_tokens, build_cvae, latent_tokens_needed
from tokweight.training.loop.faults import nothing
from tokweight.training.cvae.lora import attach as attach_lora, latent_row_ids
from tokweight.training.config.train import TrainConfig


def write_config(cfg: TrainConfig) -> None:
    (Path(cfg.io.out) / "config.json").write_text(json.dumps(cfg.to_json(), indent=1) + "\n")


def read_config(run: str | Path) -> TrainConfig:
    """RUN/config.json as the config the run trained with, whatever version wrote it (``config_migrations``)."""
    return train_config_from(json.loads((Path(run) / "config.json").read_text()))


def read_metrics(run: str | Path) -> list[dict]:
    """RUN/metrics.jsonl as records: the logged training steps, then the validation lines."""
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def append_metrics(run: str | Path, record: dict) -> None:
    with (Path(run) / "metrics.jsonl").open("a") as log:
        log.write(json.dumps(record) + "\n")


def metrics_size(run: str | Path) -> int:
    """Bytes in RUN/metrics.jsonl (0 before its first line): a checkpoint records it, a resume cuts back to it."""
    path = Path(run) / "metrics.jsonl"
    return path.stat().st_size if path.is_file() else 0


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the previous one is intact. The message says what to do."""


def save_checkpoint(run: str | Path, tensors: dict[str, torch.Tensor], opt_state: dict, vocab: Vocab, meta: dict,
                    rng: dict[str, torch.Tensor], before_write: Callable[[Path], None] = nothing) -> None:
    """RUN/checkpoint/ with the trained ``tensors`` (CPU, ``trained_state``'s names), AdamW's ``opt_state``
    (``Optimizer.state_dict``'s form), ``meta`` (step first) in its state.json and every rank's ``rng`` states
    (``engine.checkpoint_state`` gathers the first two, also from a sharded model): written under checkpoint.tmp,
    then swapped in, so that a failed or interrupted save leaves the previous one (``committed_checkpoint``).
    ``before_write(path)`` runs before each file (the fault hooks)."""
    out = Path(run)
    tmp, final, old = out / "checkpoint.tmp", out / "checkpoint", out / "checkpoint.old"
    try:
        write_checkpoint_files(tmp, tensors, opt_state, vocab, meta, rng, before_write)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(e.errno, f"could not write the checkpoint of step {meta['step']} "
                                            f"({e.filename or tmp}: {e.strerror or e}); {final} holds the last "
                                            f"one written: free space or fix the disk and rerun the same command "
                                            f"to resume from it") from None


def write_checkpoint_files(tmp: Path, tensors: dict[str, torch.Tensor], opt_state: dict, vocab: Vocab, meta: dict,
                           rng: dict[str, torch.Tensor], before_write: Callable[[Path], None]) -> None:
    """The checkpoint's files under ``tmp``, state.json last."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    opt_tensors = {f"{i}.{name}": t.detach().cpu().contiguous()
                   for i, s in opt_state["state"].items() for name, t in s.items()}
    writes = [("model.safetensors", lambda path: save_file(tensors, path)),
              ("optimizer.safetensors", lambda path: save_file(opt_tensors or {"empty": torch.zeros(0)}, path)),
              ("rng.safetensors", lambda path: save_file(rng, path)),
              ("vocab.json", vocab.save),
              ("state.json", lambda path: path.write_text(
                  json.dumps({**meta, "param_groups": opt_state["param_groups"]}, indent=1) + "\n"))]
    for name, write in writes:
        before_write(tmp / name)
        write(tmp / name)


def frozen_parameter_names(model: torch.nn.Module) -> set[str]:
    """The state-dict names of the parameters that do not train (a LoRA run's backbone; none otherwise)."""
    return {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def trained_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state but its frozen parameters: those are the init checkpoint's, which a LoRA run's
    checkpoint does not store a second time."""
    frozen = frozen_parameter_names(model)
    return {name: t for name, t in model.state_dict().items() if name not in frozen}


def load_trained_state(model: torch.nn.Module, path: Path) -> None:
    """``trained_state``'s tensors from ``path`` into ``model``, whose frozen parameters already hold the init
    checkpoint's; anything else left out, or any tensor the model lacks, is refused."""
    missing, unexpected = model.load_state_dict(load_file(path), strict=False)
    untrained = sorted(set(missing) - frozen_parameter_names(model))
    if untrained or unexpected:
        raise ValueError(f"{path} does not fit the run's model: it lacks {untrained[:3]} and has unexpected "
                         f"{sorted(unexpected)[:3]} (of {len(untrained)} and {len(unexpected)})")


def committed_checkpoint(run: str | Path) -> Path:
    """RUN/checkpoint, or, in a run killed between ``save_checkpoint``'s two renames, checkpoint.old: the
    previous checkpoint, intact (the next save replaces it)."""
    out = Path(run)
    if not (out / "checkpoint").exists() and (out / "checkpoint.old" / "state.json").is_file():
        return out / "checkpoint.old"
    return out / "checkpoint"


def config_differences(saved: TrainConfig, mine: TrainConfig, from_start: bool = False) -> list[str]:
    """The fields ("optim.lr") in which two runs differ, the step count, the run directory and the engine aside: a
    longer run extends one, a run goes on from a start trained in another directory, and sharded and unsharded runs
    write the same checkpoint files. ``from_start``: ``mine`` goes on from the start ``saved``, which hardens
    nowhere (``harden_from`` None) where the run hardens from the starts' comparison on."""
    a, b = saved.to_json(), mine.to_json()
    same = {("optim", "steps"), ("io", "out"), ("io", "shard")}
    if from_start and saved.estep.harden_from is None:
        same.add(("estep", "harden_from"))
    return sorted(f"{g}.{k}" for g in b for k in b[g] if (g, k) not in same and a[g][k] != b[g][k])


def resume(cfg: TrainConfig, model: CVAE, init_fingerprint: str, rank: int = 0, world: int = 1,
           continue_from: Path | None = None, load: bool = True) -> dict | None:
    """The committed checkpoint's state.json, its model loaded into ``model`` (whole, before any sharding), AdamW's
    state under "optimizer" (``read_optimizer``; the caller loads it into the optimizer it makes, sharded or not)
    and this rank's RNG states under "rng"; None when there is none. The checkpoint is RUN's, or, where RUN
    has none yet, that of ``continue_from`` (the start a run with several starts goes on from). Refuses one
    from another config, init checkpoint or number of ranks. Rank 0 cuts metrics.jsonl back to what it held
    when the checkpoint was written (to nothing without one; a start's log up to its checkpoint when RUN goes on
    from it), so that the steps a resumed run redoes are logged once. ``load`` False (an FSDP rank other than 0, which
    receives its shards from rank 0): neither the model nor AdamW's state is read."""
    out = Path(cfg.io.out)
    source = out
    if continue_from is not None and not (committed_checkpoint(out) / "state.json").is_file():
        source = Path(continue_from)
    ckpt = committed_checkpoint(source)
    if not (ckpt / "state.json").is_file():
        if rank == 0:  # a run killed before its first checkpoint starts over
            truncate(out / "metrics.jsonl", 0)
        return None
    # read back through the migrations, so an old run's config and fields added since compare as it trained
    differ = config_differences(read_config(source), cfg, from_start=source != out)
    if differ:
        raise ValueError(f"{source} holds a run with another config ({', '.join(differ)} differ); use a new --out")
    meta = json.loads((ckpt / "state.json").read_text())
    if meta["init_fingerprint"] != init_fingerprint:
        raise ValueError(f"{ckpt} was trained from checkpoint {meta['init_fingerprint']}, not {init_fingerprint}")
    if meta.get("world", world) != world:
        raise ValueError(f"{ckpt} was written by {meta['world']} ranks, this run has {world}: resume it with "
                         f"{meta['world']} (torchrun --nproc-per-node {meta['world']}) or use a new --out")
    if load:
        load_trained_state(model, ckpt / "model.safetensors")
        meta["optimizer"] = read_optimizer(ckpt / "optimizer.safetensors", meta["param_groups"])
    rng = load_file(ckpt / "rng.safetensors") if (ckpt / "rng.safetensors").is_file() else {}
    meta["rng"] = {name.split(".")[0]: t for name, t in rng.items() if name.endswith(f".{rank}")}
    if rank == 0 and "metrics_bytes" in meta:
        if source != out:
            out.mkdir(parents=True, exist_ok=True)
            with open(source / "metrics.jsonl", "rb") as f:
                (out / "metrics.jsonl").write_bytes(f.read(meta["metrics_bytes"]))
        truncate(out / "metrics.jsonl", meta["metrics_bytes"])
    return meta


def truncate(path: Path, size: int) -> None:
    """``path`` cut to its first ``size`` bytes (a no-op when it is not longer)."""
    if path.is_file() and path.stat().st_size > size:
        os.truncate(path, size)


def read_optimizer(path: Path, param_groups: list) -> dict:
    """Undo ``save_checkpoint``'s flattening of the optimizer state: ``Optimizer.state_dict``'s form."""
    nested: dict[int, dict] = {}
    for name, t in load_file(path).items():
        if name != "empty":
            i, key = name.split(".", 1)
            nested.setdefault(int(i), {})[key] = t
    return {"state": nested, "param_groups": param_groups}


def load_run(run: str | Path, device: str = "cpu", dtype: str = "float32") -> tuple[TrainConfig, CVAE, Vocab, dict]:
    """(config, model in eval mode on ``device`` with its weights in ``dtype``, vocabulary, checkpoint state.json) of
    a run directory."""
    run = Path(run)
    if not (run / "checkpoint" / "state.json").is_file():
        raise FileNotFoundError(f"{run}: no checkpoint/state.json (not a tokweight train run, or not started)")
    meta = json.loads((run / "checkpoint" / "state.json").read_text())
    cfg = read_config(run)
    cvae = cfg.cvae
    backbone, vocab = run_backbone(run, cfg, meta, cvae)
    model = build_cvae(backbone, vocab, cvae)
    if cfg.lora.rank:
        attach_lora(model.backbone, cfg.lora.rank, latent_row_ids(vocab, cvae), cfg.optim.seed)
    load_trained_state(model, run / "checkpoint" / "model.safetensors")
    return cfg, model.to(device, torch_dtype(dtype)).eval(), vocab, meta


def run_backbone(run: Path, cfg: TrainConfig, meta: dict, cvae: CVAEConfig):
    """(backbone, vocabulary) of a run, with the latent tokens it appended: the built-in GPT's architecture
    from its recorded (grown) config and vocab.json, its weights all in the run's checkpoint; else (a Hugging
    Face backbone, or a LoRA run's, whose checkpoint holds no frozen weight) the run's init checkpoint
    directory, read in the run's template and grown as ``train`` grew it."""
    if meta.get("backbone", "tokweight") == "tokweight" and not cfg.lora.rank:
        return GPT(ModelConfig(**meta["model_config"])), load_vocab(run / "checkpoint" / "vocab.json")
    init = load_backbone(cfg.io.checkpoint, template=Template.from_json(meta.get("template")))
    if init.fingerprint != meta["init_fingerprint"]:
        raise ValueError(f"{run} was trained from {meta['init_fingerprint']}, but its checkpoint "
                         f"{cfg.io.checkpoint} is now {init.fingerprint}")
    return init.model, add_latent_tokens(init.model, init.vocab, latent_tokens_needed(cvae))
