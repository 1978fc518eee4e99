"""The library's docstrings and comments say what and why; how much lives in the docs (docs/results.md,
docs/benchmarks.md, docs/reference.md), where a change of default or a new measurement updates one place and no
stale figure stays behind in the code. This fails on a number of the kinds measurements take: a decimal with two
or more significant digits (0.484, 3.3, 1.017), a percentage, a decimal ratio (3.52x), a count of runs ("2 of 16"),
a time (52 ms). Defaults and formulas are written with one significant digit or as literals the code holds (beta
0.3, lr 3e-4, 2^20 tokens) and pass; the few other exceptions are listed in ALLOWED with their reason."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("pipeline", "store", "training", "tokweight")
NOT_YET = ()
"""Files other engineers were changing when this test was written (their measurements listed for the move to
docs); the lead enables them by removing them here."""
ALLOWED = {
    ("training/export/checkpoint.py", "5.24"): "a transformers version the export was checked against",
    ("tokweight/report/inspect_plots.py", "90%"): "the plot's 10-90% band, a quantile range",
}
DECIMAL = re.compile(r"(?<![\w.])(\d+)\.(\d+)(?![\w.]|\.\d)")
OTHER = re.compile(r"\d+(?:\.\d+)?%"                           # a percentage
                   r"|(?<![\w.])\d+\.\d+x\b"                   # a measured ratio (an architecture's 4x passes)
                   r"|\b\d+ of \d+\b(?! [a-z]*\s*(?:token|position|slot|symbol))"  # runs or seeds counted
                   r"|(?<![\w.^])\d+(?:\.\d+)? ?(?:ms|min)\b|(?<![\w.^])\d+(?:\.\d+)? s\b")  # a time


def significant_digits(whole: str, fraction: str) -> int:
    fraction = fraction.rstrip("0")
    return len(whole.lstrip("0")) + len(fraction) if whole.strip("0") else len(fraction.lstrip("0"))


def measured_numbers(text: str) -> list[str]:
    """The numbers in ``text`` that read as measurements."""
    found = [m.group(0) for m in DECIMAL.finditer(text) if significant_digits(m.group(1), m.group(2)) >= 2]
    return found + [m.group(0) for m in OTHER.finditer(text)]


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring (a string statement: module, class, function or attribute) and comment."""
    found = [(node.lineno, node.value.value) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]
    return found + [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
                    if t.type == tokenize.COMMENT]


def library_files() -> list[Path]:
    skipped = {p for pattern in NOT_YET for p in ROOT.glob(pattern)}
    return [p for package in LIBRARY for p in sorted((ROOT / package).rglob("*.py")) if p not in skipped]


def test_no_docstring_or_comment_in_the_library_holds_a_measured_number():
    found = []
    for path in library_files():
        where = path.relative_to(ROOT).as_posix()
        for line, text in prose(path.read_text()):
            found += [f"{where}:{line}: {n}" for n in measured_numbers(text) if (where, n) not in ALLOWED]
    assert not found, ("measured numbers in docstrings or comments; move each to the docs section it belongs to and "
                       "leave the reason and a pointer:\n" + "\n".join(found))


def test_the_allowlist_holds_only_what_is_still_there():
    stale = [key for key in ALLOWED if key[1] not in "".join(text for _, text in prose((ROOT / key[0]).read_text()))]
    assert not stale, f"ALLOWED entries no longer needed: {stale}"


@pytest.mark.parametrize("text, expected", [
    ("first token 0.484 against 0.469 at an exact MI of 0.02", ["0.484", "0.469"]),
    ("3.3-3.4 nats per token (z-free 0.19)", ["3.3", "3.4", "0.19"]),
    ("about 25% smaller than plain", ["25%"]),
    ("without it, 2 of 16 two-rank runs ended in SIGABRT", ["2 of 16"]),
    ("half of reading a shard (52 ms of ~110)", ["52 ms"]),
    ("the reader process 1.017 of the bare forward, 3.52x", ["1.017", "3.52x"]),
    ("beta 0.3 warmed over 100 steps, lr 3e-4, GPT-2's std 0.02, tolerance 1e-5", []),
    ("GELU MLP (4x), chunks of 2^26 logits, version 3 of the schema, 1 of 17 supervised tokens", []),
    ("a formula: 0.5 * (logvar_p - logvar_q), defaults 0.1 and 1.0", []),
])
def test_the_rule_tells_a_measurement_from_a_default(text, expected):
    assert measured_numbers(text) == expected
