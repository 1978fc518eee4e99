"""The backbone both stages run: a ``--checkpoint DIR`` recognised by its files.

- a tokweight checkpoint (model.safetensors, config.json, vocab.json, fingerprint.json):
  the built-in GPT (``pipeline/models/gpt.py``) and its symbol vocabulary (``pipeline/models/checkpoint.py``);
- a Hugging Face causal LM directory (config.json with a model_type, safetensors weights,
  tokenizer files): any ``AutoModelForCausalLM`` behind the same interface (``hf.py``).

A checkpoint is read in a ``Template`` (its format): the built-in one by default; the one a
store was extracted with is found by ``store_template``.

Either gives a ``Checkpoint``: ``model`` with ``hidden(idx, tok_emb=, ln_cond=, prefix=)`` (B, L, d),
``head(hidden, ids=None)`` logits (of every token, or of the tokens ``ids``), ``forward`` -> (logits,
hidden), ``embed``/``wte`` and ``cfg``
(vocab_size, block_size, d_model, n_layernorms); ``vocab`` with the template tokens by
name; and the fingerprint the store is keyed by.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tokweight.pipeline.models.checkpoint import Checkpoint, load_checkpoint
from tokweight.pipeline.models.hf import DTYPES, hf_fingerprint, is_hf_checkpoint, load_hf
from tokweight.pipeline.tokens.hf_vocab import read_template
from tokweight.pipeline.models.head import nll_over_s
from tokweight.pipeline.tokens.templates import TOKWEIGHT, Batch, Template
from tokweight.store.manifest import FINGERPRINT_PREFIX, list_fingerprint_dirs, read_manifest

NATIVE_FILES = ("model.safetensors", "config.json", "vocab.json", "fingerprint.json")


def is_native_checkpoint(path: Path) -> bool:
    return all((path / name).is_file() for name in NATIVE_FILES)


def load_backbone(path: str | Path, *, device: str | torch.device = "cpu", dtype: str = "float32",
                  template: Template = TOKWEIGHT, weights: bool = True) -> Checkpoint:
    """The checkpoint at ``path`` in eval mode, its weights cast to ``dtype`` for the forward; ``weights`` False: its
    shape alone, on the meta device (an FSDP rank that receives its shard from rank 0), fingerprint unverified."""
    path = Path(path)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if is_native_checkpoint(path):
        if not template.builtin:
            raise ValueError(f"{path}: a tokweight checkpoint has a symbol vocabulary and no tokenizer to render a "
                             f"{template.kind} template; leave out --template (the built-in one)")
        ckpt = load_checkpoint(path, device=device, weights=weights)
        ckpt.model.to(DTYPES[dtype])
        return ckpt
    if is_hf_checkpoint(path):
        model, vocab, fingerprint = load_hf(path, device=device, dtype=dtype, template=template, weights=weights)
        return Checkpoint(model, vocab, fingerprint, path, {"kind": "huggingface", "dtype": dtype})
    raise FileNotFoundError(f"{path}: neither a tokweight checkpoint ({', '.join(NATIVE_FILES)}) nor a Hugging Face "
                            "model directory (config.json with model_type, *.safetensors, tokenizer files)")


def checkpoint_fingerprint(path: str | Path, template: Template) -> str | None:
    """The fingerprint ``path`` has in ``template``, without loading it (None: it cannot have one): a tokweight
    checkpoint's recorded one (``load_checkpoint`` verifies it), a Hugging Face directory's files hashed."""
    path = Path(path)
    if is_native_checkpoint(path):
        return json.loads((path / "fingerprint.json").read_text())["fingerprint"] if template.builtin else None
    return hf_fingerprint(path, read_template(path), template) if is_hf_checkpoint(path) else None


def store_template(store: str | Path | None, checkpoint: str | Path) -> Template:
    """The template ``checkpoint``'s extraction into ``store`` used, as the store's manifest records it, so
    that no later command repeats ``--template``; the built-in one without a store or such an extraction."""
    for directory in list_fingerprint_dirs(store) if store else []:
        manifest = read_manifest(directory) or {}
        template = Template.from_json(manifest.get("template"))
        if checkpoint_fingerprint(checkpoint, template) == directory.name.removeprefix(FINGERPRINT_PREFIX):
            return template
    return TOKWEIGHT


def s_nll(model, batch: Batch) -> torch.Tensor:
    """(B, T_max) per-token NLL over S of a batch in one template, nats, 0 where masked: the
    z-free surprisal b when the batch is z-free (the base model's training loss, the frozen baseline).
    The head runs on the states that predict S only."""
    return nll_over_s(model, model.hidden(batch.input_ids), batch.logit_pos, batch.targets, batch.mask,
                      count=batch.s_tokens)
