"""A tokenizer vocabulary's reading half: samples' x and y to ids under the checkpoint's template, with the
``tokenizers`` library only (no torch, no transformers), so that extraction's reader process runs it.

``pipeline.tokens.hf_vocab.TokenizerVocab`` builds one (``TokenizerVocab.ids``) from the transformers tokenizer and hands
its reading to it; what needs transformers stays there: loading, the chat template's per-row rendering
(the reference, ``TokenizerVocab._cut``), and checking the rows this half marks (``rendering.verify``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.tokens.rendering import BackendEncoder, Check, Reference, Renderer, per_row
from tokweight.pipeline.tokens.templates import Rendered, Template, or_error


@dataclass
class TokenizerIds:
    """The ``Vocab`` reading interface (``template``, ``id``, ``encode_symbols``, ``render_many``) over a tokenizer."""

    template: Template
    index: dict[str, int]  # token string -> id, added tokens included: symbol lists, one token each
    template_ids: dict[str, int]  # the built-in template's tokens by name (none for a chat or text template)
    end_id: int  # the token that ends y
    reserved: frozenset[int]  # ids data may not hold: template, latent and end tokens
    tokens: tuple[str, ...]  # id -> token, for messages
    text_ids: Callable[[str], list[int]]  # a string -> its ids, no special tokens added
    renderer: Renderer | None  # a chat or text template's rows (pipeline.tokens.rendering); None: the built-in template

    @property
    def detachable(self) -> bool:
        """Whether it reads without transformers (extraction's reader process): strings through the tokenizers
        library, and a template's rows rendered once (a template rendered per row needs the reference)."""
        return isinstance(getattr(self.text_ids, "__self__", None), BackendEncoder) and (
            self.renderer is None or (self.renderer.spans is not None and self.renderer.detachable))

    def id(self, token: str) -> int:
        return self.template_ids[token]

    def encode_symbols(self, symbols: Sequence[str] | str, *, key: str | None = None,
                       field_name: str = "") -> list[int]:
        """A string through the tokenizer; a list one token per symbol. Template tokens are refused in data."""
        if isinstance(symbols, str):
            try:
                ids = self.text_ids(symbols)
            except Exception as e:  # the tokenizers library raises plain Exceptions (e.g. no unk token)
                raise SampleError("unknown-symbol", f"the tokenizer cannot encode {field_name!r}: {e}", key=key) from None
        else:
            missing = [s for s in symbols if s not in self.index]
            if missing:
                raise SampleError("unknown-symbol", f"unknown symbol {missing[0]!r} in {field_name!r} (not one "
                                  "token of the tokenizer)", key=key)
            ids = [self.index[s] for s in symbols]
        self.refuse_reserved(ids, field_name, key)
        return ids

    def refuse_reserved(self, ids: Sequence[int], field_name: str, key: str | None) -> None:
        clash = [i for i in ids if i in self.reserved]
        if clash:
            raise SampleError("template-token", f"{field_name!r} holds the template token {self.token(clash[0])!r}",
                              key=key)

    def token(self, i: int) -> str | None:
        """The token of id ``i`` (None outside the tokenizer's ids), as messages name it."""
        return self.tokens[i] if 0 <= i < len(self.tokens) else None

    def render(self, x: Sequence[str] | str, y: Sequence[str] | str, *, key: str | None = None) -> Rendered:
        result = self.render_many([x], [y], [key])[0]
        if isinstance(result, SampleError):
            raise result
        return result

    def render_many(self, xs: Sequence[Sequence[str] | str], ys: Sequence[Sequence[str] | str],
                    keys: Sequence[str | None], reference: Reference | None = None) -> list[Rendered | SampleError]:
        """A chat or text template's samples, or the SampleError each raises: rendered once (the rows to check are
        marked: ``take_unchecked``), or by ``reference`` per row where the template must be."""
        out: list[Rendered | SampleError | None] = [or_error(self.check_texts, x, y, key)
                                                    for x, y, key in zip(xs, ys, keys)]
        todo = [i for i, r in enumerate(out) if r is None]
        args = [xs[i] for i in todo], [ys[i] for i in todo], [keys[i] for i in todo]
        if self.renderer.spans is None:
            rendered = [per_row(reference, x, y, key) for x, y, key in zip(*args)]
        else:
            rendered = self.renderer.render(*args)
        for i, r in zip(todo, rendered):
            out[i] = r if isinstance(r, SampleError) else or_error(self.checked, r, keys[i])
        return out

    def take_unchecked(self) -> list[Check]:
        """The rows rendered once and marked to be rendered per row too (``rendering.verify``), handed over."""
        return [] if self.renderer is None else self.renderer.take_unchecked()

    def check_texts(self, x, y, key: str | None) -> None:
        for name, value in (("x", x), ("y", y)):
            if not isinstance(value, str):
                raise SampleError("wrong-type", f"{name} is a list of tokens, but the checkpoint's {self.template.kind} "
                                  "template renders text: give x and y as strings (e.g. tokweight convert of JSON "
                                  "lines with string fields), or extract with the built-in template", key=key)
        if not y:
            raise SampleError("empty-y", "y is empty: S would only hold the end token", key=key)

    def checked(self, rendered: Rendered, key: str | None) -> Rendered:
        """The rendering, if y holds no template token and the end token is the template's."""
        self.refuse_reserved(rendered.y, "y", key)
        if rendered.end != self.end_id:
            raise SampleError("template-token", f"the template ends this y with {self.token(rendered.end)!r}, not "
                              f"with {self.token(self.end_id)!r} as it ends others", key=key)
        return rendered
