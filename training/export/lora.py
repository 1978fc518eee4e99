"""A LoRA run exported as peft adapters on a base (`tokweight export`): the user's own base for a Hugging Face
backbone, the run's built-in base written once as GPT-2 (``base/``) for the built-in one.

Each value's export.json entry names the base (``"model"``: a Hugging Face run's ``--checkpoint``, absolute as
given, or relative to DIR when given relative; ``"base"`` for the built-in backbone) and an adapter directory
(``"adapter"``) in peft's own format (adapter_config.json, adapter_model.safetensors), which also holds the
tokenizer (the base's, with the latent tokens the run added and a continuous latent's value tokens) and a
generation_config.json. A reader:

    tok = AutoTokenizer.from_pretrained(DIR / adapter)
    base = AutoModelForCausalLM.from_pretrained(DIR / model)
    base.resize_token_embeddings(len(tok))       # export.json's "resize_token_embeddings"
    model = PeftModel.from_pretrained(base, DIR / adapter)
    model.generate(ids, generation_config=GenerationConfig.from_pretrained(DIR / adapter))

What the adapter carries, in peft's terms:

- the run's LoRA A and B of every adapted linear layer, with its rank and scale (GPT-2's Conv1D layers with
  ``fan_in_fan_out``: the same A and B as the built-in backbone's Linear layers);
- the token rows the run trained or added (``trainable_token_indices``: the latent tokens, tokens the base lacks,
  a continuous latent's value tokens ``<zv{v}s{m}>`` whose input rows are the slots' projections): on the input
  embedding, and on an untied output head as well (a value token's output row zero, its logit suppressed);
- the query pathway's per-value offsets as the LoRA B bias (``lora_bias``) of each layer's query projection
  (divided by the LoRA scale, which multiplies it), zero on the other layers; the layernorm pathway's per-value
  LayerNorms (``modules_to_save``, z's scale and shift folded in): one adapter directory per value,
  ``adapter_{v}/``. The token and prefix pathways share one, ``adapter/``; a value is its answer prefix.

The adapters are built on a meta-device shell of the base's architecture: no second copy of the base is held.
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file
from torch.nn.utils import parametrize

from tokweight.pipeline.models.hf import QUERY_SITES, HFBackbone
from tokweight.training.export.checkpoint import hf_config, hf_state_dict
from tokweight.training.export.parts import (SHARED, Tokenizer, answer_prefix, check_prompt, commit,
                                             generation_config, prompt_format, require_transformers, staging,
                                             value_slots)
from tokweight.training.cvae.lora import latent_row_ids, require_peft

ADAPTER = "default"  # the adapter's name inside peft's modules
LAYERNORMS = ("ln_1", "ln_2", "ln_f")  # GPT-2's LayerNorm modules, which the layernorm pathway's adapters replace


class AppendedRows:
    """``value_slots``' weights for an adapter export: the run's token rows, and the input rows of the tokens
    appended after them, which the adapter carries."""

    def __init__(self, rows: int, d: int):
        self.vocab_size, self.rows = rows, torch.zeros(0, d)

    def append_rows(self, rows: torch.Tensor) -> None:
        self.rows = torch.cat([self.rows, rows.float()])
        self.vocab_size += len(rows)


class HFBase:
    """A Hugging Face backbone's LoRA run: the user's base, named as given; module names are the model's own."""

    prefix = ""

    def __init__(self, backbone: HFBackbone, checkpoint: str):
        self.model, self.checkpoint = backbone.model, checkpoint

    def embeddings(self) -> tuple[torch.Tensor, nn.Module]:
        """(input rows (V, d) as trained, the output head)."""
        return self.model.get_input_embeddings().weight.detach(), self.model.get_output_embeddings()

    def shell(self, rows: int):
        with torch.device("meta"):
            shell = require_transformers().AutoModelForCausalLM.from_config(copy.deepcopy(self.model.config))
        shell.resize_token_embeddings(rows, mean_resizing=False)
        return shell

    def reference(self, out: Path) -> str:
        return base_reference(self.checkpoint, out)

    def write(self, out: Path, vocab, rows: int) -> None:
        """Nothing: the base is the user's."""


class BuiltinBase:
    """The built-in backbone's LoRA run: its frozen base written once as GPT-2 (``base/``), whose module names are
    the built-in GPT's under ``transformer.``."""

    prefix = "transformer."

    def __init__(self, gpt: nn.Module):
        self.model = gpt

    def embeddings(self) -> tuple[torch.Tensor, nn.Module | None]:
        return self.model.wte.weight.detach(), None  # the head is tied to wte

    def shell(self, rows: int):
        tf = require_transformers()
        config = tf.GPT2Config(**{k: v for k, v in hf_config(self.model).items() if k != "architectures"})
        with torch.device("meta"):
            shell = tf.GPT2LMHeadModel(config)
        shell.resize_token_embeddings(rows, mean_resizing=False)
        return shell

    def frozen(self) -> nn.Module:
        """The base the adapters sit on: a copy of the GPT with its LoRA layers' base layers (unmerged) and its
        token rows as loaded (the trainable latent rows off)."""
        gpt = copy.deepcopy(self.model)
        for module in list(gpt.modules()):
            for name in list(getattr(module, "parametrizations", {})):
                parametrize.remove_parametrizations(module, name, leave_parametrized=False)
        for name in lora_layers(gpt):
            parent, _, child = name.rpartition(".")
            setattr(gpt.get_submodule(parent), child, gpt.get_submodule(name).get_base_layer())
        return gpt

    def reference(self, out: Path) -> str:
        return "base"

    def write(self, out: Path, vocab, rows: int) -> None:
        """``base/``: the frozen GPT as GPT-2, with the run's tokenizer (``rows`` tokens) and generation config."""
        (out / "base").mkdir()
        gpt = self.frozen()
        save_file(hf_state_dict(gpt), out / "base" / "model.safetensors", metadata={"format": "pt"})
        (out / "base" / "config.json").write_text(json.dumps(hf_config(gpt), indent=1) + "\n")
        Tokenizer(vocab, self.model.cfg.block_size, rows).save(out / "base")
        generation_config(out / "base", vocab.end_id, vocab.pad_id, [])


def base_reference(checkpoint: str, out: Path) -> str:
    """How export.json names the run's checkpoint, so that ``DIR / reference`` is it: the path as given when
    absolute, else (given relative to where train and export run) relative to DIR."""
    if os.path.isabs(checkpoint):
        return checkpoint
    return os.path.relpath(os.path.abspath(checkpoint), os.path.abspath(out))


def lora_layers(model: nn.Module) -> dict:
    """{module name: peft LoRA layer} of a backbone, in module order."""
    peft = require_peft()
    return {name: m for name, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}


def token_rows(base, ids: list[int], appended: torch.Tensor, tied: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input rows, output rows or None when tied) of the tokens ``ids`` (the run's trained rows) followed by the
    appended tokens (input: their rows; output: zero)."""
    weight, head = base.embeddings()
    inp = torch.cat([weight[ids].float(), appended])
    if tied:
        return inp, None
    if getattr(head, "bias", None) is not None:
        raise ValueError("the backbone's output head has a bias, which peft's trainable tokens do not carry: "
                         "export runs trained without --lora-rank")
    return inp, torch.cat([head.weight.detach()[ids].float(), torch.zeros_like(appended)])


def adapter_shell(base, layers: dict, rank: int, rows: int, ids: list[int], cond):
    """peft's model of the adapter on a meta-device shell of the base grown to ``rows`` token rows: LoRA on the
    run's layers, trainable token rows ``ids``, a LoRA B bias where the query pathway needs one, copies of the
    LayerNorms where the layernorm pathway does."""
    peft = require_peft()
    shell = base.shell(rows)
    inp, out = shell.get_input_embeddings(), shell.get_output_embeddings()
    names, tied = {m: n for n, m in shell.named_modules()}, out.weight is inp.weight
    tokens = None if not ids else ids if tied else {names[inp]: ids, names[out]: ids}
    config = peft.LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0,
                             target_modules=[base.prefix + n for n in layers],
                             fan_in_fan_out=any(type(m).__name__ == "Conv1D" for m in shell.modules()),
                             lora_bias=cond.query_proj is not None, trainable_token_indices=tokens,
                             modules_to_save=list(LAYERNORMS) if cond.ln_proj is not None else None)
    return peft.get_peft_model(shell, config), tied


def query_sites(layers: dict, cond) -> list[str]:
    """The names of the LoRA layers whose outputs begin with the queries, one per layer on the query pathway."""
    sites = [n for n in layers if n.rsplit(".", 1)[-1] in QUERY_SITES]
    if cond.query_proj is not None and len(sites) != cond.query_shape[0]:
        raise ValueError(f"the query z pathway needs a LoRA adapter on each layer's query projection; the run adapts "
                         f"{len(sites)} of {cond.query_shape[0]}: export runs trained with --cond token or prefix")
    return sites


def adapter_state(shell, base, layers: dict, rows: tuple, z: torch.Tensor, cond) -> dict:
    """The adapter's tensors for value z, by the shell's parameter names: the run's LoRA A and B, the token rows
    (input, output), each query site's LoRA B bias holding z's query offsets / scale, z's LayerNorms."""
    state, sites = {}, query_sites(layers, cond)
    offsets = None if cond.query_proj is None else cond.query_proj(z).view(cond.query_shape)  # (layers, heads, hd)
    for name, layer in layers.items():
        prefix = f"base_model.model.{base.prefix}{name}"
        for part in ("lora_A", "lora_B"):
            state[f"{prefix}.{part}.{ADAPTER}.weight"] = getattr(layer, part)[ADAPTER].weight.detach().float().clone()
        if offsets is not None:
            bias = torch.zeros(layer.lora_B[ADAPTER].out_features)
            if name in sites:
                o = offsets[sites.index(name)].reshape(-1).float()
                bias[: len(o)] = o / layer.scaling[ADAPTER]
            state[f"{prefix}.lora_B.{ADAPTER}.bias"] = bias
    if cond.ln_proj is not None:
        state |= layernorm_state(base.model, cond.ln_proj(z).view(cond.n_layernorms, 2, cond.d_model))
    inp, out = rows
    embedding = next(n for n, m in shell.get_base_model().named_modules() if m is shell.get_input_embeddings())
    for key in shell.state_dict():
        if key.endswith(f"trainable_tokens_delta.{ADAPTER}"):
            state[key] = inp if out is None or key.startswith(f"base_model.model.{embedding}.") else out
    expected = {k for k in shell.state_dict() if f".{ADAPTER}." in k or k.endswith(f".{ADAPTER}")}
    if set(state) != expected:
        raise AssertionError(f"adapter tensors {sorted(set(state) ^ expected)[:3]} do not match peft's model")
    return state


def layernorm_state(gpt: nn.Module, cond: torch.Tensor) -> dict:
    """cond (n_layernorms, 2, d), LayerNorms in forward order -> their peft copies' weights: ``w (1 + s)``,
    ``b (1 + s) + t``."""
    names = [f"h.{i}.ln_{j}" for i in range(len(gpt.h)) for j in (1, 2)] + ["ln_f"]
    state = {}
    for name, (s, t) in zip(names, cond):
        ln, key = gpt.get_submodule(name), f"base_model.model.transformer.{name}.modules_to_save.{ADAPTER}"
        state[f"{key}.weight"] = (ln.weight.detach() * (1 + s)).float()
        state[f"{key}.bias"] = (ln.bias.detach() * (1 + s) + t).float()
    return state


def check_scale(shell, base, layers: dict) -> None:
    """The shell's LoRA scale is the run's on every layer."""
    for name, layer in layers.items():
        theirs = shell.get_base_model().get_submodule(base.prefix + name).scaling[ADAPTER]
        if theirs != layer.scaling[ADAPTER]:
            raise AssertionError(f"{name}: adapter scale {theirs} is not the run's {layer.scaling[ADAPTER]}")


def save_adapter(shell, out: Path) -> None:
    with warnings.catch_warnings():  # peft reads any 1-D LoRA tensor, a lora_B bias too, as an ungathered shard
        warnings.filterwarnings("ignore", message=".*LoRA tensor\\(s\\) have invalid shape")
        shell.save_pretrained(out, save_embedding_layers=False)


def export_adapters(cfg, tcfg, meta: dict, model, vocab, points: tuple) -> dict:
    """Write DIR for a LoRA run (the module docstring); (z, slot ids, where they come from) are
    ``generate.decode_points``'."""
    z, slot_ids, source = points
    cond = model.conditioning
    if isinstance(model.backbone, HFBackbone):
        base = HFBase(model.backbone, tcfg.io.checkpoint)
    else:
        base = BuiltinBase(model.backbone)
    layers = lora_layers(base.model)
    run_rows = len(base.embeddings()[0])
    tok = Tokenizer(vocab, model.backbone.cfg.block_size, run_rows)
    appended_rows = AppendedRows(run_rows, cond.d_model)
    slots, appended = value_slots(model, z, slot_ids, appended_rows, vocab)
    tok.add(appended)
    rows = appended_rows.vocab_size
    if tok.size != rows:
        raise AssertionError(f"the tokenizer has {tok.size} tokens for {rows} token rows")
    ids = sorted(set(latent_row_ids(vocab, tcfg.cvae)) | set(range(run_rows, rows)))
    shell, tied = adapter_shell(base, layers, tcfg.lora.rank, rows, ids, cond)
    check_scale(shell, base, layers)
    query_sites(layers, cond)  # refused before anything is written
    token = token_rows(base, [i for i in ids if i < run_rows], appended_rows.rows, tied)
    fmt = prompt_format(vocab, tok)
    prefixes = [answer_prefix(vocab, tok, s) for s in slots]
    for prefix, s in zip(prefixes, slots):
        check_prompt(vocab, tok, fmt, prefix, s)
    out = Path(cfg.out)
    reference = base.reference(out)
    shell.peft_config[ADAPTER].base_model_name_or_path = reference
    tmp, values = staging(out), []
    base.write(tmp, vocab, run_rows)
    suppress = list(range(run_rows, rows))
    for v in range(len(z)):
        name = "adapter" if cond.mode in SHARED else f"adapter_{v}"
        if not (tmp / name).exists():
            shell.load_state_dict(adapter_state(shell, base, layers, token, z[v], cond), strict=False, assign=True)
            save_adapter(shell, tmp / name)
            tok.save(tmp / name)
            generation_config(tmp / name, vocab.end_id, vocab.pad_id, suppress)
        values.append({"value": v, "model": reference, "adapter": name, "answer_prefix": prefixes[v]})
    summary = {"run": str(cfg.run), "pathway": cond.mode, "latent": model.latent.kind, "values_from": source,
               "prompt": fmt, "tokenize": "prompt + answer_prefix, add_special_tokens=False",
               "end_token": tok.token(vocab.end_id),
               "base": {"checkpoint": tcfg.io.checkpoint, "fingerprint": meta.get("init_fingerprint")},
               "resize_token_embeddings": rows,
               "load": "tokenizer and generation_config from DIR/adapter; base = DIR/model resized to "
                       "resize_token_embeddings rows; peft.PeftModel.from_pretrained(base, DIR/adapter)",
               "values": values}
    commit(tmp, out, summary)
    return {"out": str(out), "pathway": cond.mode, "values": len(values), "base": reference,
            "adapters": sorted({v["adapter"] for v in values}), "values_from": source}
