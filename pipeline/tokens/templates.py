"""Sequence templates and the index maps of the supervised set S (docs/contract.md §2).

A checkpoint speaks one format (``Template``):

- ``tokweight`` (built in), z-free (entangled model, baseline, posterior input):
      <bos> <x> x_1..x_m </x> <y> y_1..y_n </y> <eos>
  z-conditioned (CVAE decoder), with M latent slots:
      <bos> <x> x_1..x_m </x> <z> <z_k>*M </z> <y> y_1..y_n </y> <eos>
  S is y_1..y_n and </y>.
- ``chat``: the tokenizer's own chat template, x the user turn and y the assistant turn;
  S is the assistant's tokens and its end-of-turn token; z's slots go at the start of the
  assistant turn, after the generation prompt.
- ``text``: literal text around ``{x}`` and ``{y}`` with a named end token after y;
  S is y's tokens and the end token; z's slots go right before y's tokens.

A chat or text sample's ids are those of its rendered string with the prompt (all before y) and
the rest (y and all after it) tokenized apart (``cut_rest``): y's first token starts at y's first character for
every y, so the prompt's ids, which a decode starts from, are the start of every sample's ids whatever
its y (tokenized at once, a byte-level BPE would merge a prompt's trailing space into y's first word
in one row and leave it a token of its own in another). ``Rendered`` is those ids cut into prompt, y,
end and tail (``pipeline.tokens.rendering`` gives them from the template rendered once, rows tokenized
in batches).
Either way T = n + 1. Every per-token array in tokweight is indexed by position in S
(0..T-1); the layouts below say where S position 0 sits in each template.
The logit that predicts sequence position p sits at p - 1 (next-token prediction).

torch is imported only where a tensor is made (``Batch.of``): extraction's reader process
(``pipeline.extract.reader``) encodes and collates with this module into numpy arrays, without it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from tokweight.pipeline.data.errors import SampleError

if TYPE_CHECKING:
    import torch

    from tokweight.pipeline.tokens.vocab import Vocab

# Bump when the templates or the definition of S change: it is part of every fingerprint.
TEMPLATE_VERSION = "tokweight-templates-v1:S=y+</y>"
# Bump when a chat or text template's rows become other ids: part of the fingerprint of a checkpoint read in one
# (``pipeline.models.hf.hf_fingerprint``), so that a store extracted under another rendering is not found.
RENDERING_VERSION = "prompt-and-rest-apart"
TEMPLATE_KINDS = ("tokweight", "chat", "text")
TEXT_KEYS = ("text", "end")  # of a string template file


def text_parts(text: str) -> tuple[str, str, str]:
    """(before x, between x and y, after y) of a string template; ValueError saying what is wrong."""
    for name in ("{x}", "{y}"):
        if text.count(name) != 1:
            raise ValueError(f"'text' holds {text.count(name)} {name}: write the format once, with one {{x}} "
                             "where the input goes and one {y} where the answer goes")
    before, rest = text.split("{x}")
    if "{y}" not in rest:
        raise ValueError("'text' has {y} before {x}: the answer must follow the input")
    between, after = rest.split("{y}")
    return before, between, after


@dataclass(frozen=True)
class Template:
    """A checkpoint's format: recorded in the store's manifest and in the fingerprint."""

    kind: str = "tokweight"
    """"tokweight" (the built-in template), "chat" (the tokenizer's own chat template) or "text"."""
    text: str = ""
    """text: the literal text around one {x} and one {y}, {x} first."""
    end: str = ""
    """text: the token that ends y (one token of the tokenizer); the text after {y} follows it."""

    def __post_init__(self):
        if self.kind not in TEMPLATE_KINDS:
            raise ValueError(f"template kind must be one of {TEMPLATE_KINDS}, got {self.kind!r}")
        if self.kind == "text":
            text_parts(self.text)
            if not self.end:
                raise ValueError("'end' is empty: name the token that ends the answer, e.g. \"<|endoftext|>\"")
        elif self.text or self.end:
            raise ValueError(f"a {self.kind!r} template takes no text or end token")

    @property
    def builtin(self) -> bool:
        return self.kind == "tokweight"

    def to_json(self) -> dict:
        return {"kind": self.kind, **({"text": self.text, "end": self.end} if self.kind == "text" else {})}

    @classmethod
    def from_json(cls, obj: dict | None) -> Template:
        """None (a store or run written before templates were recorded): the built-in template."""
        return cls() if obj is None else cls(**obj)


TOKWEIGHT = Template()


def read_template_file(path: str | Path) -> Template:
    """A string template file: JSON {"text": "... {x} ... {y} ...", "end": "<end token>"}."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON template file ({e}); write "
                         '{"text": "Question: {x}\\nAnswer: {y}", "end": "<|endoftext|>"}') from None
    missing = [k for k in TEXT_KEYS if not isinstance(obj, dict) or not isinstance(obj.get(k), str)]
    extra = sorted(set(obj) - set(TEXT_KEYS)) if isinstance(obj, dict) else []
    if missing or extra:
        raise ValueError(f"{path}: a template file holds the strings {list(TEXT_KEYS)} only; "
                         f"{'missing ' + str(missing) if missing else 'unknown keys ' + str(extra)}")
    try:
        return Template("text", obj["text"], obj["end"])
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def template_option(value: str) -> Template:
    """``--template``: "tokweight", "chat" or the path of a string template file."""
    if value in ("tokweight", "chat"):
        return Template(value)
    if not Path(value).is_file():
        raise ValueError(f"--template {value!r}: neither 'tokweight', 'chat' nor a template file; pass one of them")
    return read_template_file(value)


@dataclass(frozen=True)
class Skeleton:
    """A template's own tokens around the prompt, z's slots and y, counted. The defaults are the
    built-in template's; a chat or text template has none but its tail (its prompt is all its own)."""

    before_x: int = 2  # <bos> <x>
    after_x: int = 1  # </x>
    z_open: int = 1  # <z>
    z_close: int = 1  # </z>
    before_y: int = 1  # <y>
    tail: int = 1  # <eos>, after S

    @classmethod
    def rendered(cls, tail: int) -> Skeleton:
        return _rendered_skeleton(tail)


@functools.lru_cache(maxsize=64)
def _rendered_skeleton(tail: int) -> Skeleton:  # one per tail length: a template's rows share it
    return Skeleton(0, 0, 0, 0, 0, tail)


@dataclass(frozen=True)
class Layout:
    """Positions in one sequence. ``slots`` = 0 is the z-free template."""

    m: int  # len(x); under a chat or text template, the whole rendered prompt's tokens
    n: int  # len(y)
    slots: int = 0
    skeleton: Skeleton = Skeleton()

    @property
    def T(self) -> int:
        return self.n + 1

    @property
    def zfree(self) -> Layout:
        return replace(self, slots=0)

    @property
    def slot_start(self) -> int:
        sk = self.skeleton
        return sk.before_x + self.m + sk.after_x + sk.z_open

    @property
    def z_pos(self) -> int:
        """The position before the first slot (<z>, or the prompt's last token): its logits are the prior."""
        if not self.slots:
            raise ValueError("the z-free template has no latent slots")
        return self.slot_start - 1

    @property
    def slot_positions(self) -> range:
        return range(self.slot_start, self.slot_start + self.slots)

    @property
    def s_start(self) -> int:
        """Sequence position of y_1, the first element of S."""
        sk = self.skeleton
        z_section = sk.z_open + self.slots + sk.z_close if self.slots else 0
        return sk.before_x + self.m + sk.after_x + z_section + sk.before_y

    @property
    def length(self) -> int:
        return self.s_start + self.T + self.skeleton.tail  # ... </y> <eos>

    def s_positions(self) -> range:
        return range(self.s_start, self.s_start + self.T)

    def s_logit_positions(self) -> range:
        return range(self.s_start - 1, self.s_start + self.T - 1)


@dataclass(frozen=True)
class Rendered:
    """A chat or text sample's ids, tokenized as one string, cut at y: prompt, y, end, tail."""

    prompt: tuple[int, ...]  # everything before y: z's slots go after it
    y: tuple[int, ...]
    end: int  # the token that ends y: S is y and it
    tail: tuple[int, ...]  # what the template renders after it


def cut_at_y(ids: Sequence[int], offsets: Sequence[tuple[int, int]], y_start: int, y_end: int, *,
             before: Sequence[int] = (), after: Sequence[int] = (), key: str | None = None) -> Rendered:
    """A rendered string's ``ids`` and their character ``offsets`` cut at y's characters [y_start, y_end).

    y's tokens are those reaching into it (a chat or text row's string holds y and all after it, its prompt's
    ids tokenized apart are ``before``: ``cut_rest``). The token after y's is the end. ``before`` and ``after``:
    the ids of text around the string that holds none of y's characters (the prompt; a template's constant
    text, tokenized once: ``pipeline.tokens.rendering``); the row is ``before + ids + after``.
    """
    n = len(ids)
    first = next((i for i, (_, stop) in enumerate(offsets) if stop > y_start), n)
    stop = next((i for i in range(first, n) if offsets[i][0] >= y_end), n)
    if first == 0 and not before:
        raise SampleError("template-token", "the template renders nothing before y", key=key)
    if stop == first:
        raise SampleError("empty-y", "y is empty: S would only hold the end token", key=key)
    if (stop == n and not after) or offsets[stop - 1][1] > y_end:
        raise SampleError("template-token", "y's last token runs on into the end token's text: the template "
                          "must put its end token right after y", key=key)
    rest = (*ids[stop:], *after)
    return Rendered((*before, *ids[:first]), tuple(ids[first:stop]), rest[0], rest[1:])


def cut_rest(ids: Sequence[int], offsets: Sequence[tuple[int, int]], skip: int, y_len: int, *,
             prompt: Sequence[int], after: Sequence[int] = (), key: str | None = None) -> Rendered:
    """A chat or text row from its prompt's ids (``prompt``, tokenized apart) and the ids of its rest: y and all
    after it, tokenized after ``skip`` characters of anchor text (``rendering.anchor_of``: y is then read as text
    that follows other text), whose tokens are dropped; cut at y's end (``cut_at_y``)."""
    keep = next((i for i, (_, stop) in enumerate(offsets) if stop > skip), len(ids))
    return cut_at_y(ids[keep:], offsets[keep:], skip, skip + y_len, before=prompt, after=after, key=key)


Text = Sequence[str] | str  # a list of symbols, looked up one to one, or a string for a tokenizer


def template_ids(vocab: Vocab, x: Text, y: Text, slot_ids: Sequence[int] = (), *,
                 key: str | None = None) -> tuple[list[int], Layout]:
    """A sample in the z-free template (no ``slot_ids``) or the z-conditioned one (one id per
    latent slot), and its layout. The one place x and y become ids: the layout counts their
    tokens, which for a string is what the vocabulary's tokenizer made of it."""
    if not vocab.template.builtin:
        return rendered_ids(vocab.render(x, y, key=key), slot_ids)
    x_ids = vocab.encode_symbols(x, key=key, field_name="x")
    y_ids = vocab.encode_symbols(y, key=key, field_name="y")
    if not y_ids:
        raise SampleError("empty-y", "y is empty: S would only hold </y>", key=key)
    v = vocab.id
    z_section = [v("<z>"), *slot_ids, v("</z>")] if slot_ids else []
    ids = [v("<bos>"), v("<x>"), *x_ids, v("</x>"), *z_section, v("<y>"), *y_ids, v("</y>"), v("<eos>")]
    return ids, Layout(len(x_ids), len(y_ids), len(slot_ids))


def rendered_ids(r: Rendered, slot_ids: Sequence[int] = ()) -> tuple[list[int], Layout]:
    """A chat or text sample's ids with z's slots after its prompt, and its layout."""
    ids = [*r.prompt, *slot_ids, *r.y, r.end, *r.tail]
    return ids, Layout(len(r.prompt), len(r.y), len(slot_ids), Skeleton.rendered(len(r.tail)))


def template_ids_many(vocab: Vocab, xs: Sequence[Text], ys: Sequence[Text], keys: Sequence[str | None],
                      slot_ids: Sequence[int] = ()) -> list[tuple[list[int], Layout] | SampleError]:
    """``template_ids`` of many samples, or the SampleError each raises: a chat or text template's rows
    rendered together (``vocab.render_many``: the template's text tokenized once, x and y in one batch
    call), the built-in template's one by one."""
    render_many = None if vocab.template.builtin else getattr(vocab, "render_many", None)
    if render_many is None:  # the built-in template, or a vocabulary that renders one sample at a time
        return [or_error(template_ids, vocab, x, y, slot_ids, key=key) for x, y, key in zip(xs, ys, keys)]
    return [r if isinstance(r, SampleError) else rendered_ids(r, slot_ids) for r in render_many(xs, ys, keys)]


def or_error(fn, *args, **kwargs):
    """``fn(...)``, or the SampleError it raises."""
    try:
        return fn(*args, **kwargs)
    except SampleError as error:
        return error


def y_ids(vocab: Vocab, x: Text, y: Text, *, key: str | None = None) -> list[int]:
    """y's tokens as the template holds them (S without its end token): the reference a decode is held to."""
    ids, layout = template_ids(vocab, x, y, key=key)
    return ids[layout.s_start: layout.s_start + layout.n]


def s_targets(ids: Sequence[int], layout: Layout) -> list[int]:
    """Token ids of S read off a sequence: the echo the store keeps to check alignment."""
    return [ids[p] for p in layout.s_positions()]


def check_length(length: int, block_size: int, *, key: str | None = None) -> None:
    if length > block_size:
        raise SampleError("too-long", f"sequence of {length} tokens exceeds the model context of {block_size}",
                          key=key)


class BatchArrays(NamedTuple):
    """``Batch``'s arrays in numpy (what the reader process hands over; ``Batch.of`` makes the tensors)."""

    input_ids: np.ndarray  # (B, L) int64
    logit_pos: np.ndarray  # (B, T_max) int64
    targets: np.ndarray  # (B, T_max) int64
    mask: np.ndarray  # (B, T_max) bool


@dataclass(frozen=True)
class Batch:
    """Right-padded sequences and where S sits in each.

    input_ids:   (B, L) long, <pad> = 0 past each sequence's end
    logit_pos:   (B, T_max) long, the position whose logits predict S position t (0 where masked)
    targets:     (B, T_max) long, S token ids (0 where masked)
    mask:        (B, T_max) bool, True on real S positions (each row's first T)
    s_tokens:    the mask's True entries (sum of T), a host int counted when the batch is built, so that the
                 head indexes S without reading the mask back from the device (``head.nll_over_s``); None: unknown
    """

    input_ids: torch.Tensor
    logit_pos: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    s_tokens: int | None = None

    @classmethod
    def of(cls, arrays: BatchArrays) -> "Batch":
        """Tensors sharing the arrays' memory (no copy)."""
        import torch

        return cls(*map(torch.from_numpy, arrays), s_tokens=int(arrays.mask.sum()))

    def to(self, device) -> "Batch":
        """The batch on ``device`` (``to_device``: to a GPU through pinned memory, without blocking)."""
        move = lambda t: to_device(t, device)
        return Batch(*map(move, (self.input_ids, self.logit_pos, self.targets, self.mask)), s_tokens=self.s_tokens)


def to_device(t, device):
    """Host -> device. To CUDA through pinned memory and without blocking the host: the copy is queued behind the
    work already queued, and the host goes on to queue the forward (a copy from pageable memory would make the host
    wait for the device to finish its queue first). Elsewhere the plain ``.to``: on the CPU, the tensor itself."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def collate(seqs: Sequence[Sequence[int]], layouts: Sequence[Layout], *, pad_to: int | None = None) -> Batch:
    """Pad sequences to one length and build the S index maps (``collate_arrays``, as tensors)."""
    return Batch.of(collate_arrays(seqs, layouts, pad_to=pad_to))


def collate_arrays(seqs: Sequence[Sequence[int]], layouts: Sequence[Layout], *,
                   pad_to: int | None = None) -> BatchArrays:
    """Pad sequences to one length and build the S index maps (array operations, no per-row arrays)."""
    lengths = np.array([len(s) for s in seqs])  # (B,)
    expected = np.array([lay.length for lay in layouts])
    if (bad := np.flatnonzero(lengths != expected)).size:
        i = int(bad[0])
        raise ValueError(f"sequence {i} has {lengths[i]} tokens, its layout says {expected[i]}")
    L = int(lengths.max()) if pad_to is None else pad_to
    T = np.array([lay.T for lay in layouts])  # (B,)
    s_start = np.array([lay.s_start for lay in layouts])  # (B,)
    input_ids = np.zeros((len(seqs), L), dtype=np.int64)
    input_ids[np.arange(L) < lengths[:, None]] = np.fromiter(chain.from_iterable(seqs), np.int64, lengths.sum())
    t = np.arange(T.max())  # (T_max,)
    mask = t < T[:, None]  # (B, T_max)
    logit_pos = np.where(mask, s_start[:, None] - 1 + t, 0)
    targets = np.where(mask, np.take_along_axis(input_ids, np.where(mask, logit_pos + 1, 0), axis=1), 0)
    return BatchArrays(input_ids, logit_pos, targets, mask)


def gather_s(per_position: torch.Tensor, logit_pos: torch.Tensor) -> torch.Tensor:
    """(B, L, ...) values per sequence position -> (B, T_max, ...) at the positions predicting S."""
    idx = logit_pos
    for _ in range(per_position.dim() - 2):
        idx = idx.unsqueeze(-1)
    idx = idx.expand(*logit_pos.shape, *per_position.shape[2:])
    return per_position.gather(1, idx)


def token_surprisal(logits_s: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token NLL in nats, float32: -(logit[target] - logsumexp(logits)); 0 where masked.

    logits_s: (B, T, V) logits at the positions predicting S; targets, mask: (B, T).
    """
    logits_s = logits_s.float()
    nll = logits_s.logsumexp(dim=-1) - logits_s.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return nll.masked_fill(~mask, 0.0)
