"""Export a checkpoint as a Hugging Face GPT-2 directory with its tokenizer.

OUT holds what `transformers` loads locally, offline:
- `model.safetensors` + `config.json`: `GPT2LMHeadModel.from_pretrained(OUT)` gives the
  same logits. GPT-2 stores its projections as Conv1D, i.e. (in, out): our Linear weights
  are transposed on the way out. The output embedding is tied to `wte`, as in GPT-2.
- `tokenizer.json` + `tokenizer_config.json`: `AutoTokenizer.from_pretrained(OUT)` gives a
  fast tokenizer over the symbol vocabulary (a `tokenizers` WordLevel model split on
  whitespace) whose token ids are tokweight's own: `vocab.tokens[i]` has id i, so ids and
  embedding rows agree. The specials and latent tokens are special tokens, each one token.
- `tokweight_vocab.json` and `tokweight_fingerprint.txt`: the vocabulary and fingerprint
  of the checkpoint it came from.

Writing needs `tokenizers` (the `hf` extra), not `transformers`; both files are written
here, without `save_pretrained`, so the bytes depend on nothing but the checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.pipeline.extras import require
from tokweight.pipeline.models.gpt import GPT
from tokweight.pipeline.tokens.vocab import SPECIALS, Vocab

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
def hf_state_dict(model: GPT) -> dict:
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu()
        out[f"transformer.{name}"] = (t.T if name.endswith(_CONV1D) else t).contiguous()
    return out


def hf_config(model: GPT) -> dict:
    c = model.cfg
    ids = {name: SPECIALS.index(f"<{name}>") for name in ("pad", "bos", "eos")}  # the tokenizer's ids too
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_embd": c.d_model,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": 4 * c.d_model,
        "activation_function": "gelu",  # exact erf GELU, as F.gelu
        "layer_norm_epsilon": c.layer_norm_eps,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "tie_word_embeddings": True,
        "pad_token_id": ids["pad"], "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
    }


def special_tokens(vocab: Vocab) -> list[str]:
    """The nine specials and the latent tokens: every token that is not a data symbol."""
    return list(vocab.tokens[: len(SPECIALS) + vocab.k_max])


def build_tokenizer(vocab: Vocab):
    """A `tokenizers.Tokenizer` whose vocabulary is exactly ``vocab.tokens``, id for id.

    Ids: the WordLevel vocabulary is ``{token: i}`` over ``vocab.tokens``, and the specials
    are registered as added tokens under the ids they already have, so nothing is appended
    and the tokenizer's size is ``len(vocab)`` = the model's embedding rows.

    Unknown symbols: tokweight's vocabulary has no unknown token and ``encode_symbols``
    refuses a symbol it lacks. Adding an ``<unk>`` would need an id past the embedding, and
    reusing ``<pad>`` as unk would turn a typo into a silent pad token inside x or y. So the
    model names no unk token that is in the vocabulary (WordLevel's default ``<unk>`` is not
    in it), and encoding an unknown symbol raises, where ``encode_symbols`` raises a
    SampleError: a plain ``Exception("WordLevel error: Missing [UNK] token from the
    vocabulary")`` from the tokenizer, for a caller to turn into its own error.
    """
    require("tokenizers", "hf", "export-hf, which writes a tokenizer,")
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab.tokens)}))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # symbols never hold whitespace (Vocab checks)
    # Special: never split (matched before the whitespace split), skipped by decode(skip_special_tokens=True).
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens(vocab)])
    _check_round_trip(tok, vocab)
    return tok


def _check_round_trip(tok, vocab: Vocab) -> None:
    """Refuse a tokenizer that would not give tokweight's ids: every special and latent token
    one token, and the whitespace-joined data symbols exactly ``vocab.encode_symbols``."""
    if tok.get_vocab() != {t: i for i, t in enumerate(vocab.tokens)}:
        raise AssertionError("the tokenizer's vocabulary is not the tokweight vocabulary")
    specials = special_tokens(vocab)
    if tok.encode(" ".join(specials), add_special_tokens=False).ids != list(range(len(specials))):
        raise AssertionError("a special or latent token is not one token of its own id")
    symbols = list(vocab.symbols)
    if tok.encode(" ".join(symbols), add_special_tokens=False).ids != vocab.encode_symbols(symbols):
        # An added token matches inside a word: a symbol holding one (say "a<x>") is split.
        bad = [s for s in symbols if tok.encode(s, add_special_tokens=False).ids != [vocab.id(s)]]
        raise ValueError(f"data symbols {bad[:5]} contain a special or latent token, so the tokenizer would "
                         "split them; rename them to export a tokenizer")


def tokenizer_config(vocab: Vocab, block_size: int) -> dict:
    """What `AutoTokenizer` reads beside tokenizer.json. The class and keys are transformers 4's
    (``additional_special_tokens``); transformers 5 reads them too (measured on 5.24) and loads
    its ``TokenizersBackend``."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "additional_special_tokens": special_tokens(vocab)[3:],
        "model_max_length": block_size,
        "clean_up_tokenization_spaces": False,
    }


def export_hf(checkpoint: str | Path, out: str | Path) -> Path:
    ckpt = load_checkpoint(checkpoint)
    tok = build_tokenizer(ckpt.vocab)  # before anything is written: a missing extra leaves no half directory
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(hf_state_dict(ckpt.model), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(ckpt.model), indent=1) + "\n")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(ckpt.vocab, ckpt.model.cfg.block_size), indent=1) + "\n")
    ckpt.vocab.save(out / "tokweight_vocab.json")
    (out / "tokweight_fingerprint.txt").write_text(ckpt.fingerprint + "\n")
    return out
