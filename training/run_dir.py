"""A train run's directory: written by ``train.run``, resumed by it, read by eval and the experiments.

RUN/config.json    the TrainConfig (``to_json``; runs before the grouping wrote the flat form,
                   which ``TrainConfig.from_json`` reads as well)
RUN/metrics.jsonl  one line per logged step and per validation
RUN/checkpoint/    model.safetensors, optimizer.safetensors (AdamW's state as "<param>.<name>"),
                   vocab.json (with the latent tokens the run appended, if any) and state.json (step,
                   the CVAE config, the fingerprints, template and model config the run started from,
                   its embeddings grown by those latent tokens, the dataset's mean b, AdamW's param groups)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tokweight.pipeline.backbone import load_backbone
from tokweight.pipeline.model import GPT, ModelConfig
from tokweight.pipeline.templates import Template
from tokweight.pipeline.vocab import Vocab, load_vocab
from tokweight.training.cvae import CVAE, CVAEConfig, add_latent_tokens, build_cvae, latent_tokens_needed
from tokweight.training.train_config import TrainConfig


def write_config(cfg: TrainConfig) -> None:
    (Path(cfg.io.out) / "config.json").write_text(json.dumps(cfg.to_json(), indent=1) + "\n")


def read_config(run: str | Path) -> TrainConfig:
    return TrainConfig.from_json(json.loads((Path(run) / "config.json").read_text()))


def read_metrics(run: str | Path) -> list[dict]:
    """RUN/metrics.jsonl as records: the logged training steps, then the validation lines."""
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def append_metrics(run: str | Path, record: dict) -> None:
    with (Path(run) / "metrics.jsonl").open("a") as log:
        log.write(json.dumps(record) + "\n")


def save_checkpoint(run: str | Path, model: CVAE, opt: torch.optim.Optimizer, vocab: Vocab, meta: dict) -> None:
    """RUN/checkpoint/ with ``meta`` (step first) in its state.json: written under checkpoint.tmp,
    then swapped in (an interrupted save leaves the old one)."""
    out = Path(run)
    tmp, final = out / "checkpoint.tmp", out / "checkpoint"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # cloned: a backbone with tied input and output embeddings holds one tensor under two names,
    # which safetensors refuses to write twice
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()},
              tmp / "model.safetensors")
    opt_state = opt.state_dict()
    tensors = {f"{i}.{name}": t.detach().cpu().contiguous()
               for i, s in opt_state["state"].items() for name, t in s.items()}
    save_file(tensors or {"empty": torch.zeros(0)}, tmp / "optimizer.safetensors")
    vocab.save(tmp / "vocab.json")
    (tmp / "state.json").write_text(json.dumps({**meta, "param_groups": opt_state["param_groups"]}, indent=1) + "\n")
    old = out / "checkpoint.old"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def config_differences(saved: TrainConfig, mine: TrainConfig) -> list[str]:
    """The fields ("optim.lr") in which two runs differ, the step count aside: a longer run extends one."""
    a, b = saved.to_json(), mine.to_json()
    return sorted(f"{g}.{k}" for g in b for k in b[g] if (g, k) != ("optim", "steps") and a[g][k] != b[g][k])


def resume(cfg: TrainConfig, model: CVAE, opt: torch.optim.Optimizer, init_fingerprint: str) -> int:
    """The step of RUN/checkpoint/, loaded into ``model`` and ``opt``; 0 when there is none. Refuses
    one from another config or init checkpoint."""
    out = Path(cfg.io.out)
    ckpt = out / "checkpoint"
    if not (ckpt / "state.json").is_file():
        return 0
    # read back through TrainConfig, so an old run's flat config and fields added since compare at their defaults
    differ = config_differences(read_config(out), cfg)
    if differ:
        raise ValueError(f"{out} holds a run with another config ({', '.join(differ)} differ); use a new --out")
    meta = json.loads((ckpt / "state.json").read_text())
    if meta["init_fingerprint"] != init_fingerprint:
        raise ValueError(f"{ckpt} was trained from checkpoint {meta['init_fingerprint']}, not {init_fingerprint}")
    model.load_state_dict(load_file(ckpt / "model.safetensors"))
    load_optimizer(opt, ckpt / "optimizer.safetensors", meta["param_groups"])
    return int(meta["step"])


def load_optimizer(opt: torch.optim.Optimizer, path: Path, param_groups: list) -> None:
    """Undo ``save_checkpoint``'s flattening of the optimizer state."""
    nested: dict[int, dict] = {}
    for name, t in load_file(path).items():
        if name != "empty":
            i, key = name.split(".", 1)
            nested.setdefault(int(i), {})[key] = t
    opt.load_state_dict({"state": nested, "param_groups": param_groups})


def load_run(run: str | Path, device: str = "cpu") -> tuple[TrainConfig, CVAE, Vocab, dict]:
    """(config, model in eval mode, vocabulary, checkpoint state.json) of a run directory."""
    run = Path(run)
    if not (run / "checkpoint" / "state.json").is_file():
        raise FileNotFoundError(f"{run}: no checkpoint/state.json (not a tokweight train run, or not started)")
    meta = json.loads((run / "checkpoint" / "state.json").read_text())
    cfg = read_config(run)
    cvae = CVAEConfig(**meta["cvae"])
    backbone, vocab = run_backbone(run, cfg, meta, cvae)
    model = build_cvae(backbone, vocab, cvae)
    model.load_state_dict(load_file(run / "checkpoint" / "model.safetensors"))
    return cfg, model.to(device).eval(), vocab, meta


def run_backbone(run: Path, cfg: TrainConfig, meta: dict, cvae: CVAEConfig):
    """(backbone architecture, vocabulary) of a run, with the latent tokens it appended: the built-in GPT
    from its recorded (grown) config and vocab.json; a Hugging Face backbone (architecture and tokenizer)
    from the run's init checkpoint directory, read in the run's template, grown as ``train`` grew it."""
    if meta.get("backbone", "tokweight") == "tokweight":
        return GPT(ModelConfig(**meta["model_config"])), load_vocab(run / "checkpoint" / "vocab.json")
    init = load_backbone(cfg.io.checkpoint, template=Template.from_json(meta.get("template")))
    if init.fingerprint != meta["init_fingerprint"]:
        raise ValueError(f"{run} was trained from {meta['init_fingerprint']}, but its checkpoint "
                         f"{cfg.io.checkpoint} is now {init.fingerprint}")
    return init.model, add_latent_tokens(init.model, init.vocab, latent_tokens_needed(cvae))
