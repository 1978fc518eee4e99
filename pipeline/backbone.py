"""The backbone both stages run: a ``--checkpoint DIR`` recognised by its files.

- a tokweight checkpoint (model.safetensors, config.json, vocab.json, fingerprint.json):
  the built-in GPT (``model.py``) and its symbol vocabulary (``checkpoint.py``);
- a Hugging Face causal LM directory (config.json with a model_type, safetensors weights,
  tokenizer files): any ``AutoModelForCausalLM`` behind the same interface (``hf.py``).

Either gives a ``Checkpoint``: ``model`` with ``hidden(idx, tok_emb=, ln_cond=, prefix=)`` (B, L, d),
``head(hidden, ids=None)`` logits (of every token, or of the tokens ``ids``), ``forward`` -> (logits,
hidden), ``embed``/``wte`` and ``cfg``
(vocab_size, block_size, d_model, n_layernorms); ``vocab`` with the template tokens by
name; and the fingerprint the store is keyed by.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tokweight.pipeline.checkpoint import Checkpoint, load_checkpoint
from tokweight.pipeline.hf import DTYPES, is_hf_checkpoint, load_hf
from tokweight.pipeline.head import nll_over_s
from tokweight.pipeline.templates import Batch

NATIVE_FILES = ("model.safetensors", "config.json", "vocab.json", "fingerprint.json")


def is_native_checkpoint(path: Path) -> bool:
    return all((path / name).is_file() for name in NATIVE_FILES)


def load_backbone(path: str | Path, *, device: str | torch.device = "cpu", dtype: str = "float32") -> Checkpoint:
    """The checkpoint at ``path`` in eval mode, its weights cast to ``dtype`` for the forward."""
    path = Path(path)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if is_native_checkpoint(path):
        ckpt = load_checkpoint(path, device=device)
        ckpt.model.to(DTYPES[dtype])
        return ckpt
    if is_hf_checkpoint(path):
        model, vocab, fingerprint = load_hf(path, device=device, dtype=dtype)
        return Checkpoint(model, vocab, fingerprint, path, {"kind": "huggingface", "dtype": dtype})
    raise FileNotFoundError(f"{path}: neither a tokweight checkpoint ({', '.join(NATIVE_FILES)}) nor a Hugging Face "
                            "model directory (config.json with model_type, *.safetensors, tokenizer files)")


def s_nll(model, batch: Batch) -> torch.Tensor:
    """(B, T_max) per-token NLL over S of a batch in one template, nats, 0 where masked: the
    z-free surprisal b when the batch is z-free (the base model's training loss, the frozen baseline).
    The head runs on the states that predict S only."""
    return nll_over_s(model, model.hidden(batch.input_ids), batch.logit_pos, batch.targets, batch.mask)
