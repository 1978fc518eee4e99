"""The token vocabulary: specials, latent tokens and data symbols (docs/contract.md §2).

Order is fixed so that ids are stable: the nine specials (``<pad>`` is 0), then the
``K_max`` latent tokens ``<z_0> .. <z_{K_max-1}>``, then the data symbols in the order
the dataset lists them. Latent tokens exist from the first checkpoint on, so an
entangled (z-free) checkpoint already holds (untrained) embeddings for them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Sequence

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.tokens.templates import TOKWEIGHT, Rendered, Template

SPECIALS = ("<pad>", "<bos>", "<eos>", "<x>", "</x>", "<y>", "</y>", "<z>", "</z>")


def latent_token(k: int) -> str:
    return f"<z_{k}>"


@dataclass(frozen=True)
class Vocab:
    """Data symbols plus specials and ``k_max`` latent tokens."""

    symbols: tuple[str, ...]
    k_max: int = 8
    _index: dict = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        if self.k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {self.k_max}")
        reserved = set(SPECIALS) | {latent_token(k) for k in range(self.k_max)}
        clash = [s for s in self.symbols if s in reserved]
        if clash:
            raise ValueError(f"data symbols {clash} collide with special or latent tokens")
        if len(set(self.symbols)) != len(self.symbols):
            raise ValueError("data symbols must be unique")
        bad = [s for s in self.symbols if not isinstance(s, str) or not s or any(c.isspace() for c in s)]
        if bad:
            raise ValueError(f"data symbols must be non-empty strings without whitespace: {bad[:5]}")
        object.__setattr__(self, "symbols", tuple(self.symbols))
        object.__setattr__(self, "_index", {t: i for i, t in enumerate(self.tokens)})

    @property
    def tokens(self) -> tuple[str, ...]:
        return SPECIALS + tuple(latent_token(k) for k in range(self.k_max)) + self.symbols

    def __len__(self) -> int:
        return len(SPECIALS) + self.k_max + len(self.symbols)

    def id(self, token: str) -> int:
        return self._index[token]

    def latent_id(self, k: int) -> int:
        if not 0 <= k < self.k_max:
            raise ValueError(f"latent index {k} outside 0..{self.k_max - 1}")
        return len(SPECIALS) + k

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def template(self) -> Template:
        return TOKWEIGHT  # a symbol vocabulary has no tokenizer to render any other

    @property
    def end_id(self) -> int:
        """The token that ends y (S's last)."""
        return self.id("</y>")

    def encode_symbols(self, symbols: Sequence[str], *, key: str | None = None, field_name: str = "") -> list[int]:
        """Ids of data symbols; specials and latent tokens are not data and are refused."""
        if isinstance(symbols, str):
            raise SampleError("wrong-type", f"{field_name or 'a field'} is a string, but this vocabulary has no "
                              "tokenizer: give it as a list of symbols, or use a checkpoint with a tokenizer", key=key)
        ids = []
        first_symbol = len(SPECIALS) + self.k_max
        for s in symbols:
            i = self._index.get(s)
            if i is None or i < first_symbol:
                where = f" in {field_name!r}" if field_name else ""
                raise SampleError("unknown-symbol", f"unknown symbol {s!r}{where}", key=key)
            ids.append(i)
        return ids

    def decode(self, ids: Sequence[int]) -> list[str]:
        tokens = self.tokens
        return [tokens[i] for i in ids]

    def to_json(self) -> dict:
        return {"symbols": list(self.symbols), "k_max": self.k_max, "tokens": list(self.tokens)}

    @classmethod
    def from_json(cls, obj: dict) -> "Vocab":
        vocab = cls(symbols=tuple(obj["symbols"]), k_max=int(obj["k_max"]))
        if "tokens" in obj and list(obj["tokens"]) != list(vocab.tokens):
            raise ValueError("vocab.json token list does not match its symbols and k_max")
        return vocab

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Vocab":
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (KeyError, ValueError) as e:
            raise ValueError(f"{path}: not a tokweight vocabulary: {e}") from e


@dataclass(frozen=True)
class WithLatents:
    """A checkpoint's vocabulary with ``added`` latent tokens appended after its last id: the trainable
    copy's, when a run needs more latent tokens than the checkpoint has (``training.cvae.model.add_latent_tokens``
    appends their embedding rows). Everything but the latent tokens is the checkpoint's vocabulary's."""

    base: Vocab  # or a pipeline.tokens.hf_vocab.TokenizerVocab
    added: int
    first: int  # id of the first appended token: the backbone's rows before (a tokenizer may have fewer ids)

    @property
    def k_max(self) -> int:
        return self.base.k_max + self.added

    @cached_property  # once: a decode looks tokens up by id
    def tokens(self) -> tuple[str, ...]:
        unused = ("",) * (self.first - len(self.base))  # rows of the backbone that no token of the base has
        return (*self.base.tokens, *unused, *(latent_token(self.base.k_max + i) for i in range(self.added)))

    def __len__(self) -> int:
        return self.first + self.added

    def latent_id(self, k: int) -> int:
        if self.base.k_max <= k < self.k_max:
            return self.first + k - self.base.k_max
        if not 0 <= k < self.k_max:
            raise ValueError(f"latent index {k} outside 0..{self.k_max - 1}")
        return self.base.latent_id(k)

    def id(self, token: str) -> int:
        return self.base.id(token)

    @property
    def pad_id(self) -> int:
        return self.base.pad_id

    @property
    def template(self) -> Template:
        return self.base.template

    @property
    def end_id(self) -> int:
        return self.base.end_id

    def encode_symbols(self, symbols, *, key: str | None = None, field_name: str = "") -> list[int]:
        return self.base.encode_symbols(symbols, key=key, field_name=field_name)

    def render(self, x, y, *, key: str | None = None) -> Rendered:
        return self.base.render(x, y, key=key)

    def decode(self, ids: Sequence[int]) -> list[str]:
        tokens = self.tokens
        return [tokens[i] for i in ids]

    def text(self, ids: Sequence[int]) -> str:
        """The base tokenizer's text of the ids; the latent tokens a run added have none and are left out."""
        return self.base.text([i for i in ids if i < self.first])

    def to_json(self) -> dict:
        return {"added_latents": self.added, "first_added_id": self.first, "base": self.base.to_json(),
                "tokens": list(self.tokens)}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def checkpoint_vocab(vocab):
    """The checkpoint's own vocabulary (what its store was extracted with), latent tokens a run added aside."""
    return vocab.base if isinstance(vocab, WithLatents) else vocab


def load_vocab(path: str | Path):
    """A tokweight vocabulary file, with the latent tokens a run appended (``WithLatents.save``)."""
    obj = json.loads(Path(path).read_text())
    if "added_latents" not in obj:
        return Vocab.load(path)
    try:
        return WithLatents(Vocab.from_json(obj["base"]), int(obj["added_latents"]), int(obj["first_added_id"]))
    except (KeyError, ValueError) as e:
        raise ValueError(f"{path}: not a tokweight vocabulary: {e}") from None
