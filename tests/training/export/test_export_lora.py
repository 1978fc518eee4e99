"""`tokweight export` of a LoRA run on a Hugging Face backbone: export.json names the user's own base and a peft
adapter directory per value (or one for all); the base from its directory (AutoModelForCausalLM), resized to the
adapter directory's tokenizer, with ``peft.PeftModel.from_pretrained`` (no custom code), greedy-generates, with the
exported prompt and the adapter directory's generation_config.json, what `tokweight generate` does for every
latent value, token for token, and its logits are the decoder's. GPT-2-like and Llama-like tiny backbones (and a
Qwen2 chat model whose tokenizer lacks the latent tokens) on the token, prefix and query pathways; the built-in
backbone (its base written once as GPT-2, ``base/``) on those and the layernorm pathway."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file

from tests.training.export.test_export import (LINES, assert_logits_are_the_decoders, chat_store,  # noqa: F401
                                               exported, generated_by_tokweight, generated_by_transformers, trained)
from tokweight.cli import main
from tokweight.training.loop.train_base import load_split

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("one_thread")

CONTINUOUS = dict(latent="continuous", z_dim=2)
CASES = {  # name: (backbone, CVAEConfig fields, LoRA rank)
    "builtin-token": ("builtin", dict(cond="token", k=2), 4),
    "builtin-prefix-continuous": ("builtin", dict(cond="prefix", slots=2, **CONTINUOUS), 4),
    "builtin-query": ("builtin", dict(cond="query", k=2), 4),
    "builtin-layernorm": ("builtin", dict(cond="layernorm", k=2), 4),
    "gpt2-token": ("gpt2", dict(cond="token", k=2), 4),
    "gpt2-prefix-continuous": ("gpt2", dict(cond="prefix", slots=2, **CONTINUOUS), 4),
    "gpt2-query": ("gpt2", dict(cond="query", k=2), 4),
    "llama-prefix": ("llama", dict(cond="prefix", slots=2, k=3), 4),
    "llama-token-continuous": ("llama", dict(cond="token", **CONTINUOUS), 4),
    "llama-query": ("llama", dict(cond="query", k=2), 4),
    "chat-token": ("chat", dict(cond="token", k=2), 4),
    "chat-query": ("chat", dict(cond="query", k=2), 4),
}


def load_adapter(export_dir, spec: dict, value: dict) -> tuple:
    """(model, tokenizer, generation config) of an adapter entry, as the reference tells a reader: the tokenizer
    and generation config from the adapter directory, the base from ``DIR / model`` resized to the tokenizer, the
    adapter by peft."""
    adapter = export_dir / value["adapter"]
    tok = transformers.AutoTokenizer.from_pretrained(adapter, local_files_only=True)
    base = transformers.AutoModelForCausalLM.from_pretrained(export_dir / value["model"], local_files_only=True)
    assert len(tok) == spec["resize_token_embeddings"]
    base.resize_token_embeddings(len(tok))
    model = peft.PeftModel.from_pretrained(base, adapter).eval()
    return model, tok, transformers.GenerationConfig.from_pretrained(adapter)


@pytest.mark.parametrize("name", list(CASES))
def test_base_plus_adapter_generates_what_tokweight_generates_for_every_value(name, request, tmp_path):
    run_dir, data = trained(name, request, tmp_path, CASES[name])
    continuous = CASES[name][1].get("latent") == "continuous"
    export, spec = exported(run_dir, data, continuous, tmp_path)
    config = json.loads((run_dir / "config.json").read_text())
    K = len(spec["values"])
    assert K == (4 if continuous else CASES[name][1]["k"]) and spec["pathway"] == CASES[name][1]["cond"]
    builtin = CASES[name][0] == "builtin"  # its base written as GPT-2, else the user's own
    assert {v["model"] for v in spec["values"]} == {"base" if builtin else config["io"]["checkpoint"]}
    per_value = spec["pathway"] in ("query", "layernorm")
    assert {v["adapter"] for v in spec["values"]} == ({f"adapter_{v}" for v in range(K)} if per_value else {"adapter"})
    for adapter in {v["adapter"] for v in spec["values"]}:
        assert_trained_adapter(export / adapter, spec["pathway"])
    xs = [s.x for s in load_split(data, "val")[:LINES]]
    ours = generated_by_tokweight(run_dir, data, xs, tmp_path, continuous)
    assert generated_by_transformers(export, xs, load_adapter) == ours
    assert sum(len(y) > 1 for rows in ours for y in rows) >= K  # sequences, not only empty decodes
    if not continuous:
        assert_logits_are_the_decoders(run_dir, export, load_split(data, "val")[0], load_adapter)


def assert_trained_adapter(adapter, pathway: str):
    """peft's files, holding the run's trained LoRA weights (B nonzero after two steps), the token rows, on the
    query pathway a nonzero LoRA B bias on each layer's query projection only, on the layernorm pathway every
    LayerNorm."""
    query = pathway == "query"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_bias"] == query
    tensors = load_file(adapter / "adapter_model.safetensors")
    assert any(k.endswith("lora_B.weight") and t.abs().sum() > 0 for k, t in tensors.items())
    assert any("trainable_tokens_delta" in k for k in tensors)
    biases = {k: t for k, t in tensors.items() if k.endswith("lora_B.bias")}
    assert bool(biases) == query
    for key, bias in biases.items():
        assert (bias.abs().sum() > 0) == any(f".{site}.lora_B" in key for site in ("c_attn", "q_proj")), key
    layernorms = [k for k in tensors if ".ln_" in k]
    assert len(layernorms) == (2 * (2 * 2 + 1) if pathway == "layernorm" else 0)  # (weight, bias) of 2 layers' 2 + 1



def test_a_relative_base_is_named_relative_to_the_export(tmp_path, monkeypatch):
    """A base given as a relative path (from where train and export run) is written so that DIR / model is it."""
    from tokweight.training.export.lora import base_reference

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "llama").mkdir(parents=True)
    out = Path("exports") / "run1"
    assert (tmp_path / out / base_reference("models/llama", out)).resolve() == (tmp_path / "models/llama").resolve()
    assert base_reference(str(tmp_path / "models" / "llama"), out) == str(tmp_path / "models" / "llama")
