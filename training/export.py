"""`tokweight export`: a trained CVAE as directories that stock transformers loads, one model per latent value.

DIR/export.json says, per latent value v (generate's values: each k of a discrete latent, the K k-means centres of a
continuous one), which directory to load (``"model"``, relative to DIR; ``"adapter"``: null, see LoRA below) and
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
run's adapters are merged into the weights (with its trained latent rows): ``"adapter"`` is null.
transformers is needed for a Hugging Face backbone only; this module is imported by `tokweight export` alone.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file
from torch.nn.utils import parametrize

from tokweight.pipeline.hf import QUERY_SITES, HFBackbone
from tokweight.pipeline.model import GPT
from tokweight.pipeline.templates import template_ids, text_parts
from tokweight.training.decode import stand_in_y
from tokweight.training.encode import load_trained
from tokweight.training.export_hf import build_tokenizer, hf_config, hf_state_dict, tokenizer_config
from tokweight.training.use_config import ExportConfig, GenerateConfig
from tokweight.training.generate import decode_points
from tokweight.training.run_dir import read_config

EXPORTABLE = ("token", "prefix", "query", "layernorm")
SHARED = ("token", "prefix")  # one directory for every value
EXPORT_FILE = "export.json"


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


def require_transformers():
    from tokweight.pipeline.extras import require

    return require("transformers", "hf", "exporting a Hugging Face backbone")


def query_sites(model: nn.Module) -> list[nn.Module]:
    """Per layer the module whose output begins with the queries (``HFBackbone.query_sites``'s names)."""
    return [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in QUERY_SITES]


def merged(backbone: nn.Module) -> nn.Module:
    """A LoRA run's backbone with its adapters merged into the weights and its trainable latent rows written into
    the embeddings, in place: plain modules again. A full run's backbone as it is."""
    target = backbone.model if isinstance(backbone, HFBackbone) else backbone
    for module in list(target.modules()):
        for name in [n for n in getattr(module, "parametrizations", {})]:
            parametrize.remove_parametrizations(module, name, leave_parametrized=True)
    for name, module in list(target.named_modules()):
        if hasattr(module, "merge") and hasattr(module, "get_base_layer"):  # a peft LoRA layer
            module.merge()
            parent = target.get_submodule(name.rsplit(".", 1)[0]) if "." in name else target
            setattr(parent, name.rsplit(".", 1)[-1], module.get_base_layer())
    if isinstance(backbone, HFBackbone) and backbone.model.config.tie_word_embeddings:
        out = backbone.model.get_output_embeddings()
        out.weight = backbone.model.get_input_embeddings().weight  # equal rows; tied again, as saved
    return backbone


def weights_of(backbone: nn.Module):
    return GPT2Weights(backbone) if isinstance(backbone, GPT) else HFWeights(backbone.model)


# ---------------------------------------------------------------- tokenizer and prompt


class Tokenizer:
    """The run's tokenizer with the tokens its export appends (a run's latent tokens the tokenizer lacks, a
    continuous latent's value tokens), ids checked against the embedding rows; ``save(dir)`` writes its files."""

    def __init__(self, vocab, block_size: int, rows: int):
        self.vocab, self.block_size = vocab, block_size
        base = getattr(vocab, "base", vocab)  # a WithLatents' checkpoint vocabulary
        self.hf = getattr(base, "tokenizer", None)
        if self.hf is None:
            self.fast = build_tokenizer(vocab)
            self.specials = list(tokenizer_config(vocab, block_size)["additional_special_tokens"])
        else:
            self.hf = copy.deepcopy(self.hf)
            added = list(vocab.tokens[len(self.hf):])
            if any(not t for t in added):
                raise ValueError(f"{base.source}: the model has {rows} token rows and its tokenizer "
                                 f"{len(self.hf)} tokens: export needs a tokenizer with one token per row")
            self.add(added)

    def add(self, tokens: list[str]) -> None:
        """Special tokens after the last id, each one token."""
        if not tokens:
            return
        first = self.size
        if self.hf is None:
            from tokenizers import AddedToken

            self.fast.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
            self.specials += tokens
        else:
            self.hf.add_tokens(tokens, special_tokens=True)
        if [self.id(t) for t in tokens] != list(range(first, first + len(tokens))):
            raise AssertionError(f"the tokenizer did not give {tokens[:3]} the ids after its last")

    @property
    def size(self) -> int:
        return self.fast.get_vocab_size() if self.hf is None else len(self.hf)

    def id(self, token: str) -> int:
        return self.fast.token_to_id(token) if self.hf is None else self.hf.convert_tokens_to_ids(token)

    def token(self, i: int) -> str:
        return self.fast.id_to_token(i) if self.hf is None else self.hf.convert_ids_to_tokens(i)

    def encode(self, text: str) -> list[int]:
        if self.hf is None:
            return self.fast.encode(text, add_special_tokens=False).ids
        return self.hf(text, add_special_tokens=False)["input_ids"]

    def save(self, out: Path) -> None:
        if self.hf is not None:
            self.hf.save_pretrained(out)
            return
        self.fast.save(str(out / "tokenizer.json"))
        config = tokenizer_config(self.vocab, self.block_size) | {"additional_special_tokens": self.specials}
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


def prompt_format(vocab, tok: Tokenizer) -> dict:
    """How x becomes the text before the answer prefix: the built-in template's tokens around x (x's symbols
    joined by single spaces), the chat template's user turn with its generation prompt, or a string template's
    text around x."""
    template = vocab.template
    if template.builtin:
        name = lambda t: tok.token(vocab.id(t))
        return {"text": f"{name('<bos>')} {name('<x>')} {{x}} {name('</x>')} ", "x": "symbols joined by spaces"}
    if template.kind == "chat":
        return {"chat": "apply_chat_template([{'role': 'user', 'content': x}], add_generation_prompt=True, "
                        "tokenize=False)"}
    return {"text": text_parts(template.text)[0] + "{x}" + text_parts(template.text)[1], "x": "the string"}


def prompt_text(fmt: dict, tok: Tokenizer, x) -> str:
    if "chat" in fmt:
        return tok.hf.apply_chat_template([{"role": "user", "content": x}], add_generation_prompt=True,
                                          tokenize=False)
    return fmt["text"].replace("{x}", " ".join(x) if not isinstance(x, str) else x)


def answer_prefix(vocab, tok: Tokenizer, slots: list[int]) -> str:
    """What follows the prompt up to y: ``<z> slots </z> <y>`` (built-in template, space-separated), or the
    slots' tokens (a chat or string template puts them right before y)."""
    if vocab.template.builtin:
        name = lambda t: tok.token(vocab.id(t))
        return " ".join([name("<z>"), *(tok.token(i) for i in slots), name("</z>"), name("<y>")])
    return "".join(tok.token(i) for i in slots)


def check_prompt(vocab, tok: Tokenizer, fmt: dict, prefix: str, slots: list[int]) -> None:
    """Refuse an export whose text does not give generate's prompt ids, on a stand-in x."""
    x = stand_in_y(vocab)
    ids, layout = template_ids(vocab, x, x, slots)
    if tok.encode(prompt_text(fmt, tok, x) + prefix) != ids[: layout.s_start]:
        raise ValueError(f"the exported prompt text does not tokenize to the prompt the run decodes from "
                         f"(template {vocab.template.kind!r}): this tokenizer cannot carry it as text")


def generation_config(out: Path, end: int, pad: int, suppress: list[int]) -> None:
    """generation_config.json: greedy, stopping at the template's end token, never emitting ``suppress``."""
    path = out / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    for key in ("temperature", "top_p", "top_k"):
        config.pop(key, None)
    config |= {"eos_token_id": end, "pad_token_id": pad, "do_sample": False}
    if suppress:
        config["suppress_tokens"] = suppress
    path.write_text(json.dumps(config, indent=1) + "\n")


# ---------------------------------------------------------------- the export


def value_slots(model, z: torch.Tensor, slot_ids: torch.Tensor | None, weights, vocab) -> tuple[list, list[str]]:
    """Per value the ids in its M slots, and the tokens appended for them: a continuous latent's projections
    become rows of new tokens (appended to ``weights``); a discrete one's slots hold <z_k>; the query
    pathway's keep the placeholder the run decodes with."""
    cond, K = model.conditioning, len(z)
    M = cond.slots
    if not cond.writes_slots:
        return [[vocab.latent_id(0)] * M] * K, []
    if slot_ids is not None:
        return [[int(i)] * M for i in slot_ids], []
    first = weights.vocab_size
    weights.append_rows(cond.slot_proj(z.to(cond.slot_proj.weight.dtype)).reshape(K * M, -1))
    names = [f"<zv{v}s{m}>" for v in range(K) for m in range(M)]
    return [[first + v * M + m for m in range(M)] for v in range(K)], names


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
    backbone = merged(model.backbone)
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
    out, tmp = Path(cfg.out), Path(cfg.out).with_name(f".{Path(cfg.out).name}.tmp")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty: export into a new directory")
    shutil.rmtree(tmp, ignore_errors=True)
    values, shared = [], model.conditioning.mode in SHARED
    suppress = list(range(rows, rows + len(appended)))
    for v in range(len(z)):
        name = "model" if shared else f"value_{v}"
        if not (tmp / name).exists():
            (tmp / name).mkdir(parents=True)
            value_weights(model, base, z[v]).save(tmp / name)
            tok.save(tmp / name)
            generation_config(tmp / name, vocab.end_id, vocab.pad_id, suppress)
        values.append({"value": v, "model": name, "adapter": None, "answer_prefix": prefixes[v]})
    summary = {"run": str(cfg.run), "pathway": model.conditioning.mode, "latent": model.latent.kind,
               "values_from": source, "prompt": fmt, "tokenize": "prompt + answer_prefix, add_special_tokens=False",
               "end_token": tok.token(vocab.end_id), "values": values}
    (tmp / EXPORT_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)
    return {"out": str(out), "pathway": summary["pathway"], "values": len(values),
            "directories": sorted({v["model"] for v in values}), "values_from": source}
