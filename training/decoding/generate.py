"""`tokweight generate`: a trained CVAE's outputs for new inputs, one per latent value.

Input: JSON lines ``{"key"?: str, "x": ...}``, x a list of symbols or, for a run whose checkpoint has a
tokenizer, a string; any other field (a y, say) is ignored. Output: one JSON line per input line, in order,
``{"line": n, "key": key or null, "outputs": [y under latent value 0, .., y under value K-1]}``, each y in
x's own form: a list of symbols for a list x, the detokenized string for a string x.

The latent values are eval's: discrete, each k; continuous, the K k-means centres of the posterior means
over a split of the run's data (``data``, ``split``: test by default, as eval), computed by eval's pass and
seeded as eval seeds them, so value v here is value v of that split's eval.md and of ``tokweight encode``'s
``latent`` column. Greedy by default (what eval decodes); at a temperature > 0 each token is drawn from
softmax(logits / temperature), the draws seeded by ``seed``: the same input file and seed give the same
outputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokweight.pipeline.data.errors import SampleError
from tokweight.training.decoding.decode import Prompt, decode_ids, latent_values, picker, prompt_maker
from tokweight.training.decoding.encode import load_trained, posterior_pass
from tokweight.training.evaluation.evaluate import split_clusters
from tokweight.training.config.use import GenerateConfig


@dataclass(frozen=True)
class InputLine:
    line: int  # 1-based, in the file
    key: str | None
    x: tuple[str, ...] | str

    def where(self, path: str) -> str:
        return f"{path} line {self.line}" + (f" (key {self.key!r})" if self.key is not None else "")


X_FORM = '"x": a list of symbols or, for a run whose checkpoint has a tokenizer, a string'


def read_inputs(path: str) -> list[InputLine]:
    """Every non-blank line of ``path`` checked: a JSON object with an x of the right form (and a string key)."""
    lines = []
    for n, text in enumerate(Path(path).read_text().splitlines(), 1):
        if text.strip():
            lines.append(input_line(path, n, text))
    return lines


def input_line(path: str, n: int, text: str) -> InputLine:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} line {n}: not JSON ({e.msg}); each line is an object {{\"key\"?: ..., "
                         f"{X_FORM}}}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} line {n}: a JSON {type(record).__name__}, not an object; each line is "
                         f"{{\"key\"?: ..., {X_FORM}}}")
    key = record.get("key")
    if key is not None and not isinstance(key, str):
        raise ValueError(f"{path} line {n}: \"key\" must be a string (or left out), got {key!r}")
    where = InputLine(n, key, ()).where(path)
    if "x" not in record:
        raise ValueError(f"{where}: no \"x\"; give the input as {X_FORM}")
    x = record["x"]
    if isinstance(x, list) and all(isinstance(s, str) for s in x):
        x = tuple(x)
    elif not isinstance(x, str):
        raise ValueError(f"{where}: \"x\" is a {type(x).__name__}; give it as {X_FORM}")
    return InputLine(n, key, x)


def line_prompts(lines: list[InputLine], vocab, slots: int, block_size: int, path: str, run: str) -> list[Prompt]:
    """Each line's prompt; an x the run's vocabulary cannot encode, or too long for the context, stops naming
    its line."""
    make, out = prompt_maker(vocab, slots), []
    for line in lines:
        try:
            p = make(line.x, line.key)
        except SampleError as e:
            hint = "" if e.reason == "wrong-type" else f"; x must use the run's vocabulary ({run}/checkpoint/vocab.json)"
            raise ValueError(f"{line.where(path)}: {e.detail}{hint}") from None
        if len(p.ids) >= block_size:
            raise ValueError(f"{line.where(path)}: x makes a prompt of {len(p.ids)} tokens, and the backbone's "
                             f"context is {block_size}: shorten x")
        out.append(p)
    return out


def decode_points(model, tcfg, meta: dict, vocab, cfg: GenerateConfig):
    """(z (K, F), slot ids (K,) or None, where the latent values come from)."""
    if model.latent.kind == "discrete":
        if cfg.data is not None:
            raise ValueError("--data: a discrete run decodes at its K latent tokens; only a continuous run reads a "
                             "split (for its K centres): leave --data out")
        return *latent_values(model, None), f"the {model.latent.k} latent tokens"
    if cfg.data is None:
        raise ValueError(f"{cfg.run} has a continuous latent: generate decodes at the K k-means centres of the "
                         "posterior means over a split, as eval does; give --data DATA (and --split, default test)")
    records = posterior_pass(model, tcfg, meta, vocab, cfg.data, cfg.split, cfg.batch_size)
    if not records.rows["post"]:
        raise ValueError(f"split {cfg.split!r} of {cfg.data} has no example: no posterior means to cluster")
    centres, _ = split_clusters(np.stack(records.rows["post"]), tcfg.cvae, tcfg.optim.seed)
    return *latent_values(model, centres), (f"the {len(centres)} k-means centres of the posterior means over "
                                            f"split {cfg.split!r} of {cfg.data} ({len(records.rows['post'])} examples)")


def in_form(vocab, x, ids: list[int]):
    """y in x's form: a string x (which only a vocabulary with a tokenizer encodes) gets the detokenized text."""
    return vocab.text(ids) if isinstance(x, str) else vocab.decode(ids)


def output_lines(model, vocab, lines, prompts, z, slot_ids, cfg: GenerateConfig) -> Iterator[str]:
    """One JSON line per input line, decoded batch_size lines at a time (K rows each)."""
    pick, end, K = picker(cfg.temperature, cfg.seed), vocab.end_id, z.shape[0]
    for start in range(0, len(lines), cfg.batch_size):
        chunk = slice(start, start + cfg.batch_size)
        ids = decode_ids(model, prompts[chunk], z, slot_ids, end, cfg.max_new_tokens, pick)
        for i, line in enumerate(lines[chunk]):
            outputs = [in_form(vocab, line.x, row) for row in ids[i * K:(i + 1) * K]]
            yield json.dumps({"line": line.line, "key": line.key, "outputs": outputs})


def run(cfg: GenerateConfig) -> dict:
    lines = read_inputs(cfg.input)  # every line checked before the model is loaded
    tcfg, model, vocab, meta = load_trained(cfg.run, cfg.device, cfg.dtype)
    prompts = line_prompts(lines, vocab, model.conditioning.slots, model.backbone.cfg.block_size, cfg.input, cfg.run)
    z, slot_ids, source = decode_points(model, tcfg, meta, vocab, cfg)
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")  # renamed when complete: a failed run leaves no partial file
    with tmp.open("w") as f:
        for text in output_lines(model, vocab, lines, prompts, z, slot_ids, cfg):
            f.write(text + "\n")
    os.replace(tmp, out)
    decoding = "greedy" if cfg.temperature == 0 else f"sampling at temperature {cfg.temperature}, seed {cfg.seed}"
    return {"out": str(out), "lines": len(lines), "latent_values": int(z.shape[0]), "values_from": source,
            "decoding": decoding}
