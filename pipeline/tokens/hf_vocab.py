"""A Hugging Face tokenizer as a tokweight vocabulary: the template's tokens looked up by (renamed) name, data
through the tokenizer, and ``tokweight_template.json``'s renames. transformers is not imported here: the tokenizer
object comes from ``pipeline/models/hf.py``'s loader."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.tokens.rendering import BackendEncoder, Check, Renderer, anchor_of, batch_encoder, verify
from tokweight.pipeline.tokens.templates import TOKWEIGHT, Rendered, Template, cut_rest, text_parts
from tokweight.pipeline.tokens.tokenizer_ids import TokenizerIds
from tokweight.pipeline.tokens.vocab import SPECIALS, latent_token

TEMPLATE_FILE = "tokweight_template.json"
TEMPLATE_TOKENS = tuple(t for t in SPECIALS if t != "<pad>")  # <pad> only fills, it is never read
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "chat_template.jinja",
                   "chat_template.json", TEMPLATE_FILE)


def read_template(path: Path) -> dict[str, str]:
    """tokweight_template.json's renames {template token: the tokenizer's token}; {} if absent."""
    file = path / TEMPLATE_FILE
    if not file.is_file():
        return {}
    renames = json.loads(file.read_text())
    is_template = lambda name: name in TEMPLATE_TOKENS or re.fullmatch(r"<z_\d+>", name)
    unknown = sorted(n for n in renames if not is_template(n)) if isinstance(renames, dict) else ["(not an object)"]
    if unknown:
        raise ValueError(f"{file}: keys {unknown} are not template tokens; rename any of {list(TEMPLATE_TOKENS)} "
                         "or <z_k>")
    return renames


# ---------------------------------------------------------------- vocabulary


class TransformersIds:
    """A string's ids through the transformers tokenizer's own call, no special tokens added (``TokenizerIds.text_ids``
    where its class changes what the tokenizers library would give); picklable."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


class TokenizerVocab:
    """The ``Vocab`` interface over a tokenizer, in the checkpoint's ``template``. The built-in template:
    template tokens by (renamed) name, data as symbol lists (one token each) or as strings (encoded with no
    special tokens added). A chat or text template: x and y strings, ``render``ed as the model saw them (the
    template rendered once: ``pipeline.tokens.rendering``). Data becomes ids in ``ids`` (``pipeline.tokens.tokenizer_ids``, free
    of transformers: extraction's reader process takes it); the per-row rendering and its checks stay here."""

    def __init__(self, tokenizer, renames: dict[str, str], source: Path, template: Template = TOKWEIGHT):
        self.tokenizer, self.renames, self.source, self.template = tokenizer, renames, source, template
        self._anchor = anchor_of(tokenizer)  # what a row's rest is tokenized after (``_cut``)
        self._index = tokenizer.get_vocab()  # token string -> id, added tokens included
        names = TEMPLATE_TOKENS if template.builtin else ()
        self._template = {name: self._one_token(name) for name in names}
        self._latent = []
        while self._token_name(latent_token(len(self._latent))) in self._index:
            self._latent.append(self._one_token(latent_token(len(self._latent))))
        self.end_id = self._template["</y>"] if template.builtin else self._end_token()
        tokens = tuple(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))  # id order, once
        encoder = batch_encoder(tokenizer)
        text_ids = encoder.ids if isinstance(encoder, BackendEncoder) else TransformersIds(tokenizer)
        renderer = None if template.builtin else Renderer.of(tokenizer, lambda x, y: self._texts(x, y, None), self._cut)
        self.ids = TokenizerIds(template, self._index, self._template, self.end_id,
                                frozenset({*self._template.values(), *self._latent, self.end_id}), tokens, text_ids,
                                renderer)

    @property
    def rendering(self) -> str:
        """How a chat or text template's rows become ids: "once: ..." (``pipeline.tokens.rendering``) or "per row: why"."""
        return "built-in template" if self._renderer is None else self._renderer.why

    @property
    def _renderer(self) -> Renderer | None:
        return self.ids.renderer

    def for_reader(self) -> TokenizerIds | None:
        """What extraction's reader process reads with (no transformers there), or None where rows need it."""
        return self.ids if self.ids.detachable else None

    def _token_name(self, name: str) -> str:
        return self.renames.get(name, name)

    def _one_token(self, name: str) -> int:
        token = self._token_name(name)
        if token not in self._index:
            pieces = self.tokenizer.tokenize(token)
            raise ValueError(f"{self.source}: template token {name!r} ({token!r}) is not one token of the tokenizer "
                             f"(it splits into {pieces}); add it as a special token, rename it in {TEMPLATE_FILE}, "
                             "or extract with --template chat (its chat template) or --template FILE (its format)")
        return self._index[token]

    def _end_token(self) -> int:
        """The token that ends y: a text template's named one; a chat template's, the token it renders after
        an assistant turn's text (checked again on every sample)."""
        if self.template.kind == "text":
            ids = self.tokenizer(self.template.end, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise ValueError(f"the template's 'end' {self.template.end!r} is not one token of the tokenizer of "
                                 f"{self.source} (it encodes to {len(ids)}): name its end-of-text token")
            return ids[0]
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{self.source}: --template chat, but the tokenizer has no chat template "
                             "(chat_template.jinja or tokenizer_config.json 'chat_template'): set one, or pass "
                             "--template FILE with the model's prompt format")
        return self._cut("x", "y", None).end

    @property
    def k_max(self) -> int:
        return len(self._latent)

    @property
    def tokens(self) -> tuple[str, ...]:
        return self.ids.tokens

    def __len__(self) -> int:
        return len(self.tokenizer)

    def id(self, token: str) -> int:
        return self._template[token]

    def latent_id(self, k: int) -> int:
        if not 0 <= k < self.k_max:
            raise ValueError(f"latent index {k} outside the tokenizer's {self.k_max} latent tokens <z_0>.. of "
                             f"{self.source}: a train run appends the latent tokens it needs")
        return self._latent[k]

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return self.end_id if pad is None else pad  # padding is masked: any id does

    def encode_symbols(self, symbols: Sequence[str] | str, *, key: str | None = None,
                       field_name: str = "") -> list[int]:
        """A string through the tokenizer; a list one token per symbol. Template tokens are refused in data."""
        return self.ids.encode_symbols(symbols, key=key, field_name=field_name)

    def render(self, x: Sequence[str] | str, y: Sequence[str] | str, *, key: str | None = None) -> Rendered:
        """A sample in the chat or text template: the rendered text (``apply_chat_template``'s for a chat) with its
        prompt and the rest (y and all after it) tokenized apart, so that every y starts at a token boundary and a
        decode's prompt is the start of every sample's ids (``templates`` module docstring); ``_cut`` renders
        them so, ``render_many`` gives the same from the template rendered once."""
        result = self.render_many([x], [y], [key])[0]
        if isinstance(result, SampleError):
            raise result
        return result

    def render_many(self, xs: Sequence[Sequence[str] | str], ys: Sequence[Sequence[str] | str],
                    keys: Sequence[str | None]) -> list[Rendered | SampleError]:
        """``render`` of many samples, or the SampleError each raises; the rows' strings tokenized in one batch, and
        the rows marked to be checked rendered per row too (``rendering.verify``: a difference raises)."""
        out = self.ids.render_many(xs, ys, keys, self._cut)
        self.verify(self.ids.take_unchecked())
        return out

    def verify(self, checks: Sequence[Check]) -> None:
        """Rows rendered once (here or in a reader process) against rendering each alone: RenderMismatch naming
        the first that differs."""
        verify(checks, self._cut)

    def _cut(self, x: str, y: str, key: str | None) -> Rendered:
        """The reference: the sample rendered alone, its prompt's text tokenized on its own and the rest (y and all
        after it) after the tokenizer's anchor (``rendering.anchor_of``), cut at y's end (``templates.cut_rest``)."""
        prompt, full = self._texts(x, y, key)
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        anchor = self._anchor
        enc = self.tokenizer(anchor + full[len(prompt):], add_special_tokens=False, return_offsets_mapping=True)
        return cut_rest(enc["input_ids"], enc["offset_mapping"], len(anchor), len(y), prompt=prompt_ids, key=key)

    def _texts(self, x: str, y: str, key: str | None) -> tuple[str, str]:
        """(the prompt's text, the whole sample's text); y follows the prompt in the whole."""
        if self.template.kind == "text":
            before, between, after = text_parts(self.template.text)
            prompt = before + x + between
            return prompt, prompt + y + self.template.end + after
        user = {"role": "user", "content": x}
        prompt = self.tokenizer.apply_chat_template([user], tokenize=False, add_generation_prompt=True)
        full = self.tokenizer.apply_chat_template([user, {"role": "assistant", "content": y}], tokenize=False)
        if not full.startswith(prompt + y):
            raise SampleError("template-token", "the chat template does not render the assistant's text as given "
                              "right after the generation prompt (it changes or trims it): give y as the template "
                              "renders it, or use --template FILE", key=key)
        return prompt, full

    def decode(self, ids: Sequence[int]) -> list[str]:
        return self.tokenizer.convert_ids_to_tokens(list(ids))

    def text(self, ids: Sequence[int]) -> str:
        """The ids as the tokenizer writes them back: string data's own form."""
        return self.tokenizer.decode(list(ids))

    def to_json(self) -> dict:
        return {"tokenizer": str(self.source), "format": self.template.to_json(),
                "template": {t: self._token_name(t) for t in TEMPLATE_TOKENS},
                "k_max": self.k_max, "tokens": list(self.tokens)}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")
