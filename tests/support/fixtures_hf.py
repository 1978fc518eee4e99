"""Tiny Hugging Face checkpoints built from a config, saved to a temp directory: nothing is downloaded.

A GPT-2 and a Llama over the tiny dataset's symbols, each with a word-level tokenizer made
with the ``tokenizers`` library whose vocabulary holds the template and latent tokens; and
checkpoints as users have them, over string data (``text_data``): a Qwen2 chat model whose
byte-level BPE tokenizer (trained on that data) has a ChatML chat template and no tokweight token
(``tokweight/experiments/chat_model.py`` builds it), and a GPT-2 with a plain prompt/answer string
template (``text_template``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import write_shards
from tokweight.experiments.chat_model import CHATML, bpe_tokenizer, save_chat_model

ARCHITECTURES = ("gpt2", "llama")
TEXT_TEMPLATE = {"text": "Question: {x}\nAnswer: {y}", "end": "<|endoftext|>"}


def word_level_tokenizer(tokens: list[str], out: Path, specials: list[str]):
    """A PreTrainedTokenizerFast over ``tokens`` (id = position), whitespace-split, saved to ``out``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   additional_special_tokens=specials)
    fast.save_pretrained(out)
    return fast


def tiny_hf_model(arch: str, vocab_size: int, block_size: int, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=block_size, n_embd=32, n_layer=2,
                                          n_head=4, **ids))
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=block_size, **ids))


def save_hf_checkpoint(arch: str, tokens: list[str], specials: list[str], out: Path, block_size: int = 64) -> Path:
    tiny_hf_model(arch, len(tokens), block_size).save_pretrained(out)
    word_level_tokenizer(tokens, out, specials)
    return out


@pytest.fixture(scope="session")
def hf_checkpoints(tiny, tmp_path_factory) -> dict[str, Path]:
    """{"gpt2": DIR, "llama": DIR}: random tiny models whose tokenizer is the tiny base model's vocabulary."""
    vocab = load_checkpoint(tiny[1]).vocab
    tokens = list(vocab.tokens)
    specials = [t for t in tokens if t.startswith("<")]
    root = tmp_path_factory.mktemp("hf")
    return {arch: save_hf_checkpoint(arch, tokens, specials, root / arch) for arch in ARCHITECTURES}


# ---------------------------------------------------------------- checkpoints as users have them


def text_samples(n: int, start: int = 0) -> list[Sample]:
    """String samples whose answer takes one of two forms (the strategy), decided at its first token."""
    samples = []
    for i in range(start, start + n):
        a, b = i % 7 + 1, i % 5 + 2
        words = f"{a + b} is the sum" if i % 2 else f"the sum is {a + b}"
        samples.append(Sample(key=f"s{i:04d}", x=f"what is {a} plus {b}?", y=words, strategy=f"form{i % 2}"))
    return samples


def write_text_data(out: Path) -> Path:
    """train (32), val (16) and test (16) splits of ``text_samples``, 16 per shard."""
    for split, (n, start) in {"train": (32, 0), "val": (16, 100), "test": (16, 200)}.items():
        write_shards(text_samples(n, start), out / split, shard_size=16)
    return out


def text_corpus() -> list[str]:
    """What the tests' BPE tokenizers are trained on: the text samples in the plain string template."""
    return [f"Question: {s.x}\nAnswer: {s.y}" for s in text_samples(64)] * 4


def save_chat_checkpoint(out: Path, chat_template: str | None = CHATML) -> Path:
    """A Qwen2 with a ChatML tokenizer: a stock chat model, in small."""
    return save_chat_model(out, text_corpus(), chat_template=chat_template)


def save_text_checkpoint(out: Path) -> Path:
    """A GPT-2 fine-tuned (in principle) on ``Question: x / Answer: y<|endoftext|>``: no chat template."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = bpe_tokenizer(out, text_corpus(), ["<|endoftext|>"])
    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=4,
                               bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def text_data(tmp_path_factory) -> Path:
    return write_text_data(tmp_path_factory.mktemp("text_data"))


@pytest.fixture(scope="session")
def chat_checkpoint(tmp_path_factory) -> Path:
    return save_chat_checkpoint(tmp_path_factory.mktemp("chat") / "qwen")


@pytest.fixture(scope="session")
def text_checkpoint(tmp_path_factory) -> Path:
    return save_text_checkpoint(tmp_path_factory.mktemp("text") / "gpt2")


@pytest.fixture(scope="session")
def text_template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "qa.json"
    path.write_text(json.dumps(TEXT_TEMPLATE))
    return path
