"""A chat or string template rendered once, and rows tokenized in batches, giving the ids of rendering each row.

A sample's ids under a chat or text template are defined per row (``TokenizerVocab._cut``, the
*reference*): the template rendered with the sample's x and y (``apply_chat_template``'s text, or the
string template's), its prompt (all before y) tokenized on its own and the rest (y and all after it)
on its own, after the tokenizer's ``anchor_of`` (dropped), cut at y's end (``templates.cut_rest``).
A ``Renderer`` gives the same ids from work done once per template:

- the template's text around x and y (``Pieces``), read off one rendering with sentinel contents;
- the tokenizer's *spans*: a fast tokenizer splits a text at its added tokens first and tokenizes
  the text between them on its own, so the template's constant text beside its special tokens is
  tokenized once (``Spans``: head, middle, tail), and per row only the spans holding x and y, with
  the template's text beside them in the same span, are tokenized, all rows' in one batch call.

Neither step is assumed. When the vocabulary is loaded, the spans are compared with the reference on
``PROBES`` (spaces and newlines at either end, unicode, template syntax, think tags, the tokenizer's
added tokens as text); spans that do not match are given up for whole rows (a tokenizer that treats
a span unlike the same text inside a row, e.g. one that prepends a space to the first word only),
and a template that whole rows do not match either (one that trims or rewrites its contents) is
rendered per row. A row whose x or y could make an added token across a span's edge with the
template's text is tokenized whole (``crossing``: the template's text around it is fixed, so the row's
text is too). Every ``CHECK_EVERY``-th row, and every row tokenized whole, is marked (``Renderer.unchecked``)
and rendered per row too by whoever holds the reference (``verify``; extraction's reader process has no
transformers and hands its marks to the main process): a difference stops the run with an error naming
the key. Nothing here imports torch or transformers but ``batch_encoder``'s class check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.tokens.templates import Rendered, cut_rest, or_error

SENTINELS = ("\ue000tokweight-x\ue001", "\ue000tokweight-y\ue001")  # private-use characters: no template writes them
CHECK_EVERY = 64  # of the rows rendered once, one in CHECK_EVERY is rendered per row as well and compared
PROBES = (  # (x, y): what a template could trim, escape, rewrite or a tokenizer could merge across a span's edge
    ("what is 3 plus 4?", "7 is the sum"),
    (" leading space", " leading space"),
    ("trailing space ", "trailing space "),
    ("  two spaces  ", "  two  spaces  "),
    ("\nnewline first", "\nnewline first"),
    ("newline last\n", "newline last\n"),
    ("\n\n", "\r\nCRLF\r\n"),
    ("\ttab\t", "\ttab"),
    ("1,234.5 + 6e7 = ?", "=42;"),
    ("façade — 東京 🙂", "naïve ü ß"),
    ("{{ x }} {% raw %} {#", "{y} {{ y }}"),
    ('say "hi" \\n \'q\'', "it's \\"),
    ("<think>a</think>b", "<think>\nreason\n</think>\n\nanswer"),
    ("", "a"),
    ("x", "."),
)
Reference = Callable[[str, str, "str | None"], Rendered]  # (x, y, key) -> the per-row path's Rendered (or raises)


class Check(NamedTuple):
    """A row rendered once, to be rendered per row too (``verify``): its key, x, y and what it was given."""

    key: str | None
    x: str
    y: str
    got: "Rendered | SampleError"


class RenderMismatch(ValueError):
    """A row rendered once and rendered alone gave different ids (``CHECK_EVERY``)."""


@dataclass(frozen=True)
class Pieces:
    """A template's text around x and y: a row is ``before + x + between + y + after``."""

    before: str
    between: str
    after: str  # the end token's text and what the template renders after it

    @classmethod
    def read(cls, texts: Callable[[str, str], tuple[str, str]]) -> Pieces | None:
        """From ``texts(x, y) -> (prompt, whole row)`` with sentinel contents; None if they are not found once each,
        in order, the prompt the whole row's start."""
        sx, sy = SENTINELS
        try:
            prompt, full = texts(sx, sy)
        except SampleError:  # the template does not render the assistant's text right after the prompt
            return None
        after = full[len(prompt) + len(sy):]
        if prompt.count(sx) != 1 or sy in prompt or not full.startswith(prompt + sy) or sx in after or sy in after:
            return None
        before, between = prompt.split(sx)
        return cls(before, between, after)


class Encoded(NamedTuple):
    ids: list[int]
    offsets: list[tuple[int, int]]  # character (start, stop) of each token


class BackendEncoder:
    """Texts -> their ids and offsets, no special tokens added, in one call of the ``tokenizers`` library's own
    ``Tokenizer`` (the fast tokenizer's backend), as the transformers class calls it; picklable, and free of
    transformers, so that extraction's reader process encodes with it."""

    def __init__(self, backend, split_special_tokens: bool):
        self.backend, self.split = backend, split_special_tokens

    def __call__(self, texts: list[str]) -> Sequence[Encoded]:
        backend = self.backend
        backend.encode_special_tokens = self.split  # as transformers sets it on every call
        if backend.truncation is not None or backend.padding is not None:  # transformers sets them on its calls
            backend.no_truncation()
            backend.no_padding()
        return backend.encode_batch(texts, add_special_tokens=False)  # tokenizers.Encoding: .ids, .offsets

    def ids(self, text: str) -> list[int]:
        return self([text])[0].ids


def batch_encoder(tokenizer) -> Callable[[list[str]], Sequence[Encoded]]:
    """Texts -> their ids and offsets, no special tokens added, in one call: the Rust tokenizer's own batch call
    (``BackendEncoder``) where the transformers class adds nothing to it (as ``tokenizer(texts, ...)`` would make
    it), else that call."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend as Fast
    except ImportError:  # transformers 4
        from transformers import PreTrainedTokenizerFast as Fast

    own = getattr(type(tokenizer), "_encode_plus", None) is getattr(Fast, "_encode_plus", 0)
    if own:
        return BackendEncoder(tokenizer.backend_tokenizer, bool(getattr(tokenizer, "split_special_tokens", False)))

    def through_transformers(texts: list[str]) -> list[Encoded]:
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [Encoded(*pair) for pair in zip(enc["input_ids"], enc["offset_mapping"])]
    return through_transformers


def added_tokens(tokenizer) -> tuple[list[str], set[int]]:
    """(the texts of the added tokens matched in raw text, the ids of those that split a text cleanly: no
    stripping of the whitespace beside them, no whole-word rule)."""
    split = bool(getattr(tokenizer, "split_special_tokens", False))  # special tokens then count as plain text
    raw = {i: t for i, t in tokenizer.backend_tokenizer.get_added_tokens_decoder().items()
           if not t.normalized and not (t.special and split)}
    clean = {i for i, t in raw.items() if not (t.lstrip or t.rstrip or t.single_word)}
    return [t.content for t in raw.values()], clean


def anchor_of(tokenizer) -> str:
    """The text a row's rest (y and all after it) is tokenized after, its tokens then dropped: the clean added
    token of least id, so that y is read as text that follows other text, as in the whole row (a SentencePiece-like
    tokenizer marks a text's first word with '▁'); "" where the tokenizer has none (the rest tokenized alone)."""
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    clean = {i: t.content for i, t in tokenizer.backend_tokenizer.get_added_tokens_decoder().items()
             if not t.normalized and not (t.special and split) and not (t.lstrip or t.rstrip or t.single_word)}
    return clean[min(clean)] if clean else ""


def crossing(added: list[str], left: str, right: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(starts, ends): a span that starts with one of ``starts`` could make an added token with the constant text
    ``left`` before it, one that ends with one of ``ends`` with the constant text ``right`` after it."""
    starts = {t[k:] for t in added for k in range(1, len(t))
              if left and (left.endswith(t[:k]) or t[:k].endswith(left))}
    ends = {t[:k] for t in added for k in range(1, len(t))
            if right and (right.startswith(t[k:]) or t[k:].startswith(right))}
    return tuple(sorted(starts)), tuple(sorted(ends))


@dataclass(frozen=True)
class Spans:
    """Where a row's text is tokenized. The prompt (``before + x + between``) and the rest (``y + after``) are
    tokenized apart (``templates.cut_rest``: y's tokens begin at y's first character); within each, the
    template's constant text beside its clean added tokens once (``head``: before x, up to the last clean token;
    ``middle``: from between's first clean token to the prompt's end; ``tail``: from after's first clean token),
    per row x's span ``x_lead + x + x_trail`` and y's span ``anchor + y + y_trail`` (``anchor_of``)."""

    head: tuple[int, ...]
    x_lead: str
    x_trail: str
    middle: tuple[int, ...]
    y_trail: str
    tail: tuple[int, ...]
    anchor: str  # anchor_of(tokenizer): y's span starts with it
    x_edges: tuple[tuple[str, ...], tuple[str, ...]]  # crossing() of x's span
    y_edges: tuple[tuple[str, ...], tuple[str, ...]]  # crossing() of y's span
    pieces: Pieces  # the whole row's text, for a row tokenized whole

    @classmethod
    def of(cls, pieces: Pieces, encode, added: list[str], clean: set[int], anchor: str) -> Spans:
        """Cut at the clean added tokens of the template's text (found by the tokenizer itself); with ``clean``
        empty, one span per side of y: the prompt, and y with all after it."""
        def cuts(text: str) -> list[tuple[int, int]]:
            enc = encode([text])[0] if text else Encoded([], [])
            return [tuple(off) for i, off in zip(enc.ids, enc.offsets) if i in clean]

        ids = lambda text: tuple(encode([text])[0].ids) if text else ()
        a, b, c = cuts(pieces.before), cuts(pieces.between), cuts(pieces.after)
        cut_a = a[-1][1] if a else 0  # the head ends after the last clean token before x
        cut_b = b[0][0] if b else len(pieces.between)  # the middle starts at the first clean token after x
        cut_c = c[0][0] if c else len(pieces.after)  # the tail starts at the first clean token after y
        head, middle, tail = pieces.before[:cut_a], pieces.between[cut_b:], pieces.after[cut_c:]
        return cls(ids(head), pieces.before[cut_a:], pieces.between[:cut_b], ids(middle), pieces.after[:cut_c],
                   ids(tail), anchor, crossing(added, head, middle), crossing(added, "", tail), pieces)

    @property
    def kind(self) -> str:
        whole = not self.head and not self.middle and not self.tail
        return "whole rows" if whole else "spans between the template's special tokens"

    def texts(self, x: str, y: str) -> tuple[str, str]:
        """(x's span, y's span): y's starts with the anchor, then y."""
        return self.x_lead + x + self.x_trail, self.anchor + y + self.y_trail

    def crosses(self, x_span: str, y_span: str) -> bool:
        """Whether an added token could form across a span's edge (the row is then tokenized whole)."""
        return any(starts and span.startswith(starts) or ends and span.endswith(ends)
                   for span, (starts, ends) in ((x_span, self.x_edges), (y_span, self.y_edges)))


class Renderer:
    """A template's rows as the reference renders them, from the work done once (module docstring). Built by
    ``Renderer.of``; ``spans`` None: every row per row (``why`` says why), which only the reference can do.
    Picklable where its encoder is a ``BackendEncoder`` (``detachable``): what extraction's reader process gets."""

    def __init__(self, tokenizer, spans: Spans | None, why: str):
        self.spans, self.why = spans, why
        self.encode = batch_encoder(tokenizer) if spans is not None else None
        self._tokenizer = None if self.detachable else tokenizer  # to rebuild a transformers encoder when unpickled
        self.rows = 0  # rows rendered once so far: row CHECK_EVERY * k is marked to be checked
        self.unchecked: list[Check] = []  # marked rows not yet checked (``take_unchecked``, ``verify``)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "encode": self.encode if self.detachable else None}  # a closure: rebuilt

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.encode is None and self.spans is not None:
            self.encode = batch_encoder(self._tokenizer)

    @property
    def detachable(self) -> bool:
        """Whether it renders without transformers (the reference): once, through the tokenizers library."""
        return isinstance(self.encode, BackendEncoder)

    @classmethod
    def of(cls, tokenizer, texts: Callable[[str, str], tuple[str, str]], reference: Reference) -> Renderer:
        """The fastest of: spans at the template's clean added tokens, whole rows, per row; the first whose
        rendering of every probe is the reference's."""
        pieces = Pieces.read(texts)
        if pieces is None:
            return cls(tokenizer, None, "per row: the template does not render x and y as given between fixed text")
        encode, (added, clean), anchor = batch_encoder(tokenizer), added_tokens(tokenizer), anchor_of(tokenizer)
        candidates = {}  # kind -> Spans: where the template has no clean added token, its spans are whole rows
        for tokens in (clean, set()):
            spans = Spans.of(pieces, encode, added, tokens, anchor)
            candidates.setdefault(spans.kind, spans)
        tried = []
        for kind, spans in candidates.items():
            renderer = cls(tokenizer, spans, f"once: {kind}")
            bad = renderer.first_difference(PROBES + tuple((f"a{t}b", t) for t in added), reference)
            if bad is None:
                return renderer
            tried.append(f"{kind} differ on probe {bad!r}")
        return cls(tokenizer, None, f"per row: {'; '.join(tried)}")

    def first_difference(self, probes: Sequence[tuple[str, str]], reference: Reference) -> tuple[str, str] | None:
        """The first probe (x, y) whose rendering differs from the reference's, or None."""
        rendered, _ = self._once([x for x, _ in probes], [y for _, y in probes], [None] * len(probes))
        for (x, y), got in zip(probes, rendered):
            if not same(got, per_row(reference, x, y, None)):
                return x, y
        return None

    def render(self, xs: Sequence[str], ys: Sequence[str], keys: Sequence[str | None]) -> list[Rendered | SampleError]:
        """Each row's ids as the reference would give them, or the SampleError it would raise; x and y are strings.
        Every ``CHECK_EVERY``-th row and every row tokenized whole is marked (``unchecked``) for ``verify``."""
        rendered, whole = self._once(xs, ys, keys)
        marked = sorted({*range(-self.rows % CHECK_EVERY, len(rendered), CHECK_EVERY), *whole})
        self.unchecked += [Check(keys[i], xs[i], ys[i], rendered[i]) for i in marked]
        self.rows += len(rendered)
        return rendered

    def take_unchecked(self) -> list[Check]:
        """The marked rows so far, handed over (to ``verify``) and forgotten here."""
        marked, self.unchecked = self.unchecked, []
        return marked

    def _once(self, xs, ys, keys) -> tuple[list[Rendered | SampleError], list[int]]:
        """(the rows' renderings, the indices of those tokenized whole: an added token could cross a span's edge)."""
        spans = self.spans
        texts = [spans.texts(x, y) for x, y in zip(xs, ys)]  # (x's span, y's span)
        whole = [i for i, spans_of_row in enumerate(texts) if spans.crosses(*spans_of_row)]
        pieces = spans.pieces
        for i in whole:  # the prompt's whole text, and y's with all after it
            texts[i] = pieces.before + xs[i] + pieces.between, spans.anchor + ys[i] + pieces.after
        encoded = self.encode([t for pair in texts for t in pair])  # one batch: x's, y's, x's, y's, ...
        out: list[Rendered | SampleError] = []
        is_whole = set(whole)
        for i, (x_enc, y_enc) in enumerate(zip(encoded[::2], encoded[1::2])):
            before, after = (x_enc.ids, ()) if i in is_whole else (
                (*spans.head, *x_enc.ids, *spans.middle), spans.tail)
            try:
                out.append(cut_rest(y_enc.ids, y_enc.offsets, len(spans.anchor), len(ys[i]), prompt=before,
                                    after=after, key=keys[i]))
            except SampleError as error:
                out.append(error)
        return out, whole


def verify(checks: Sequence[Check], reference: Reference) -> None:
    """Each marked row rendered per row (``reference``) too: RenderMismatch naming the first that differs."""
    for check in checks:
        if not same(check.got, per_row(reference, check.x, check.y, check.key)):
            raise RenderMismatch(f"key {check.key!r}: the template rendered once gives this sample other ids than "
                                 "rendering it alone (its text changes the template or the tokenizer in a way the "
                                 "probes did not show); nothing is written from it: give the model's format as "
                                 "--template FILE, and report the template")


def per_row(reference: Reference, x: str, y: str, key: str | None) -> Rendered | SampleError:
    return or_error(reference, x, y, key)


def same(a: Rendered | SampleError, b: Rendered | SampleError) -> bool:
    """Equal renderings, or errors of one reason and message."""
    if isinstance(a, SampleError) or isinstance(b, SampleError):
        return type(a) is type(b) and (a.reason, str(a)) == (b.reason, str(b))
    return a == b
