"""A LoRA run on a Hugging Face backbone, exported as peft adapters on the user's own base (`tokweight export`).

Each value's export.json entry names the base the run was trained from (``"model"``: the run's ``--checkpoint``,
absolute as given, or relative to DIR when given relative) and an adapter directory (``"adapter"``) in peft's own
format (adapter_config.json, adapter_model.safetensors), which also holds the tokenizer (the base's, with the
latent tokens the run added and a continuous latent's value tokens) and a generation_config.json. A reader:

    tok = AutoTokenizer.from_pretrained(DIR / adapter)
    base = AutoModelForCausalLM.from_pretrained(DIR / model)
    base.resize_token_embeddings(len(tok))       # export.json's "resize_token_embeddings"
    model = PeftModel.from_pretrained(base, DIR / adapter)
    model.generate(ids, generation_config=GenerationConfig.from_pretrained(DIR / adapter))

What the adapter carries, in peft's terms:

- the run's LoRA A and B of every adapted linear layer, with its rank and scale;
- the token rows the run trained or added (``trainable_token_indices``: the latent tokens, tokens the base lacks,
  a continuous latent's value tokens ``<zv{v}s{m}>`` whose input rows are the slots' projections): on the input
  embedding, and on an untied output head as well (a value token's output row zero, its logit suppressed);
- the query pathway's per-value offsets as the LoRA B bias (``lora_bias``) of each layer's query projection
  (divided by the LoRA scale, which multiplies it), zero on the other layers: one adapter directory per value,
  ``adapter_{v}/``. The token and prefix pathways share one, ``adapter/``; a value is its answer prefix.

The adapters are built on a meta-device shell of the base's architecture: no second copy of the base is held.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from tokweight.pipeline.hf import QUERY_SITES
from tokweight.training.export import (SHARED, Tokenizer, answer_prefix, check_prompt, commit, generation_config,
                                       prompt_format, require_transformers, staging, value_slots)
from tokweight.training.lora import latent_row_ids, require_peft

ADAPTER = "default"  # the adapter's name inside peft's modules


class AppendedRows:
    """``value_slots``' weights for an adapter export: the run's token rows, and the input rows of the tokens
    appended after them, which the adapter carries."""

    def __init__(self, rows: int, d: int):
        self.vocab_size, self.rows = rows, torch.zeros(0, d)

    def append_rows(self, rows: torch.Tensor) -> None:
        self.rows = torch.cat([self.rows, rows.float()])
        self.vocab_size += len(rows)


def lora_layers(model) -> dict:
    """{module name: peft LoRA layer} of the run's backbone, in module order."""
    peft = require_peft()
    return {name: m for name, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}


def base_reference(checkpoint: str, out: Path) -> str:
    """The base as export.json names it: the run's checkpoint path as given when absolute, else relative to DIR
    (so that ``DIR / model`` finds it wherever a reader stands)."""
    if os.path.isabs(checkpoint):
        return checkpoint
    return os.path.relpath(os.path.abspath(checkpoint), os.path.abspath(out))


def token_rows(hf, ids: list[int], appended: torch.Tensor, tied: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input rows, output rows or None when tied) of the tokens ``ids`` (the run's trained rows) followed by the
    appended tokens (input: their rows; output: zero)."""
    inp = torch.cat([hf.get_input_embeddings().weight.detach()[ids].float(), appended])
    if tied:
        return inp, None
    head = hf.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("the backbone's output head has a bias, which peft's trainable tokens do not carry: "
                         "export runs trained without --lora-rank")
    return inp, torch.cat([head.weight.detach()[ids].float(), torch.zeros_like(appended)])


def adapter_shell(hf, layers: dict, rank: int, rows: int, ids: list[int], query: bool):
    """peft's model of the adapter on a meta-device copy of the base grown to ``rows`` token rows: LoRA on the
    run's layers, trainable token rows ``ids``, a LoRA B bias where the query pathway needs one."""
    tf, peft = require_transformers(), require_peft()
    with torch.device("meta"):
        shell = tf.AutoModelForCausalLM.from_config(copy.deepcopy(hf.config))
    shell.resize_token_embeddings(rows, mean_resizing=False)
    inp, out = shell.get_input_embeddings(), shell.get_output_embeddings()
    tied = out.weight is inp.weight
    names = {m: n for n, m in shell.named_modules()}
    tokens = None if not ids else ids if tied else {names[inp]: ids, names[out]: ids}
    config = peft.LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=list(layers),
                             fan_in_fan_out=any(type(m).__name__ == "Conv1D" for m in shell.modules()),
                             lora_bias=query, trainable_token_indices=tokens)
    return peft.get_peft_model(shell, config), tied


def adapter_state(shell, layers: dict, rows: tuple, offsets: torch.Tensor | None) -> dict:
    """The adapter's tensors, by the shell's parameter names: the run's LoRA A and B, the token rows (input,
    output), and each query site's LoRA B bias holding ``offsets`` (layers, heads, head dim) / scale."""
    state, sites = {}, [n for n in layers if n.rsplit(".", 1)[-1] in QUERY_SITES]
    if offsets is not None and len(sites) != len(offsets):
        raise ValueError(f"the query z pathway needs a LoRA adapter on each layer's query projection; the run "
                         f"adapts {len(sites)} of {len(offsets)} ({list(QUERY_SITES)}): export --cond token or prefix runs")
    for name, layer in layers.items():
        prefix = f"base_model.model.{name}"
        for part in ("lora_A", "lora_B"):
            state[f"{prefix}.{part}.{ADAPTER}.weight"] = getattr(layer, part)[ADAPTER].weight.detach().float().clone()
        if offsets is not None:
            bias = torch.zeros(layer.lora_B[ADAPTER].out_features)
            if name in sites:
                o = offsets[sites.index(name)].reshape(-1).float()
                bias[: len(o)] = o / layer.scaling[ADAPTER]
            state[f"{prefix}.lora_B.{ADAPTER}.bias"] = bias
    inp, out = rows
    for key in shell.state_dict():
        if key.endswith(f"trainable_tokens_delta.{ADAPTER}"):
            is_input = key.startswith(f"base_model.model.{input_name(shell)}.")
            state[key] = inp if is_input or out is None else out
    expected = {k for k in shell.state_dict() if f".{ADAPTER}." in k or k.endswith(f".{ADAPTER}")}
    if set(state) != expected:
        raise AssertionError(f"adapter tensors {sorted(set(state) ^ expected)[:3]} do not match peft's model")
    return state


def input_name(shell) -> str:
    """The name of the shell's input embedding module (peft's wrapper holds the embedding under ``token_adapter``
    beside ``base_layer``), relative to the transformers model."""
    model = shell.get_base_model()
    target = model.get_input_embeddings()
    return next(n for n, m in model.named_modules() if m is target)


def check_scale(shell, layers: dict) -> None:
    """The shell's LoRA scale is the run's on every layer."""
    for name, layer in layers.items():
        theirs = shell.get_base_model().get_submodule(name).scaling[ADAPTER]
        if theirs != layer.scaling[ADAPTER]:
            raise AssertionError(f"{name}: adapter scale {theirs} is not the run's {layer.scaling[ADAPTER]}")


def export_adapters(cfg, tcfg, meta: dict, model, vocab, points: tuple) -> dict:
    """Write DIR for a LoRA run on a Hugging Face backbone (the module docstring); (z, slot ids, where they come
    from) are ``generate.decode_points``'."""
    z, slot_ids, source = points
    hf, cond = model.backbone.model, model.conditioning
    layers = lora_layers(hf)
    run_rows = hf.get_input_embeddings().weight.shape[0]
    tok = Tokenizer(vocab, model.backbone.cfg.block_size, run_rows)
    appended_rows = AppendedRows(run_rows, cond.d_model)
    slots, appended = value_slots(model, z, slot_ids, appended_rows, vocab)
    tok.add(appended)
    rows = appended_rows.vocab_size
    if tok.size != rows:
        raise AssertionError(f"the tokenizer has {tok.size} tokens for {rows} token rows")
    ids = sorted(set(latent_row_ids(vocab, tcfg.cvae)) | set(range(run_rows, rows)))
    query = cond.query_proj is not None
    shell, tied = adapter_shell(hf, layers, tcfg.lora.rank, rows, ids, query)
    check_scale(shell, layers)
    token = token_rows(hf, [i for i in ids if i < run_rows], appended_rows.rows, tied)
    fmt = prompt_format(vocab, tok)
    prefixes = [answer_prefix(vocab, tok, s) for s in slots]
    for prefix, s in zip(prefixes, slots):
        check_prompt(vocab, tok, fmt, prefix, s)
    out = Path(cfg.out)
    base = base_reference(tcfg.io.checkpoint, out)
    shell.peft_config[ADAPTER].base_model_name_or_path = base
    tmp, values = staging(out), []
    suppress = list(range(run_rows, rows))
    for v in range(len(z)):
        name = "adapter" if cond.mode in SHARED else f"adapter_{v}"
        if not (tmp / name).exists():
            offsets = cond.query_proj(z[v]).view(cond.query_shape) if query else None
            shell.load_state_dict(adapter_state(shell, layers, token, offsets), strict=False, assign=True)
            shell.save_pretrained(tmp / name, save_embedding_layers=False)
            tok.save(tmp / name)
            generation_config(tmp / name, vocab.end_id, vocab.pad_id, suppress)
        values.append({"value": v, "model": base, "adapter": name, "answer_prefix": prefixes[v]})
    summary = {"run": str(cfg.run), "pathway": cond.mode, "latent": model.latent.kind, "values_from": source,
               "prompt": fmt, "tokenize": "prompt + answer_prefix, add_special_tokens=False",
               "end_token": tok.token(vocab.end_id),
               "base": {"checkpoint": tcfg.io.checkpoint, "fingerprint": meta.get("init_fingerprint")},
               "resize_token_embeddings": rows,
               "load": "tokenizer and generation_config from the adapter directory; the base resized to "
                       "resize_token_embeddings rows, then peft.PeftModel.from_pretrained(base, adapter)",
               "values": values}
    commit(tmp, out, summary)
    return {"out": str(out), "pathway": cond.mode, "values": len(values), "base": base,
            "adapters": sorted({v["adapter"] for v in values}), "values_from": source}
