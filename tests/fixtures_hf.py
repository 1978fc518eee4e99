"""Tiny Hugging Face checkpoints built from a config, saved to a temp directory: nothing is downloaded.

A GPT-2 and a Llama over the tiny dataset's symbols, each with a word-level tokenizer made
with the ``tokenizers`` library whose vocabulary holds the template and latent tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokweight.pipeline.checkpoint import load_checkpoint

ARCHITECTURES = ("gpt2", "llama")


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
