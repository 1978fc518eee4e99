"""A small chat model as users have one, built from a config: nothing is downloaded.

A Qwen2 causal LM (a Llama where this transformers has no Qwen2) whose byte-level BPE tokenizer is
trained here on the caller's text, with the specials of a stock ChatML model and its chat template
as a string. The tests' chat checkpoint and ``scripts/chat_example.py``'s base model are both built
by ``save_chat_model``; transformers and tokenizers (the ``[hf]`` extra) are imported inside.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tokweight.pipeline.extras import require

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # pad, turn start, end of turn (eos)


def bpe_tokenizer(out: Path, corpus: list[str], specials: list[str], chat_template: str | None = None,
                  vocab_size: int = 320):
    """A byte-level BPE tokenizer trained on ``corpus``, eos the last special and pad the first, saved to
    ``out`` (with ``chat_template``)."""
    require("tokenizers", "hf", "the chat model's tokenizer")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    PreTrainedTokenizerFast = require("transformers", "hf", "the chat model's tokenizer").PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=specials[-1], pad_token=specials[0])
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(out)
    return fast


def save_chat_model(out: Path, corpus: list[str], *, chat_template: str | None = CHATML, hidden_size: int = 32,
                    layers: int = 2, vocab_size: int = 320, context: int = 128, seed: int = 0) -> Path:
    """A randomly initialised chat model and its tokenizer (trained on ``corpus``) saved to ``out``: 4
    attention heads over 2 key/value heads, an MLP twice ``hidden_size``, untied output embeddings."""
    transformers = require("transformers", "hf", "the chat model")

    tokenizer = bpe_tokenizer(out, corpus, CHAT_SPECIALS, chat_template, vocab_size)
    torch.manual_seed(seed)
    ids = dict(bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    arch = "Qwen2" if hasattr(transformers, "Qwen2Config") else "Llama"
    config = getattr(transformers, f"{arch}Config")(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
        tie_word_embeddings=False, **ids)
    getattr(transformers, f"{arch}ForCausalLM")(config).save_pretrained(out)
    return out
