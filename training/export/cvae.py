"""`tokweight export`: a trained CVAE as directories that stock transformers loads, one model per latent value.

DIR/export.json says, per latent value v (generate's values: each k of a discrete latent, the K k-means centres of a
continuous one), which directory to load (``"model"``, relative to DIR; ``"adapter"``: null, or a LoRA run's, below) and
what goes where the answer begins (``"answer_prefix"``); its ``"prompt"`` says how x becomes the text before it.
A reader tokenizes ``prompt(x) + answer_prefix`` with no special tokens added and decodes greedily: the
directory's generation_config.json stops at the template's end token (``</y>``, or the chat's end of turn) and
suppresses the tokens that only carry z.

Per z pathway (``conditioning.py``):

- ``token``, ``prefix``, discrete: the ``<z_k>`` tokens are rows of the trained (grown) vocabulary: one directory,
  ``model/``; value k's answer prefix holds ``<z_k>`` in each slot.
- ``token``, ``prefix``, continuous: a slot holds a projection of z, so each (value, slot) becomes a new token
  ``<zv{v}s{m}>`` whose input row is that projection: one directory. Tied to the output head, such a row also
  gets a logit; generation_config's ``suppress_tokens`` keeps greedy decoding over the other tokens, whose logits
  do not change.
- ``query``: the offset of every position's query per layer and head is a bias of the query projection (before
  RoPE, where the hook adds it): GPT-2's ``c_attn`` and Qwen2's ``q_proj`` have one; Llama-style configs take
  ``attention_bias: true`` (k, v and o biases then zero). The weights differ per value: ``value_{v}/`` each.
- ``layernorm`` (the built-in backbone only): z's scale and shift folded into every LayerNorm's weight and bias,
  ``value_{v}/`` each, plus the slot as in ``token``.
- ``memory``: one extra key/value position per layer has no stock counterpart: refused in one line.

The built-in backbone is written as GPT-2 (``export_hf``); a Hugging Face backbone in its own architecture. A LoRA
run is written as peft adapters on its base instead (``export_lora``): ``"adapter"`` names them.
transformers is needed for a Hugging Face backbone only; this module is imported by `tokweight export` alone.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file

from tokweight.pipeline.models.hf import QUERY_SITES
from tokweight.pipeline.models.gpt import GPT
from tokweight.training.decoding.encode import load_trained
from tokweight.training.export.checkpoint import hf_config, hf_state_dict
from tokweight.training.export.lora import export_adapters
from tokweight.training.export.parts import (SHARED, Tokenizer, answer_prefix, check_prompt, commit,
                                             generation_config, prompt_format, require_transformers, staging,
                                             value_slots)
from tokweight.training.config.use import ExportConfig, GenerateConfig
from tokweight.training.decoding.generate import decode_points
from tokweight.training.loop.run_dir import read_config

EXPORTABLE = ("token", "prefix", "query", "layernorm")


def refuse_unexportable(cond: str) -> None:
    if cond not in EXPORTABLE:
        raise ValueError(f"the {cond} z pathway (one extra key/value position per layer) has no counterpart in a "
                         f"stock transformers architecture; runs trained with --cond {', '.join(EXPORTABLE)} export")


# ---------------------------------------------------------------- the weights, per backbone


class GPT2Weights:
    """The built-in GPT as GPT-2 (``export_hf``): a state dict and a config, edited per value."""

    def __init__(self, gpt: GPT):
        self.state, self.config = hf_state_dict(gpt), hf_config(gpt)
        self.d = gpt.cfg.d_model

    def copy(self) -> GPT2Weights:
        out = copy.copy(self)
        out.state, out.config = {k: v.clone() for k, v in self.state.items()}, dict(self.config)
        return out

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    def append_rows(self, rows: torch.Tensor) -> None:
        """Token rows (n, d) after the last; the output head is tied to them."""
        wte = self.state["transformer.wte.weight"]
        self.state["transformer.wte.weight"] = torch.cat([wte, rows.to(wte.dtype)])
        self.config["vocab_size"] += len(rows)

    def add_query_bias(self, offset: torch.Tensor) -> None:
        """offset (layers, heads, head dim): added to the query third of each layer's ``c_attn`` bias."""
        for layer, o in enumerate(offset):
            self.state[f"transformer.h.{layer}.attn.c_attn.bias"][: o.numel()] += o.reshape(-1)

    def modulate_layernorms(self, cond: torch.Tensor) -> None:
        """cond (n_layernorms, 2, d), LayerNorms in forward order: h (1 + s) + t after ``LN(x) = n w + b`` is
        ``n w (1 + s) + b (1 + s) + t``."""
        names = [f"h.{i}.ln_{j}" for i in range(self.config["n_layer"]) for j in (1, 2)] + ["ln_f"]
        for name, (s, t) in zip(names, cond):
            w, b = (f"transformer.{name}.{p}" for p in ("weight", "bias"))
            self.state[w], self.state[b] = self.state[w] * (1 + s), self.state[b] * (1 + s) + t

    def save(self, out: Path) -> None:
        save_file({k: v.contiguous() for k, v in self.state.items()}, out / "model.safetensors",
                  metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(self.config, indent=1) + "\n")


class HFWeights:
    """A transformers model in its own architecture, edited per value."""

    def __init__(self, model):
        self.model = model

    def copy(self) -> HFWeights:
        return HFWeights(copy.deepcopy(self.model))

    @property
    def vocab_size(self) -> int:
        return self.model.get_input_embeddings().num_embeddings

    def append_rows(self, rows: torch.Tensor) -> None:
        """Input rows (n, d) after the last; an untied output head gets zero rows (their tokens are suppressed)."""
        V, n = self.vocab_size, len(rows)
        self.model.resize_token_embeddings(V + n, mean_resizing=False)
        with torch.no_grad():
            self.model.get_input_embeddings().weight[V:] = rows
            out = self.model.get_output_embeddings()
            if out.weight is not self.model.get_input_embeddings().weight:
                out.weight[V:] = 0
            if getattr(out, "bias", None) is not None:
                out.bias[V:] = 0

    def with_query_bias(self) -> None:
        """Query projections with a bias: as they are where they have one (GPT-2's c_attn, Qwen2's q_proj), else
        the same weights under the config's ``attention_bias`` (every attention projection then has one, zero)."""
        sites = query_sites(self.model)
        if all(getattr(site, "bias", None) is not None for site in sites):
            return
        config = copy.deepcopy(self.model.config)
        if not hasattr(config, "attention_bias"):
            raise ValueError(f"the query z pathway exports as a query-projection bias, which the "
                             f"{config.model_type!r} architecture has no config option for: export runs trained "
                             "with --cond token or prefix")
        config.attention_bias = True
        tf = require_transformers()
        model = tf.AutoModelForCausalLM.from_config(config, dtype=self.model.dtype)
        missing, unexpected = model.load_state_dict(self.model.state_dict(), strict=False)
        if unexpected or any(not name.endswith("_proj.bias") for name in missing):
            raise ValueError(f"the {config.model_type!r} model with attention_bias does not take its weights "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        with torch.no_grad():
            for name in missing:
                model.get_parameter(name).zero_()
        self.model = model.eval()

    def add_query_bias(self, offset: torch.Tensor) -> None:
        """offset (layers, heads, head dim): added to the first heads * head dim entries of each query bias."""
        with torch.no_grad():
            for site, o in zip(query_sites(self.model), offset):
                site.bias[: o.numel()] += o.reshape(-1).to(site.bias.dtype)

    def modulate_layernorms(self, cond: torch.Tensor) -> None:
        raise ValueError("the layernorm z pathway exists on the built-in backbone only")

    def save(self, out: Path) -> None:
        self.model.save_pretrained(out, safe_serialization=True)


def query_sites(model: nn.Module) -> list[nn.Module]:
    """Per layer the module whose output begins with the queries (``HFBackbone.query_sites``'s names)."""
    return [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in QUERY_SITES]


def weights_of(backbone: nn.Module):
    return GPT2Weights(backbone) if isinstance(backbone, GPT) else HFWeights(backbone.model)


# ---------------------------------------------------------------- the export


def value_weights(model, base, z: torch.Tensor):
    """The weights of value z (F,): the shared ones, or a copy with the query offsets or LayerNorm
    modulation of z folded in."""
    cond = model.conditioning
    if cond.mode in SHARED:
        return base
    w = base.copy()
    if cond.query_proj is not None:
        w.add_query_bias(cond.query_proj(z).view(cond.query_shape))
    if cond.ln_proj is not None:
        w.modulate_layernorms(cond.ln_proj(z).view(cond.n_layernorms, 2, cond.d_model))
    return w


@torch.no_grad()
def run(cfg: ExportConfig) -> dict:
    tcfg = read_config(cfg.run) if (Path(cfg.run) / "config.json").is_file() else None
    if tcfg is not None:
        refuse_unexportable(tcfg.cvae.cond)  # before any weight is read
    tcfg, model, vocab, meta = load_trained(cfg.run, "cpu", "float32")
    z, slot_ids, source = decode_points(model, tcfg, meta, vocab, GenerateConfig(
        run=cfg.run, input="", out="", data=cfg.data, split=cfg.split, batch_size=cfg.batch_size, device="cpu",
        dtype="float32"))
    if tcfg.lora.rank:
        return export_adapters(cfg, tcfg, meta, model, vocab, (z, slot_ids, source))
    backbone = model.backbone
    base = weights_of(backbone)
    rows = base.vocab_size
    tok = Tokenizer(vocab, backbone.cfg.block_size, rows)
    slots, appended = value_slots(model, z, slot_ids, base, vocab)
    tok.add(appended)
    if model.conditioning.query_proj is not None and isinstance(base, HFWeights):
        base.with_query_bias()
    fmt = prompt_format(vocab, tok)
    prefixes = [answer_prefix(vocab, tok, s) for s in slots]
    for prefix, s in zip(prefixes, slots):
        check_prompt(vocab, tok, fmt, prefix, s)
    out = Path(cfg.out)
    tmp = staging(out)
    values, shared = [], model.conditioning.mode in SHARED
    suppress = list(range(rows, rows + len(appended)))
    for v in range(len(z)):
        name = "model" if shared else f"value_{v}"
        if not (tmp / name).exists():
            (tmp / name).mkdir()
            value_weights(model, base, z[v]).save(tmp / name)
            tok.save(tmp / name)
            generation_config(tmp / name, vocab.end_id, vocab.pad_id, suppress)
        values.append({"value": v, "model": name, "adapter": None, "answer_prefix": prefixes[v]})
    summary = {"run": str(cfg.run), "pathway": model.conditioning.mode, "latent": model.latent.kind,
               "values_from": source, "prompt": fmt, "tokenize": "prompt + answer_prefix, add_special_tokens=False",
               "end_token": tok.token(vocab.end_id), "values": values}
    commit(tmp, out, summary)
    return {"out": str(out), "pathway": summary["pathway"], "values": len(values),
            "directories": sorted({v["model"] for v in values}), "values_from": source}
