"""Export a checkpoint as a Hugging Face GPT-2 directory (no transformers needed to write it).

`transformers.GPT2LMHeadModel.from_pretrained(OUT)` loads the result and gives the same
logits. GPT-2 stores its projections as Conv1D, i.e. (in, out): our Linear weights are
transposed on the way out. The output embedding is tied to `wte`, as in GPT-2.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from pipeline.checkpoint import load_checkpoint
from pipeline.model import GPT

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_state_dict(model: GPT) -> dict:
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu()
        out[f"transformer.{name}"] = (t.T if name.endswith(_CONV1D) else t).contiguous()
    return out


def hf_config(model: GPT) -> dict:
    c = model.cfg
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_embd": c.d_model,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": 4 * c.d_model,
        "activation_function": "gelu",  # exact erf GELU, as F.gelu
        "layer_norm_epsilon": c.layer_norm_eps,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "tie_word_embeddings": True,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    }


def export_hf(checkpoint: str | Path, out: str | Path) -> Path:
    ckpt = load_checkpoint(checkpoint)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(hf_state_dict(ckpt.model), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(ckpt.model), indent=1) + "\n")
    ckpt.vocab.save(out / "tokweight_vocab.json")
    (out / "tokweight_fingerprint.txt").write_text(ckpt.fingerprint + "\n")
    return out
