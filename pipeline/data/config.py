"""The configurations of the commands that write a dataset: `tokweight synth` (``SynthConfig``) and `tokweight
convert` (``ConvertConfig`` and its split rules), with the names they validate against.

Imports only the standard library and name-only modules, so that the CLI builds its options from these fields
without importing numpy or pyarrow (a synthetic kind other than "permutation" reads its names and limits from
pipeline.data.synth_kinds when a config of that kind is made)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field

from tokweight.pipeline.data.errors import SampleError

# ---------------------------------------------------------------- synth

PERMUTATIONS = ("copy", "reverse", "sort", "sort-desc", "rotate-left", "rotate-right", "swap-pairs", "evens-odds")
"""The "permutation" kind's strategies, read orders of x (pipeline.data.synth.STRATEGIES writes them)."""
DEFAULT_STRATEGIES = ("copy", "reverse", "sort", "sort-desc")
"""SynthConfig's strategies unless a preset or the fields say others."""
FILLER_SYMBOL = "#"
"""The symbol of a y's shared header and trailer."""


def symbol_name(i: int) -> str:
    """Data symbol ``i``: "a".."z" for 0..25, then "s26", "s27", ..."""
    return chr(ord("a") + i) if i < 26 else f"s{i}"


@dataclass(frozen=True)
class SynthConfig:
    """Everything that determines a synthetic dataset; same config, same bytes. Presets (`tokweight synth
    --preset`) are files of the fields they change, tokweight/presets/synth/<name>.toml."""

    alphabet_size: int = 16
    """Number of data symbols x is drawn from (uniformly, with repetition)."""
    min_len: int = 12
    """Shortest x (inclusive)."""
    max_len: int = 16
    """Longest x (inclusive); lengths are uniform in [min_len, max_len]."""
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    """Names from PERMUTATIONS (or the kind's own) that y may be generated with (the latent's K values)."""
    header_len: int = 0
    """Copies of FILLER_SYMBOL before s(x) in every y; t0 moves later by this much."""
    trailer_len: int = 0
    """Copies of FILLER_SYMBOL after s(x) in every y: T grows by this much with t0 unchanged, tokens a base
    model predicts near-perfectly (a long fixed ending, as in templated answers)."""
    prior: str = "uniform"
    """p(s|x): "uniform", "x-dependent": p(s|x) ∝ 1 + alpha·[s == id(x[0]) mod K], or "weighted":
    p(s|x) ∝ weights[s], whatever x (strategies of unequal frequency)."""
    alpha: float = 3.0
    """Boost of the favoured strategy under the "x-dependent" prior (>= 0; unused otherwise)."""
    weights: tuple[float, ...] = ()
    """One weight > 0 per strategy under the "weighted" prior (empty otherwise). The base's "Bayes" figure at t0
    (log of the strategies consistent there) is a uniform prior's, above the weighted prior's surprisal."""
    n_train: int = 20_000
    """Examples in the train split."""
    n_val: int = 2_000
    """Examples in the val split."""
    n_test: int = 2_000
    """Examples in the test split."""
    shard_size: int = 2_000
    """Examples per tar shard."""
    seed: int = 0
    """Root seed (>= 0); each split draws from np.random.default_rng([seed, split id])."""
    kind: str = "permutation"
    """What the strategies differ in (pipeline.data.synth_kinds): "permutation" (read orders of x, PERMUTATIONS),
    "lexical" (x's concepts in invented languages; alphabet_size concepts, x of min_len..max_len of them),
    "format" (a record in file formats; alphabet_size names, min_len..max_len amounts) or "procedure" (numbers
    written by procedures; min_len..max_len numbers from 1..alphabet_size). Strategies are the kind's names."""

    def __post_init__(self):
        object.__setattr__(self, "strategies", tuple(self.strategies))  # a JSON list is fine too
        object.__setattr__(self, "weights", tuple(self.weights))
        if self.alphabet_size < 2:
            raise ValueError(f"alphabet_size must be >= 2, got {self.alphabet_size}")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")
        if self.kind != "permutation":
            from tokweight.pipeline.data import synth_kinds  # the kinds' own names and limits

            synth_kinds.check(self)
        elif (not self.strategies or any(s not in PERMUTATIONS for s in self.strategies)
              or len(set(self.strategies)) != len(self.strategies)):
            raise ValueError(f"strategies must be distinct names from {sorted(PERMUTATIONS)}, "
                             f"got {self.strategies}")
        if self.header_len < 0 or self.trailer_len < 0:
            raise ValueError(f"header_len and trailer_len must be >= 0, got {self.header_len}, {self.trailer_len}")
        if self.prior not in ("uniform", "x-dependent", "weighted"):
            raise ValueError(f"prior must be 'uniform', 'x-dependent' or 'weighted', got {self.prior!r}")
        wanted = len(self.strategies) if self.prior == "weighted" else 0  # one weight per strategy, or none
        if len(self.weights) != wanted or not all(w > 0 for w in self.weights):
            raise ValueError(f"weights: one weight > 0 per strategy under prior 'weighted' ({len(self.strategies)} "
                             f"strategies), none otherwise; got prior {self.prior!r}, weights {self.weights}")
        if not self.alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if min(self.n_train, self.n_val, self.n_test) < 0:
            raise ValueError("n_train, n_val and n_test must be >= 0")
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {self.shard_size}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    def split_size(self, split: str) -> int:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}[split]

    def symbols(self) -> list[str]:
        """Every data symbol that can occur in x or y: the alphabet in id order, then the filler."""
        filler = [FILLER_SYMBOL] if self.header_len or self.trailer_len else []
        if self.kind != "permutation":
            from tokweight.pipeline.data import synth_kinds

            return synth_kinds.symbols(self) + filler
        return [symbol_name(i) for i in range(self.alphabet_size)] + filler


# ---------------------------------------------------------------- convert

SAMPLE_FIELDS = ("key", "x", "y", "strategy", "t0")
"""The fields of a sample that a line or a row may hold."""
ON_BAD = ("error", "skip")
"""What convert does with a bad line: stop before writing anything, or skip and list it."""
_SPLIT_NAME = re.compile(r"[a-z0-9_-]+")


DEFAULT_FRACTION = 0.1  # val and test each, when neither a fraction nor a split field is given


def key_unit(seed: int, key: str) -> float:
    """A number in [0, 1) fixed by (seed, key) on every machine: blake2b's first 8 bytes / 2**64."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class HashSplit:
    """Splits by ``key_unit(seed, key)``: [0, val) is val, [val, val + test) test, the rest train."""

    val_fraction: float = DEFAULT_FRACTION
    """Expected share of keys in ``val`` (each key draws independently: the count is binomial)."""
    test_fraction: float = DEFAULT_FRACTION
    """Expected share of keys in ``test``; ``train`` holds the rest."""
    seed: int = 0
    """Salt of the hash: another seed, another division of the same keys."""

    def __post_init__(self):
        for name, share in (("val_fraction", self.val_fraction), ("test_fraction", self.test_fraction)):
            if not 0 <= share <= 1:
                raise ValueError(f"{name} must lie in [0, 1], got {share}")
        if self.val_fraction + self.test_fraction > 1:
            raise ValueError(f"val_fraction + test_fraction must be at most 1, got "
                             f"{self.val_fraction} + {self.test_fraction}")

    def names(self) -> list[str]:
        """The splits this rule can fill (listed in dataset.json even when a small file leaves one empty)."""
        shares = {"train": 1 - self.val_fraction - self.test_fraction, "val": self.val_fraction,
                  "test": self.test_fraction}
        return [name for name, share in shares.items() if share > 0]

    def split_of(self, key: str, record: dict) -> str:
        unit = key_unit(self.seed, key)
        if unit < self.val_fraction:
            return "val"
        return "test" if unit < self.val_fraction + self.test_fraction else "train"

    def describe(self) -> dict:
        return {"by": "key-hash", "hash": "blake2b('<seed>:<key>', 8 bytes) / 2**64", **asdict(self)}


@dataclass(frozen=True)
class FieldSplit:
    """Splits named by a field of each line, for data that carries its own split."""

    field: str
    """The field holding the split name ([a-z0-9_-]; a line without it is bad)."""

    def __post_init__(self):
        if self.field in SAMPLE_FIELDS:
            raise ValueError(f"split_field {self.field!r} is a sample field; name the field that holds the split")

    def names(self) -> list[str]:
        return []  # whatever the lines name

    def split_of(self, key: str, record: dict) -> str:
        value = record.get(self.field)
        if value is None:
            raise SampleError("missing-field", f"field {self.field!r} (the split, --split-field) is missing")
        if not isinstance(value, str) or not _SPLIT_NAME.fullmatch(value):
            raise SampleError("wrong-type", f"field {self.field!r} must name a split with [a-z0-9_-] only, "
                                            f"got {value!r}")
        return value

    def describe(self) -> dict:
        return {"by": "field", "field": self.field}


@dataclass(frozen=True)
class ConvertConfig:
    """One conversion of a JSON lines file, or Parquet files, into a dataset directory."""

    jsonl: str | None
    """The JSON lines file (or None, and ``parquet``)."""
    out: str
    """The dataset directory: ``<split>/shard-NNNNNN.tar`` and ``dataset.json``."""
    shard_size: int = 1000
    """Samples per shard."""
    on_bad: str = "error"
    """A bad line: "error" stops before anything is written and names the lines; "skip" drops and lists it."""
    val_fraction: float | None = None
    """Share of keys in ``val`` by key hash; None: 0.1 (not allowed with ``split_field``)."""
    test_fraction: float | None = None
    """Share of keys in ``test`` by key hash; None: 0.1 (not allowed with ``split_field``)."""
    seed: int = 0
    """Salt of the key hash."""
    split_field: str | None = None
    """Take each line's split from this field instead of the key hash."""
    overwrite: bool = False
    """Replace a dataset ``out`` already holds (its shards and dataset.json are deleted first)."""
    parquet: str | None = None
    """A Parquet file or a glob of them, read instead of ``jsonl``."""
    columns: dict[str, str] = field(default_factory=dict)
    """Parquet: sample field -> column ({"x": "question", "y": "answer"}); a field not given reads the column
    of its own name where there is one."""

    def __post_init__(self):
        if (self.jsonl is None) == (self.parquet is None):
            raise ValueError("convert reads one source: give either a JSON lines file (--jsonl) or Parquet "
                             "(--parquet), not both or neither")
        if self.columns and self.parquet is None:
            raise ValueError("--columns maps Parquet columns: it needs --parquet")
        if self.on_bad not in ON_BAD:
            raise ValueError(f"on_bad must be one of {ON_BAD}, got {self.on_bad!r}")
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {self.shard_size}")
        self.rule()  # validates the split options

    def rule(self) -> HashSplit | FieldSplit:
        if self.split_field is None:
            return HashSplit(*(DEFAULT_FRACTION if share is None else share
                               for share in (self.val_fraction, self.test_fraction)), seed=self.seed)
        if (self.val_fraction, self.test_fraction) != (None, None):
            raise ValueError("--split-field takes each line's split from the line: drop --val-fraction and "
                             "--test-fraction")
        return FieldSplit(self.split_field)
