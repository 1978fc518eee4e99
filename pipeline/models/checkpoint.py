"""Checkpoint directories: model.safetensors + config.json + vocab.json + fingerprint.json.

Weights are read with safetensors, never unpickled. Loading recomputes the fingerprint
and refuses a directory whose files no longer match the one recorded at save time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tokweight.pipeline.models.gpt import GPT, ModelConfig
from tokweight.pipeline.tokens.templates import TEMPLATE_VERSION
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.store.fingerprint import fingerprint


def model_fingerprint(model: GPT, vocab: Vocab) -> str:
    return fingerprint(model_config=model.cfg.to_json(), tokens=list(vocab.tokens),
                       template_version=TEMPLATE_VERSION, tensors=model.state_dict())


@dataclass
class Checkpoint:
    model: GPT
    vocab: Vocab
    fingerprint: str
    path: Path
    meta: dict


def save_checkpoint(out: str | Path, model: GPT, vocab: Vocab, meta: dict | None = None) -> str:
    """Write the checkpoint directory and return its fingerprint."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({"model": model.cfg.to_json(), **(meta or {})}, indent=1) + "\n")
    vocab.save(out / "vocab.json")
    fp = model_fingerprint(model, vocab)
    (out / "fingerprint.json").write_text(json.dumps({"fingerprint": fp, "template_version": TEMPLATE_VERSION},
                                                     indent=1) + "\n")
    return fp


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu", weights: bool = True) -> Checkpoint:
    """The checkpoint at ``path``, its fingerprint verified; ``weights`` False: the model's shape alone, on the meta
    device, nothing read but its config and vocabulary (the recorded fingerprint, unverified)."""
    path = Path(path)
    for name in ("model.safetensors", "config.json", "vocab.json", "fingerprint.json"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path}: not a tokweight checkpoint (missing {name})")
    meta = json.loads((path / "config.json").read_text())
    cfg = ModelConfig(**meta.pop("model"))
    vocab = Vocab.load(path / "vocab.json")
    if cfg.vocab_size != len(vocab):
        raise ValueError(f"{path}: config vocab_size {cfg.vocab_size} != {len(vocab)} tokens in vocab.json")
    recorded = json.loads((path / "fingerprint.json").read_text())
    if not weights:
        with torch.device("meta"):
            return Checkpoint(GPT(cfg).eval(), vocab, recorded.get("fingerprint"), path, meta)
    model = GPT(cfg)
    model.load_state_dict(load_file(path / "model.safetensors"))
    fp = model_fingerprint(model, vocab)
    if recorded.get("fingerprint") != fp:
        raise ValueError(f"{path}: fingerprint.json says {recorded.get('fingerprint')} but the files hash to {fp}; "
                         "the checkpoint was modified after it was saved")
    return Checkpoint(model.to(device).eval(), vocab, fp, path, meta)
