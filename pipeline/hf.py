"""A Hugging Face causal LM directory as a tokweight checkpoint: backbone, vocabulary, fingerprint.

The directory is read locally and never from a hub: ``config.json`` with a ``model_type``,
weights in safetensors (pickled weights are refused, never unpickled) and the tokenizer's
files. The template's tokens (``<bos> <x> </x> <y> </y> <eos> <z> </z>`` and the latent
tokens ``<z_0> ..``) are looked up by name in the tokenizer's vocabulary, each exactly
one token; ``tokweight_template.json`` beside the weights may rename them, e.g.
``{"<bos>": "<|endoftext|>"}``. transformers is the optional ``[hf]`` extra: imported
here only, and only when such a directory is loaded.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from tokweight.pipeline.dtypes import FORWARD_DTYPES
from tokweight.pipeline.errors import SampleError
from tokweight.pipeline.model import SharedPrefix, suffix_positions
from tokweight.pipeline.templates import TEMPLATE_VERSION
from tokweight.pipeline.vocab import SPECIALS, latent_token
from tokweight.store.fingerprint import canonical_json

TEMPLATE_FILE = "tokweight_template.json"
TEMPLATE_TOKENS = tuple(t for t in SPECIALS if t != "<pad>")  # <pad> only fills, it is never read
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", TEMPLATE_FILE)
POST_HEAD_LOGIT_FIELDS = ("final_logit_softcapping", "logit_scale")  # logits that are not lm_head(hidden)
DTYPES = {name: getattr(torch, name) for name in FORWARD_DTYPES}


def is_hf_checkpoint(path: str | Path) -> bool:
    """A directory whose config.json names a transformers ``model_type``."""
    config = Path(path) / "config.json"
    return config.is_file() and "model_type" in json.loads(config.read_text())


def weight_files(path: Path) -> list[Path]:
    """The safetensors weight files; a directory with pickled weights only is refused."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickled = sorted({p.name for pattern in PICKLED_WEIGHTS for p in path.glob(pattern)})
        what = f"only pickled weights ({', '.join(pickled)})" if pickled else "no *.safetensors weights"
        raise ValueError(f"{path}: {what}; tokweight never unpickles: save the model with "
                         "save_pretrained(..., safe_serialization=True)")
    return files


def read_template(path: Path) -> dict[str, str]:
    """tokweight_template.json's renames {template token: the tokenizer's token}; {} if absent."""
    file = path / TEMPLATE_FILE
    if not file.is_file():
        return {}
    renames = json.loads(file.read_text())
    is_template = lambda name: name in TEMPLATE_TOKENS or re.fullmatch(r"<z_\d+>", name)
    unknown = sorted(n for n in renames if not is_template(n)) if isinstance(renames, dict) else ["(not an object)"]
    if unknown:
        raise ValueError(f"{file}: keys {unknown} are not template tokens; rename any of {list(TEMPLATE_TOKENS)} "
                         "or <z_k>")
    return renames


# ---------------------------------------------------------------- vocabulary


class TokenizerVocab:
    """The ``Vocab`` interface over a tokenizer: template tokens by (renamed) name, data as
    symbol lists (one token each) or as strings (encoded with no special tokens added)."""

    def __init__(self, tokenizer, renames: dict[str, str], source: Path):
        self.tokenizer, self.renames, self.source = tokenizer, renames, source
        self._index = tokenizer.get_vocab()  # token string -> id, added tokens included
        self._template = {name: self._one_token(name) for name in TEMPLATE_TOKENS}
        self._latent = []
        while self._token_name(latent_token(len(self._latent))) in self._index:
            self._latent.append(self._one_token(latent_token(len(self._latent))))
        self._reserved = set(self._template.values()) | set(self._latent)
        self._tokens = tuple(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))  # id order, once

    def _token_name(self, name: str) -> str:
        return self.renames.get(name, name)

    def _one_token(self, name: str) -> int:
        token = self._token_name(name)
        if token not in self._index:
            pieces = self.tokenizer.tokenize(token)
            raise ValueError(f"{self.source}: template token {name!r} ({token!r}) is not one token of the tokenizer "
                             f"(it splits into {pieces}); add it as a special token, or rename it in {TEMPLATE_FILE}")
        return self._index[token]

    @property
    def k_max(self) -> int:
        return len(self._latent)

    @property
    def tokens(self) -> tuple[str, ...]:
        return self._tokens

    def __len__(self) -> int:
        return len(self.tokenizer)

    def id(self, token: str) -> int:
        return self._template[token]

    def latent_id(self, k: int) -> int:
        if not 0 <= k < self.k_max:
            raise ValueError(f"latent index {k} outside the tokenizer's {self.k_max} latent tokens <z_0>.. of "
                             f"{self.source}: add tokens <z_0>..<z_{k}> to it (or rename them in {TEMPLATE_FILE})")
        return self._latent[k]

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return self.id("<eos>") if pad is None else pad  # padding is masked: any id does

    def encode_symbols(self, symbols: Sequence[str] | str, *, key: str | None = None,
                       field_name: str = "") -> list[int]:
        """A string through the tokenizer; a list one token per symbol. Template tokens are refused in data."""
        if isinstance(symbols, str):
            try:
                ids = self.tokenizer(symbols, add_special_tokens=False)["input_ids"]
            except Exception as e:  # the tokenizers library raises plain Exceptions (e.g. no unk token)
                raise SampleError("unknown-symbol", f"the tokenizer cannot encode {field_name!r}: {e}", key=key) from None
        else:
            missing = [s for s in symbols if s not in self._index]
            if missing:
                raise SampleError("unknown-symbol", f"unknown symbol {missing[0]!r} in {field_name!r} (not one "
                                  "token of the tokenizer)", key=key)
            ids = [self._index[s] for s in symbols]
        clash = [i for i in ids if i in self._reserved]
        if clash:
            raise SampleError("template-token", f"{field_name!r} holds the template token "
                              f"{self.tokenizer.convert_ids_to_tokens(clash[0])!r}", key=key)
        return ids

    def decode(self, ids: Sequence[int]) -> list[str]:
        return self.tokenizer.convert_ids_to_tokens(list(ids))

    def to_json(self) -> dict:
        return {"tokenizer": str(self.source), "template": {t: self._token_name(t) for t in TEMPLATE_TOKENS},
                "k_max": self.k_max, "tokens": list(self.tokens)}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


# ---------------------------------------------------------------- backbone


@dataclass(frozen=True)
class BackboneSpec:
    """What the CVAE and the templates read off a backbone, whatever implements it."""

    vocab_size: int
    block_size: int
    d_model: int
    n_layernorms: int = 0  # norms the layernorm z pathway modulates; 0: that pathway is refused
    model_type: str = ""

    def to_json(self) -> dict:
        return asdict(self)


class HFCache:
    """A transformers cache behind ``KVCache``'s interface. The model appends a suffix's keys to the
    cache it is given, in place, so each use gets a copy (its layers' tensors are shared, not copied)."""

    def __init__(self, cache):
        self.cache = cache

    def repeated(self, n: int) -> HFCache:
        cache = copy.copy(self.cache)
        cache.layers = [copy.copy(layer) for layer in self.cache.layers]
        if n > 1:
            cache.batch_repeat_interleave(n)  # rebinds each layer's keys and values; the originals stay
        return HFCache(cache)


class HFBackbone(nn.Module):
    """An ``AutoModelForCausalLM`` behind the built-in GPT's interface: ``hidden``, ``head``,
    ``forward`` -> (logits, hidden), ``embed`` and ``wte`` (the input embedding)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        forward = inspect.signature(model.base_model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in forward else "past_key_values"  # renamed in transformers 5.2x
        c = model.config
        self.cfg = BackboneSpec(vocab_size=model.get_input_embeddings().num_embeddings,
                                block_size=int(getattr(c, "max_position_embeddings", None) or c.n_positions),
                                d_model=int(c.hidden_size), model_type=c.model_type)

    @property
    def wte(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return self.wte(idx)

    def hidden(self, idx: torch.Tensor, *, tok_emb: torch.Tensor | None = None,
               ln_cond: torch.Tensor | None = None, prefix: SharedPrefix | None = None) -> torch.Tensor:
        """(B, L) ids (or their (B, L, d) embeddings ``tok_emb``) -> (B, L, d) final hidden states.
        Right-padded batches need no attention mask: attention is causal, padding comes last. With a
        ``prefix`` (``self.prefix``), the L tokens continue it: its cache, a mask of the prefix positions
        each row sees, and positions from the row's prefix length."""
        if ln_cond is not None:
            raise ValueError(f"the layernorm z pathway is not available on a {self.cfg.model_type!r} Hugging Face "
                             "backbone; use --cond token or --cond prefix")
        B, L = idx.shape
        if L > self.cfg.block_size:
            raise ValueError(f"sequence length {L} exceeds the model's context of {self.cfg.block_size}")
        inputs = {"inputs_embeds": tok_emb} if tok_emb is not None else {"input_ids": idx}
        if prefix is None:
            return self.model.base_model(**inputs, use_cache=False).last_hidden_state
        own = torch.ones(B, L, dtype=torch.long, device=idx.device)
        inputs[self.cache_kwarg] = prefix.cache.repeated(1).cache
        return self.model.base_model(**inputs, use_cache=True, attention_mask=torch.cat([prefix.valid.long(), own], 1),
                                     position_ids=suffix_positions(prefix, L, self.cfg.block_size, idx.device),
                                     ).last_hidden_state

    def prefix(self, idx: torch.Tensor, lengths: torch.Tensor) -> SharedPrefix:
        """The model's key/value cache of prefixes idx (B, P), row i's own being its first lengths[i] tokens."""
        cache = self.model.base_model(input_ids=idx, use_cache=True)[1]  # (hidden, cache): its name varies
        return SharedPrefix.of(HFCache(cache), lengths, idx.shape[1])

    def head(self, hidden: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """(..., d) -> (..., V) logits, or (..., len(ids)) those of the tokens ``ids`` only."""
        out = self.model.get_output_embeddings()
        if ids is None:
            return out(hidden)
        return F.linear(hidden, out.weight[ids], None if out.bias is None else out.bias[ids])

    def forward(self, idx: torch.Tensor, *, tok_emb: torch.Tensor | None = None, ln_cond: torch.Tensor | None = None,
                prefix: SharedPrefix | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.hidden(idx, tok_emb=tok_emb, ln_cond=ln_cond, prefix=prefix)
        return self.head(hidden), hidden


# ---------------------------------------------------------------- loading


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("a Hugging Face checkpoint needs transformers: pip install 'tokweight[hf]'") from None
    return transformers


def hf_fingerprint(path: Path, renames: dict[str, str]) -> str:
    """Config, every weight file's bytes (so every tensor), the tokenizer's files and the template."""
    h = hashlib.sha256()
    h.update(canonical_json({"kind": "huggingface", "template_version": TEMPLATE_VERSION, "template": renames,
                             "config": json.loads((path / "config.json").read_text())}))
    for file in [*weight_files(path), *(path / name for name in TOKENIZER_FILES)]:
        if file.is_file():
            h.update(canonical_json({"file": file.name, "size": file.stat().st_size}))
            with file.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return "hf-" + h.hexdigest()[:29]


def load_hf(path: str | Path, *, device: str | torch.device = "cpu", dtype: str = "float32"):
    """(HFBackbone in eval mode, TokenizerVocab, fingerprint) of a local HF directory; no hub access."""
    path = Path(path)
    weight_files(path)
    config = json.loads((path / "config.json").read_text())
    post_head = [f for f in POST_HEAD_LOGIT_FIELDS if config.get(f) not in (None, 1, 1.0)]
    if post_head:
        raise ValueError(f"{path / 'config.json'}: {post_head} transform the logits after the output head; "
                         f"{config['model_type']!r} models are not supported")
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(f"{path}: no tokenizer files (tokenizer.json or tokenizer_config.json); save the "
                                "tokenizer with save_pretrained into the model directory")
    tf = _transformers()
    model = tf.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, use_safetensors=True,
                                                    dtype=DTYPES[dtype])
    tokenizer = tf.AutoTokenizer.from_pretrained(path, local_files_only=True)
    renames = read_template(path)
    return HFBackbone(model).to(device).eval(), TokenizerVocab(tokenizer, renames, path), hf_fingerprint(path, renames)
