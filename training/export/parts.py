"""What every `tokweight export` writes, full weights (``export``) or adapters (``export_lora``): the run's tokenizer
with the tokens the export appends, the prompt text and each value's answer prefix (checked against generate's
ids), each value's latent slots, generation_config.json, and the output directory's commit point (written to a
temporary name, export.json last, then renamed)."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import torch

from tokweight.pipeline.tokens.templates import template_ids, text_parts
from tokweight.training.decoding.decode import stand_in_y
from tokweight.training.export.checkpoint import build_tokenizer, tokenizer_config

SHARED = ("token", "prefix")  # one directory (or adapter) for every value
EXPORT_FILE = "export.json"


def require_transformers():
    from tokweight.pipeline.extras import require

    return require("transformers", "hf", "exporting a Hugging Face backbone")


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


# ---------------------------------------------------------------- slots and the directory


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


def staging(out: Path) -> Path:
    """The temporary directory an export is written to (renamed to ``out`` by ``commit``); ``out`` must be new or
    empty."""
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty: export into a new directory")
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit(tmp: Path, out: Path, summary: dict) -> None:
    """export.json last, then the whole directory renamed into place."""
    (tmp / EXPORT_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)
