"""Synthetic task kinds whose strategies differ in what is written, not in which positions are read.

``SynthConfig.kind`` picks one; "permutation" (pipeline.data.synth's own strategies, each a read order of x) is
the default. The kinds here draw their own x and write y = header + s(x) + trailer with symbols of their own:

- ``lexical``: x is a sentence of concepts ("a", "b", ... ids 0..alphabet_size-1); each strategy is an
  invented language that writes it with its own words, word order and morphology. The first quarter of the
  concepts are names, written alike in every language, and the languages come in pairs (avi and boro, cema and
  dunu, ...) that share a cognate for every fourth concept, so outputs agree on a prefix when a line starts
  with a name or a cognate: t0 varies per line. Like translating one content into K languages.
- ``format``: x is a record (a name, a day, a month, min_len..max_len amounts); each strategy is a format
  with its own field order, separators, zero padding, month names and units (cents). Several formats start
  with the name and a comma and part at the first padded digit, the month or the unit, so t0 varies per line.
  Like exporting one record to K file formats.
- ``procedure``: x is min_len..max_len numbers 1..alphabet_size in decimal; each strategy writes them by its
  own procedure: decimal, binary, roman, words, octal, hexadecimal, tallies per decimal digit, decimal read
  from the units up. Positional numerals share digits ("1..." in decimal, binary and octal), so t0 varies per
  line. Like answering with one quantity worked out K ways.

The kinds' strategies are not equally hard for a base model (copying decimal digits against converting them
to binary or words; a language that keeps x's order against one that reverses it), and the ``weighted`` prior
makes them unequally frequent as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import numpy as np

KINDS = ("permutation", "lexical", "format", "procedure")

# ---------------------------------------------------------------- lexical

LANGUAGES = ("avi", "boro", "cema", "dunu", "elko", "fari", "gosu", "hema")
_PREFIX = {name: name[:2] for name in LANGUAGES}
_PAIR_PREFIX = ("ab", "cd", "ef", "gh")  # cognates of languages 2j and 2j + 1
_ORDER = {  # word order: how the concepts of x are laid out
    "as-is": lambda x: list(x),
    "reverse": lambda x: list(x[::-1]),
    "pair-swap": lambda x: [x[i ^ 1] if (i ^ 1) < len(x) else x[i] for i in range(len(x))],  # modifier after head
    "verb-final": lambda x: list(x[:1]) + list(x[2:]) + list(x[1:2]),  # the second concept moves last
}
_LANGUAGE_RULES = {  # name -> (word order, morphology: a marker after / before each odd non-name concept, or none)
    "avi": ("as-is", None), "boro": ("reverse", "suffix"), "cema": ("pair-swap", "article"),
    "dunu": ("verb-final", "suffix"), "elko": ("as-is", "article"), "fari": ("reverse", None),
    "gosu": ("pair-swap", "suffix"), "hema": ("verb-final", None),
}


def concept_name(c: int) -> str:
    """Concept ``c`` as x writes it: "a".."z", then "s26", ... (pipeline.data.synth.symbol_name)."""
    return chr(ord("a") + c) if c < 26 else f"s{c}"


def _names(alphabet_size: int) -> int:
    """How many concepts are names (the first quarter, at least one): written alike in every language."""
    return max(1, alphabet_size // 4)


def word(language: str, c: int, alphabet_size: int) -> str:
    """Concept c in ``language``: the name itself, the pair's cognate (every fourth concept), or its own word."""
    k = LANGUAGES.index(language)
    if c < _names(alphabet_size):
        return concept_name(c)
    if c % 4 == (k // 2) % 4:
        return f"{_PAIR_PREFIX[k // 2]}{c}"
    return f"{_PREFIX[language]}{c}"


def marker(language: str) -> str:
    return f"{_PREFIX[language]}-m"


def write_in(language: str, x: tuple, alphabet_size: int) -> tuple:
    """x (concept symbols) in ``language``: its word order, its words, its marker at each odd non-name concept."""
    order, morphology = _LANGUAGE_RULES[language]
    index = {concept_name(c): c for c in range(alphabet_size)}
    out = []
    for c in _ORDER[order]([index[s] for s in x]):
        marked = morphology is not None and c >= _names(alphabet_size) and c % 2 == 1
        if marked and morphology == "article":
            out.append(marker(language))
        out.append(word(language, c, alphabet_size))
        if marked and morphology == "suffix":
            out.append(marker(language))
    return tuple(out)


def lexical_symbols(strategies, alphabet_size: int) -> list[str]:
    out = [concept_name(c) for c in range(alphabet_size)]
    for language in strategies:
        out += [word(language, c, alphabet_size) for c in range(alphabet_size)] + [marker(language)]
    return list(dict.fromkeys(out))


def lexical_inputs(rng: np.random.Generator, n: int, cfg) -> list[tuple]:
    import numpy as np  # here: pipeline.data.config reads the names and limits above without numpy

    lengths = rng.integers(cfg.min_len, cfg.max_len + 1, size=n)
    flat = rng.integers(0, cfg.alphabet_size, size=int(lengths.sum())).tolist()
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    return [tuple(concept_name(c) for c in flat[starts[i]:starts[i + 1]]) for i in range(n)]


# ---------------------------------------------------------------- format

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DIGITS = tuple(str(d) for d in range(10))
FIELD_LABELS = ("NAME", "DATE", "AMT")
_FORMATS = {  # name -> (field order, day-month or month-day, separator between fields or None, zero padding,
    #            month as a word, amounts in cents, labelled fields, separator inside a date or None)
    "csv": (("name", "date", "amounts"), "dm", ",", False, False, False, False, "-"),
    "tsv": (("name", "date", "amounts"), "dm", ",", True, False, True, False, "-"),
    "letter": (("name", "date", "amounts"), "md", ",", False, True, False, False, None),
    "ledger": (("amounts", "name", "date"), "dm", ";", False, True, True, False, None),
    "iso": (("date", "name", "amounts"), "md", ";", True, False, False, False, "-"),
    "form": (("name", "date", "amounts"), "dm", "|", True, False, False, True, "-"),
    "fixed": (("date", "amounts", "name"), "dm", None, True, False, False, False, None),
    "report": (("amounts", "date", "name"), "md", ";", True, True, True, False, None),
}
FORMATS = tuple(_FORMATS)
MAX_AMOUNT = 999


def _digits(n: int, width: int) -> list[str]:
    return list(str(n).zfill(width))


def write_record(fmt: str, x: tuple) -> tuple:
    """x (a record: name "," day digits "," month digits "," amounts separated by ",") in format ``fmt``."""
    order, date_order, sep, pad, month_word, cents, labelled, date_sep = _FORMATS[fmt]
    parts = " ".join(x).split(" , ")
    name, day, month, amounts = parts[0], int(parts[1].replace(" ", "")), int(parts[2].replace(" ", "")), \
        [int(a.replace(" ", "")) for a in parts[3:]]
    day_tokens = _digits(day, 2 if pad else 1)
    month_tokens = [MONTHS[month - 1]] if month_word else _digits(month, 2 if pad else 1)
    first, second = (day_tokens, month_tokens) if date_order == "dm" else (month_tokens, day_tokens)
    date = first + ([date_sep] if date_sep else []) + second
    amount_width = (6 if cents else 4) if pad else 1
    amount_lists = [_digits(a * 100 if cents else a, amount_width) for a in amounts]
    fields = {"name": [name], "date": date, "amounts": [t for i, a in enumerate(amount_lists)
                                                       for t in ([sep] if i and sep else []) + a]}
    out = []
    for i, field in enumerate(order):
        if i and sep:
            out.append(sep)
        if labelled:
            out.append(FIELD_LABELS[("name", "date", "amounts").index(field)])
        out += fields[field]
    return tuple(out)


def format_symbols(strategies, alphabet_size: int) -> list[str]:
    seps = [sep for f in strategies for sep in (_FORMATS[f][2], _FORMATS[f][7]) if sep]
    words = list(MONTHS) if any(_FORMATS[f][4] for f in strategies) else []
    labels = list(FIELD_LABELS) if any(_FORMATS[f][6] for f in strategies) else []
    return list(dict.fromkeys([concept_name(c) for c in range(alphabet_size)] + list(DIGITS) + [","] + seps
                              + words + labels))


def format_inputs(rng: np.random.Generator, n: int, cfg) -> list[tuple]:
    import numpy as np  # here: pipeline.data.config reads the names and limits above without numpy

    counts = rng.integers(cfg.min_len, cfg.max_len + 1, size=n)
    names = rng.integers(0, cfg.alphabet_size, size=n).tolist()
    days, months = rng.integers(1, 29, size=n).tolist(), rng.integers(1, 13, size=n).tolist()
    amounts = rng.integers(1, MAX_AMOUNT + 1, size=int(counts.sum())).tolist()
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    out = []
    for i in range(n):
        tokens = [concept_name(names[i]), ","] + list(str(days[i])) + [","] + list(str(months[i]))
        for a in amounts[starts[i]:starts[i + 1]]:
            tokens += [","] + list(str(a))
        out.append(tuple(tokens))
    return out


# ---------------------------------------------------------------- procedure

_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_ROMAN = ((1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
          (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"))
HEX = tuple("0123456789ABCDEF")
TALLY, TALLY_ZERO, TALLY_SEP = "|", "-", "+"
MAX_NUMBER = 3999  # roman numerals' range


def in_base(n: int, base: int) -> list[str]:
    out = []
    while True:
        n, r = divmod(n, base)
        out.append(HEX[r])
        if not n:
            return out[::-1]


def roman(n: int) -> list[str]:
    out = []
    for value, letters in _ROMAN:
        while n >= value:
            out += list(letters)
            n -= value
    return out


def words(n: int) -> list[str]:
    """n (1..3999) in English words, one token per word: "two hundred forty one"."""
    out = []
    if n >= 1000:
        out += [_ONES[n // 1000], "thousand"]
        n %= 1000
    if n >= 100:
        out += [_ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        out.append(_TENS[n // 10])
        n %= 10
    if n:
        out.append(_ONES[n])
    return out


def tally(n: int) -> list[str]:
    """A tally per decimal digit, most significant first: that many "|", "-" for none, "+" between digits."""
    out = []
    for i, d in enumerate(str(n)):
        out += ([TALLY_SEP] if i else []) + ([TALLY] * int(d) if d != "0" else [TALLY_ZERO])
    return out


PROCEDURES: dict[str, Callable[[int], list[str]]] = {
    "decimal": lambda n: in_base(n, 10),
    "binary": lambda n: in_base(n, 2),
    "roman": roman,
    "words": words,
    "octal": lambda n: in_base(n, 8),
    "hex": lambda n: in_base(n, 16),
    "tally": tally,
    "units-first": lambda n: in_base(n, 10)[::-1],
}


def write_numbers(procedure: str, x: tuple) -> tuple:
    """x (decimal numbers separated by ",") written by ``procedure``, still separated by ","."""
    out = []
    for i, number in enumerate(" ".join(x).split(" , ")):
        out += ([","] if i else []) + PROCEDURES[procedure](int(number.replace(" ", "")))
    return tuple(out)


def procedure_symbols(strategies, alphabet_size: int) -> list[str]:
    out = list(DIGITS) + [","]
    for p in strategies:  # every token the procedure can write for 1..alphabet_size
        out += sorted({t for n in range(1, alphabet_size + 1) for t in PROCEDURES[p](n)})
    return list(dict.fromkeys(out))


def procedure_inputs(rng: np.random.Generator, n: int, cfg) -> list[tuple]:
    import numpy as np  # here: pipeline.data.config reads the names and limits above without numpy

    counts = rng.integers(cfg.min_len, cfg.max_len + 1, size=n)
    numbers = rng.integers(1, cfg.alphabet_size + 1, size=int(counts.sum())).tolist()
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    out = []
    for i in range(n):
        tokens = []
        for j, number in enumerate(numbers[starts[i]:starts[i + 1]]):
            tokens += ([","] if j else []) + list(str(number))
        out.append(tuple(tokens))
    return out


# ---------------------------------------------------------------- the kinds


KIND_STRATEGIES = {"lexical": LANGUAGES, "format": FORMATS, "procedure": tuple(PROCEDURES)}
"""Each kind's strategies, in the order the K = 2..8 presets take them (the first K)."""
_WRITE = {"lexical": lambda s, x, cfg: write_in(s, x, cfg.alphabet_size),
          "format": lambda s, x, cfg: write_record(s, x),
          "procedure": lambda s, x, cfg: write_numbers(s, x)}
_SYMBOLS = {"lexical": lexical_symbols, "format": format_symbols, "procedure": procedure_symbols}
_INPUTS = {"lexical": lexical_inputs, "format": format_inputs, "procedure": procedure_inputs}


def check(cfg) -> None:
    """The kind's own limits on a SynthConfig (ValueError naming the field)."""
    if cfg.kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {cfg.kind!r}")
    names = KIND_STRATEGIES[cfg.kind]
    unknown = [s for s in cfg.strategies if s not in names]
    if not cfg.strategies or unknown or len(set(cfg.strategies)) != len(cfg.strategies):
        raise ValueError(f"strategies of kind {cfg.kind!r} must be distinct names from {list(names)}, "
                         f"got {cfg.strategies}")
    if cfg.kind == "procedure" and not 1 <= cfg.alphabet_size <= MAX_NUMBER:
        raise ValueError(f"alphabet_size is the largest number under kind 'procedure': 1..{MAX_NUMBER}, "
                         f"got {cfg.alphabet_size}")


def strategy_output(cfg, strategy: str, x: tuple) -> tuple:
    """What ``strategy`` writes for x (symbols) under cfg's kind."""
    return _WRITE[cfg.kind](strategy, tuple(x), cfg)


def symbols(cfg) -> list[str]:
    """Every symbol x or y can hold under cfg's kind and strategies (the filler not included)."""
    return _SYMBOLS[cfg.kind](cfg.strategies, cfg.alphabet_size)


def draw_inputs(rng: np.random.Generator, n: int, cfg) -> list[tuple]:
    """n inputs x (symbol tuples) of cfg's kind from ``rng``."""
    return _INPUTS[cfg.kind](rng, n, cfg)
