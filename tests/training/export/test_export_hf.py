"""`tokweight export-hf`: the directory transformers loads, tokenizer included, round trips.

The tokenizer's ids are tokweight's ids (so the embedding rows agree), a whitespace-joined
string of symbols encodes like ``Vocab.encode_symbols``, every special and latent token is
one token, GPT-2 gives the native logits on tokenized templates, and exports are
byte-identical. All on the session's tiny checkpoint, offline.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.pipeline.tokens.templates import template_ids
from tokweight.pipeline.tokens.vocab import SPECIALS, Vocab, latent_token
from tokweight.training.export.checkpoint import build_tokenizer, export_hf
from tokweight.training.loop.train_base import load_split


def zfree(vocab, x, y, **kw) -> list[int]:
    """The z-free template's ids."""
    return template_ids(vocab, x, y, **kw)[0]


def zcond(vocab, x, y, slot_ids, **kw) -> list[int]:
    """The z-conditioned template's ids, ``slot_ids`` in its latent slots."""
    return template_ids(vocab, x, y, slot_ids, **kw)[0]

pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[3]
FILES = {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
         "tokweight_vocab.json", "tokweight_fingerprint.txt"}


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    """(checkpoint, export directory) for the tiny base model."""
    _, ckpt = tiny
    return ckpt, export_hf(ckpt, tmp_path_factory.mktemp("hf") / "out")


@pytest.fixture(scope="module")
def val_samples(tiny):
    return load_split(tiny[0], "val")


@pytest.fixture(scope="module")
def hf_tokenizer(exported):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(exported[1], local_files_only=True)


def test_out_holds_model_tokenizer_and_provenance(exported):
    ckpt, out = exported
    assert {p.name for p in out.iterdir()} == FILES
    native = load_checkpoint(ckpt)
    assert Vocab.load(out / "tokweight_vocab.json") == native.vocab
    assert (out / "tokweight_fingerprint.txt").read_text().strip() == native.fingerprint


def test_autotokenizer_vocabulary_is_tokweight_id_for_id(exported, hf_tokenizer):
    ckpt, out = exported
    vocab = load_checkpoint(ckpt).vocab
    config = json.loads((out / "config.json").read_text())
    assert hf_tokenizer.get_vocab() == {t: i for i, t in enumerate(vocab.tokens)}
    assert len(hf_tokenizer) == len(vocab) == config["vocab_size"]
    assert hf_tokenizer.convert_ids_to_tokens(list(range(len(vocab)))) == list(vocab.tokens)
    for name in ("pad", "bos", "eos"):
        assert getattr(hf_tokenizer, f"{name}_token") == f"<{name}>"
        assert getattr(hf_tokenizer, f"{name}_token_id") == config[f"{name}_token_id"] == vocab.id(f"<{name}>")
    assert hf_tokenizer.unk_token is None  # no unknown token: see build_tokenizer


def test_symbols_as_a_string_encode_like_encode_symbols(exported, hf_tokenizer, val_samples):
    vocab = load_checkpoint(exported[0]).vocab
    rng = np.random.default_rng(0)
    sequences = [list(vocab.symbols)] + [list(rng.choice(vocab.symbols, size=int(rng.integers(1, 20))))
                                         for _ in range(50)]
    sequences += [list(s.y) for s in val_samples[:50]]
    for symbols in sequences:
        ids = hf_tokenizer(" ".join(symbols), add_special_tokens=False).input_ids
        assert ids == vocab.encode_symbols(symbols)
        assert hf_tokenizer.decode(ids) == " ".join(symbols)
    # any whitespace separates symbols, as the pre-tokenizer splits on it
    assert hf_tokenizer(" \t".join(vocab.symbols[:3]) + "\n", add_special_tokens=False).input_ids == \
        vocab.encode_symbols(vocab.symbols[:3])


def test_every_special_and_latent_token_is_one_token(exported, hf_tokenizer, val_samples):
    vocab = load_checkpoint(exported[0]).vocab
    specials = list(SPECIALS) + [latent_token(k) for k in range(vocab.k_max)]
    assert set(hf_tokenizer.all_special_tokens) == set(specials)
    for t in specials:
        assert hf_tokenizer.tokenize(t) == [t]
        assert hf_tokenizer(t, add_special_tokens=False).input_ids == [vocab.id(t)]
        assert hf_tokenizer(f"{vocab.symbols[0]}{t}{vocab.symbols[1]}", add_special_tokens=False).input_ids == \
            [vocab.id(vocab.symbols[0]), vocab.id(t), vocab.id(vocab.symbols[1])]  # never split, even unspaced
    # whole templates written out as text come back as the template's ids
    for s in val_samples[:20]:
        for ids in (zfree(vocab, s.x, s.y), zcond(vocab, s.x, s.y, [vocab.latent_id(vocab.k_max - 1)] * 2)):
            text = " ".join(vocab.decode(ids))
            assert hf_tokenizer(text, add_special_tokens=False).input_ids == ids
            assert hf_tokenizer.decode(ids, skip_special_tokens=True) == " ".join((*s.x, *s.y))


def test_an_unknown_symbol_is_refused_not_mapped(hf_tokenizer):
    with pytest.raises(Exception, match="UNK"):
        hf_tokenizer("not-a-symbol", add_special_tokens=False)


def test_gpt2_logits_on_tokenized_templates_equal_the_native_model(exported, hf_tokenizer, val_samples):
    transformers = pytest.importorskip("transformers")
    ckpt, out = exported
    native = load_checkpoint(ckpt)
    hf = transformers.GPT2LMHeadModel.from_pretrained(out, local_files_only=True).eval()
    for s in val_samples[:16]:
        ids = zfree(native.vocab, s.x, s.y)
        text = " ".join(native.vocab.decode(ids))
        idx = torch.tensor([hf_tokenizer(text, add_special_tokens=False).input_ids])
        assert idx[0].tolist() == ids
        with torch.no_grad():
            ours, _ = native.model(idx)
            theirs = hf(idx).logits
        assert (ours - theirs).abs().max().item() <= 1e-5


def test_export_is_deterministic(exported, tmp_path):
    ckpt, first = exported
    second = export_hf(ckpt, tmp_path / "again")
    for name in FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    # a fresh process (its own hash seeds) writes the same tokenizer.json
    code = "import sys; from tokweight.training.export.checkpoint import export_hf; export_hf(sys.argv[1], sys.argv[2])"
    subprocess.run([sys.executable, "-c", code, str(ckpt), str(tmp_path / "fresh")], cwd=ROOT, check=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (first / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), name


def test_a_symbol_holding_a_special_token_is_refused():
    with pytest.raises(ValueError, match=re.escape("['a<x>']")):
        build_tokenizer(Vocab(("a", "a<x>", "b"), k_max=2))


def test_missing_tokenizers_names_the_extra(exported, tmp_path, monkeypatch):
    from tokweight.cli import main

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` raises ImportError
    with pytest.raises(ImportError, match=re.escape("pip install 'tokweight[hf]'")) as err:
        export_hf(exported[0], tmp_path / "lib")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "lib").exists()
    result = CliRunner().invoke(main, ["export-hf", str(exported[0]), str(tmp_path / "cli")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: {err.value}"]
