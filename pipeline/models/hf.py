"""A Hugging Face causal LM directory as a tokweight checkpoint: backbone, vocabulary (``pipeline/tokens/hf_vocab.py``),
fingerprint.

The directory is read locally and never from a hub: ``config.json`` with a ``model_type``,
weights in safetensors (pickled weights are refused, never unpickled) and the tokenizer's
files. Its format is a ``Template``: the built-in one, whose tokens (``<bos> <x> </x> <y> </y>
<eos> <z> </z>``) are looked up by name in the tokenizer's vocabulary, each exactly one token
(``tokweight_template.json`` beside the weights may rename them, e.g. ``{"<bos>": "<|endoftext|>"}``);
the tokenizer's own chat template; or a string template. Latent tokens ``<z_0> ..`` are the
tokenizer's own if it has them (a run appends what it lacks). transformers is the optional
``[hf]`` extra: imported here only, and only when such a directory is loaded.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import json
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn

from tokweight.pipeline.models.dtypes import FORWARD_DTYPES
from tokweight.pipeline.extras import require
from tokweight.pipeline.models.head import token_logits
from tokweight.pipeline.models.gpt import SharedPrefix, continues, memory_layers, suffix_positions
from tokweight.pipeline.tokens.hf_vocab import TOKENIZER_FILES, TokenizerVocab, read_template
from tokweight.pipeline.tokens.templates import RENDERING_VERSION, TEMPLATE_VERSION, TOKWEIGHT, Template
from tokweight.store.fingerprint import canonical_json

PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
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

    def key_values(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values), each (N, kv heads, P, head dim); keys already rotated (RoPE)."""
        return [(layer.keys, layer.values) for layer in self.cache.layers]

    def repeated(self, n: int) -> HFCache:
        cache = copy.copy(self.cache)
        cache.layers = [copy.copy(layer) for layer in self.cache.layers]
        if n > 1:
            cache.batch_repeat_interleave(n)  # rebinds each layer's keys and values; the originals stay
        return HFCache(cache)

    def selected(self, rows: torch.Tensor) -> HFCache:
        cache = self.repeated(1).cache
        cache.batch_select_indices(rows)  # rebinds, as batch_repeat_interleave
        return HFCache(cache)


QUERY_SITES = ("c_attn", "q_proj", "qkv_proj")
"""Names of the modules whose outputs begin with a layer's queries (``HFBackbone.query_sites``): ``q_proj`` holds
the queries alone, GPT-2's ``c_attn`` and Phi-3's ``qkv_proj`` the queries, then the keys and values."""


def add_query_offset(module: nn.Module, args, out: torch.Tensor) -> torch.Tensor | None:
    """Forward hook: the module's ``query_offset`` (B, 1, width), if set, added to the first ``width`` features of
    its output (its queries)."""
    offset = getattr(module, "query_offset", None)
    if offset is None:
        return None
    offset, width = offset.to(out.dtype), offset.shape[-1]
    return out + offset if out.shape[-1] == width else torch.cat([out[..., :width] + offset, out[..., width:]], -1)


class _OffsetsAsSaved:
    """Each module's ``query_offset`` as saved while inside, and as it was again on leaving. Entered once per
    recompute, so as often as a backward reaches the layer (``autograd.grad(..., retain_graph=True)`` and then
    ``backward``: twice), which a generator's one-shot context could not be."""

    def __init__(self, saved: list[tuple[nn.Module, torch.Tensor | None]]):
        self.saved, self.found = saved, []

    def __enter__(self) -> None:
        self.found.append([site.query_offset for site, _ in self.saved])
        for site, offset in self.saved:
            site.query_offset = offset

    def __exit__(self, *exc) -> None:
        for (site, _), offset in zip(self.saved, self.found.pop()):
            site.query_offset = offset


class HFBackbone(nn.Module):
    """An ``AutoModelForCausalLM`` behind the built-in GPT's interface: ``hidden``, ``extend`` (decoding's
    growing cache), ``head``, ``forward`` -> (logits, hidden), ``embed`` and ``wte`` (the input embedding)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.checkpointing = False  # gradient checkpointing (``enable_checkpointing``)
        self._query_hooked: list[nn.Module] = []  # the query projections ``_queries`` offsets
        forward = inspect.signature(model.base_model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in forward else "past_key_values"  # renamed in a transformers 5 release
        c = model.config
        self.cfg = BackboneSpec(vocab_size=model.get_input_embeddings().num_embeddings,
                                block_size=int(getattr(c, "max_position_embeddings", None) or c.n_positions),
                                d_model=int(c.hidden_size), model_type=c.model_type)

    @property
    def wte(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def enable_checkpointing(self) -> None:
        """transformers' gradient checkpointing. It runs its layers without a key/value cache in training, so
        the CVAE gives up the shared x prefix (``prefix_shareable``) and runs its K + 1 passes whole. Each
        layer's recompute in the backward sees the query offsets its forward saw (``_offsets_as_in_forward``)."""
        kwargs = {"use_reentrant": False, "context_fn": self._offsets_as_in_forward}
        enable = getattr(self.model, "activation_checkpointing_enable", None)  # its name from transformers 5.x on
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        self.checkpointing = True

    def _offsets_as_in_forward(self):
        """torch.utils.checkpoint's ``context_fn``, called as a layer's forward runs: the forward runs as is, and
        its recompute in the backward (after ``_queries`` has cleared the offsets) under the offsets set now."""
        saved = [(site, site.query_offset) for site in self._query_hooked]
        return nullcontext(), _OffsetsAsSaved(saved)

    @property
    def prefix_shareable(self) -> bool:
        return not self.checkpointing

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return self.wte(idx)

    @property
    def memory_shape(self) -> tuple[int, int, int]:
        """(layers, key/value heads, head dim) of a ``memory``, from the config: GQA's num_key_value_heads
        and an explicit head_dim where the architecture has them."""
        c = self.model.config.get_text_config(decoder=True)
        heads = c.num_attention_heads
        return (c.num_hidden_layers, getattr(c, "num_key_value_heads", None) or heads,
                getattr(c, "head_dim", None) or c.hidden_size // heads)

    @property
    def query_shape(self) -> tuple[int, int, int]:
        """(layers, query heads, head dim) of the query pathway's offsets (GQA: more query heads than key/value
        heads)."""
        layers, _, head_dim = self.memory_shape
        return layers, self.model.config.get_text_config(decoder=True).num_attention_heads, head_dim

    def query_sites(self) -> list[nn.Module]:
        """Per layer the module whose output begins with that layer's queries, before any RoPE: a ``q_proj``, or
        a fused projection whose first third is the queries (GPT-2's ``c_attn``, Phi-3's ``qkv_proj``). Refused,
        naming the architecture, where there is no such module per layer."""
        sites = [m for name, m in self.model.named_modules() if name.rsplit(".", 1)[-1] in QUERY_SITES]
        if len(sites) != self.query_shape[0]:
            raise ValueError(f"the query z pathway finds no query projection per layer in the {self.cfg.model_type!r} "
                             f"backbone (modules named {list(QUERY_SITES)}): train it with --cond prefix")
        return sites

    @contextmanager
    def _queries(self, query: torch.Tensor | None):
        """The query pathway's offsets (B, layers, heads, head dim) added, while the block runs, to each layer's
        query projection by a forward hook (``add_query_offset``, registered once per module; the offset rides on
        the module, so a copy of the backbone reads its own). With RoPE the offset is rotated with the query, so
        it prefers keys at a relative position where the built-in backbone's prefers absolute ones. transformers'
        gradient checkpointing reruns the layers in the backward, outside this block, under the offsets that each
        layer's forward saw (``_offsets_as_in_forward``)."""
        if query is None:
            yield
            return
        sites = self.query_sites()
        for layer, site in enumerate(sites):
            if not getattr(site, "query_hooked", False):
                site.register_forward_hook(add_query_offset)
                site.query_hooked = True
            site.query_offset = query[:, layer].reshape(len(query), 1, -1)  # (B, 1, heads * head dim)
        self._query_hooked = sites
        try:
            yield
        finally:
            for site in sites:
                site.query_offset = None

    def hidden(self, idx: torch.Tensor, *, tok_emb: torch.Tensor | None = None,
               ln_cond: torch.Tensor | None = None, prefix: SharedPrefix | None = None,
               memory: torch.Tensor | None = None, query: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L) ids (or their (B, L, d) embeddings ``tok_emb``) -> (B, L, d) final hidden states.
        Right-padded batches need no attention mask: attention is causal, padding comes last. With a
        ``prefix`` (``self.prefix``), the L tokens continue it: its cache, a mask of the prefix positions
        each row sees, and positions from the row's prefix length. With a ``memory`` (``GPT.hidden``),
        they continue a cache holding its one position per layer (``memory_cache``), positions from 0.
        With a ``query`` (``GPT.hidden``), each layer's queries are offset (``_queries``).

        Whole sequences run with a cache that keeps nothing (``passing_cache``) and no attention mask: without a
        cache, transformers' mask preparation reads the position ids back from the device to look for packed
        sequences (a host sync; with gradient checkpointing, which drops the cache in training, it still does); a
        cache that kept the keys and values would copy them every layer, and in a forward without a graph hold them
        all to its end."""
        if prefix is not None or memory is not None:
            return self.extend(idx, tok_emb=tok_emb, ln_cond=ln_cond, prefix=prefix, memory=memory, query=query)[0]
        self._check(idx, ln_cond)
        inputs = {"inputs_embeds": tok_emb} if tok_emb is not None else {"input_ids": idx}
        if not self.checkpointing:
            inputs[self.cache_kwarg] = passing_cache(self.model.config)
        with self._queries(query):
            return self.model.base_model(**inputs, use_cache=not self.checkpointing).last_hidden_state

    def extend(self, idx: torch.Tensor, *, tok_emb: torch.Tensor | None = None, ln_cond: torch.Tensor | None = None,
               prefix: SharedPrefix | None = None, memory: torch.Tensor | None = None,
               query: torch.Tensor | None = None) -> tuple[torch.Tensor, SharedPrefix]:
        """``hidden``'s (B, L, d) states, and the prefix a next token continues (``GPT.extend``): a
        ``DynamicCache`` of what idx continued (a copy of ``prefix``'s, a ``memory``'s one position, or an empty
        one), which the forward grows by idx's own L, with the mask of the positions each row sees."""
        self._check(idx, ln_cond)
        B, L = idx.shape
        before = continues(prefix, memory, B, idx.device)
        cache = self._cache(before, memory)
        inputs = {"inputs_embeds": tok_emb} if tok_emb is not None else {"input_ids": idx}
        inputs[self.cache_kwarg] = cache
        own = torch.ones(B, L, dtype=torch.long, device=idx.device)
        with self._queries(query):
            hidden = self.model.base_model(**inputs, use_cache=True,
                                           attention_mask=torch.cat([before.valid.long(), own], 1),
                                           position_ids=suffix_positions(before, L, self.cfg.block_size, idx.device)
                                           ).last_hidden_state
        return hidden, before.continued(HFCache(cache), L)

    def _check(self, idx: torch.Tensor, ln_cond: torch.Tensor | None) -> None:
        if ln_cond is not None:
            raise ValueError(f"the layernorm z pathway is not available on a {self.cfg.model_type!r} Hugging Face "
                             "backbone; use --cond token, prefix or memory")
        if idx.shape[1] > self.cfg.block_size:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds the model's context of {self.cfg.block_size}")

    def _cache(self, before: SharedPrefix, memory: torch.Tensor | None):
        """The cache a forward continues and grows in place: a copy of a prefix's (which stays as it was), a new
        one holding a memory's position, or an empty one."""
        if memory is not None:
            return self.memory_cache(memory)
        if before.cache is not None:
            return before.cache.repeated(1).cache
        return _transformers().DynamicCache(config=self.model.config)

    def memory_cache(self, memory: torch.Tensor):
        """A ``DynamicCache`` pre-filled with the memory's one key/value position per layer (its layers typed by the
        config, so a sliding-window layer stays one). transformers' gradient checkpointing drops a training pass's
        cache, and the memory with it: refused."""
        if self.checkpointing:
            raise ValueError("the memory z pathway passes z through the key/value cache, which transformers' gradient "
                             "checkpointing drops: train without --grad-checkpointing, or use --cond token or prefix")
        return _transformers().DynamicCache(memory_layers(memory), config=self.model.config)

    def prefix(self, idx: torch.Tensor, lengths: torch.Tensor) -> SharedPrefix:
        """The model's key/value cache of prefixes idx (B, P), row i's own being its first lengths[i] tokens."""
        cache = self.model.base_model(input_ids=idx, use_cache=True)[1]  # (hidden, cache): its name varies
        return SharedPrefix.of(HFCache(cache), lengths, idx.shape[1])

    def head(self, hidden: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """(..., d) -> (..., V) logits, or (..., len(ids)) those of the tokens ``ids`` only."""
        return token_logits(self.model.get_output_embeddings(), hidden, ids)

    def forward(self, idx: torch.Tensor, *, tok_emb: torch.Tensor | None = None, ln_cond: torch.Tensor | None = None,
                prefix: SharedPrefix | None = None, memory: torch.Tensor | None = None,
                query: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.hidden(idx, tok_emb=tok_emb, ln_cond=ln_cond, prefix=prefix, memory=memory, query=query)
        return self.head(hidden), hidden

    def grow_vocab(self, n: int) -> None:
        """Append ``n`` token rows to the input embedding and an untied output one (and its bias), each the
        mean of the rows there were: new tokens that start where the average token is, drawn from nothing."""
        V, out = self.cfg.vocab_size, self.model.get_output_embeddings()
        old = [(name, t.detach().mean(0)) for name, t in (("in", self.wte.weight), ("out", out.weight),
                                                         ("bias", out.bias)) if t is not None]
        self.model.resize_token_embeddings(V + n, mean_resizing=False)
        out = self.model.get_output_embeddings()
        rows = {"in": self.wte.weight, "out": out.weight, "bias": out.bias}
        with torch.no_grad():
            for name, mean in old:
                rows[name][V:] = mean
        self.cfg = replace(self.cfg, vocab_size=V + n)


def passing_cache(config):
    """An empty ``DynamicCache`` that hands each layer's keys and values back without keeping them: to
    transformers a cache (so it sizes its masks from it and reads no position ids back), to the memory nothing."""
    return _passing_cache_class()(config=config)


@functools.cache
def _passing_cache_class():
    class PassingCache(_transformers().DynamicCache):
        def update(self, key_states, value_states, *args, **kwargs):
            return key_states, value_states

    return PassingCache


# ---------------------------------------------------------------- loading


def _transformers():
    return require("transformers", "hf", "a Hugging Face checkpoint")


def hf_fingerprint(path: Path, renames: dict[str, str], template: Template = TOKWEIGHT) -> str:
    """Config, every weight file's bytes (so every tensor), the tokenizer's files and the template (the
    built-in one's renames; another's description and ``RENDERING_VERSION``, which the built-in one leaves out
    so that a checkpoint extracted before templates were recorded keeps its fingerprint)."""
    own = {} if template.builtin else {"format": template.to_json(), "rendering": RENDERING_VERSION}
    header = canonical_json({"kind": "huggingface", "template_version": TEMPLATE_VERSION, "template": renames,
                             "config": json.loads((path / "config.json").read_text()), **own})
    files = [f for f in [*weight_files(path), *(path / name for name in TOKENIZER_FILES)] if f.is_file()]
    return _hashed(header, tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))


@functools.lru_cache(maxsize=16)
def _hashed(header: bytes, files: tuple[tuple[str, int, int], ...]) -> str:
    """sha256 over ``header`` and every file's name, size and bytes. Memoised on the files' sizes and modification
    times: finding a store's template and loading the checkpoint both ask, and a weight file is gigabytes."""
    h = hashlib.sha256(header)
    for name, size, _ in files:
        h.update(canonical_json({"file": Path(name).name, "size": size}))
        with open(name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return "hf-" + h.hexdigest()[:29]


def load_hf(path: str | Path, *, device: str | torch.device = "cpu", dtype: str = "float32",
            template: Template = TOKWEIGHT, weights: bool = True):
    """(HFBackbone in eval mode, TokenizerVocab, fingerprint) of a local HF directory in ``template``; no hub access.
    ``weights`` False: the model's shape alone, on the meta device, and no fingerprint (no weight file read)."""
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
    renames = read_template(path)
    vocab = TokenizerVocab(tf.AutoTokenizer.from_pretrained(path, local_files_only=True), renames, path, template)
    if not weights:
        with torch.device("meta"):
            model = tf.AutoModelForCausalLM.from_config(tf.AutoConfig.from_pretrained(path, local_files_only=True),
                                                        dtype=DTYPES[dtype])
        return HFBackbone(model).eval(), vocab, None
    model = tf.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, use_safetensors=True,
                                                    dtype=DTYPES[dtype])
    return HFBackbone(model).to(device).eval(), vocab, hf_fingerprint(path, renames, template)
