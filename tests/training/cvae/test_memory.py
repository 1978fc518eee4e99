"""The memory z pathway (``training/cvae/conditioning.py``): z as one key/value position per layer.

Each backbone's memory forward equals attention written out by hand over [memory, causal keys] (float64,
to 1e-5): the built-in GPT; GPT-2 through transformers' cache, with the GPT's weights (``export_hf``), so
against the GPT's reference; a Llama with GQA and RoPE, against its layers run by hand. z then reaches
every position, before its slot too; a gradient reaches the projection; the CLI trains, reloads and
evaluates such a run.
"""

import math

import pytest
import torch
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.models.hf import HFBackbone
from tokweight.pipeline.models.gpt import GPT, ModelConfig
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.tokens.vocab import Vocab
from tests.support.fixtures_hf import tiny_hf_model
from tokweight.training.cvae.conditioning import token_key_values
from tokweight.training.cvae.model import CVAEConfig, build_cvae
from tokweight.training.objective.loss import plain_objective, reconstruction
from tokweight.training.loop.batches import collate_examples, encode
from tokweight.training.config.use import EvalConfig
from tokweight.training.evaluation.evaluate import run_eval
from tokweight.training.export.checkpoint import hf_config, hf_state_dict
from tokweight.training.objective.terms import WeightingParams, reconstruction_weights
from tokweight.training.loop.run_dir import load_run

pytest.importorskip("transformers")

VOCAB = Vocab(("a", "b", "c", "d"), k_max=4)
SAMPLES = [Sample("k0", ("a", "b"), ("b", "a", "c")), Sample("k1", ("c",), ("d",)),
           Sample("k2", ("a", "b", "c", "d"), ("d", "c"))]
BLOCK = 32


def attend(q, k, v, memory_k, memory_v) -> torch.Tensor:
    """Softmax attention of q (N, H, L, dh) over the memory's one position, then the causal keys."""
    k, v = torch.cat([memory_k, k], 2), torch.cat([memory_v, v], 2)
    L = q.shape[2]
    seen = torch.ones(L, L + 1, dtype=torch.bool).tril(1)  # query t sees key j (0: the memory) iff j <= t + 1
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~seen, -math.inf)
    return scores.softmax(-1) @ v


def memory_of(memory: torch.Tensor, layer: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer's (keys, values) of the memory, each (N, heads, 1, dh): a GQA key/value head serves its group."""
    kv_heads = memory.shape[3]
    return tuple(memory[:, layer, i, :, None].repeat_interleave(heads // kv_heads, 1) for i in (0, 1))


def gpt_by_hand(gpt: GPT, idx, memory) -> torch.Tensor:
    """(N, L, V) logits of the built-in GPT with the memory, its blocks run by hand."""
    N, L = idx.shape
    d, H = gpt.cfg.d_model, gpt.cfg.n_head
    x = gpt.wte(idx) + gpt.wpe(torch.arange(L))
    for i, block in enumerate(gpt.h):
        q, k, v = (t.view(N, L, H, -1).transpose(1, 2) for t in block.attn.c_attn(block.ln_1(x)).split(d, 2))
        y = attend(q, k, v, *memory_of(memory, i, H))
        x = x + block.attn.c_proj(y.transpose(1, 2).reshape(N, L, d))
        x = x + block.mlp(block.ln_2(x))
    return gpt.head(gpt.ln_f(x))


def llama_by_hand(model, idx, memory) -> torch.Tensor:
    """(N, L, V) logits of a LlamaForCausalLM with the memory, its layers run by hand: RoPE on the tokens'
    queries and keys (positions from 0), the memory's keys as given."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    N, L = idx.shape
    m = model.model
    x = m.embed_tokens(idx)
    cos, sin = m.rotary_emb(x, torch.arange(L)[None])
    for i, layer in enumerate(m.layers):
        a, h = layer.self_attn, layer.input_layernorm(x)
        q, k, v = (proj(h).view(N, L, -1, a.head_dim).transpose(1, 2) for proj in (a.q_proj, a.k_proj, a.v_proj))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        heads = q.shape[1]
        k, v = (t.repeat_interleave(heads // t.shape[1], 1) for t in (k, v))
        y = attend(q, k, v, *memory_of(memory, i, heads))
        x = x + a.o_proj(y.transpose(1, 2).reshape(N, L, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(m.norm(x))


def built_in_gpt() -> GPT:
    torch.manual_seed(0)
    gpt = GPT(ModelConfig(vocab_size=len(VOCAB), block_size=BLOCK, n_layer=2, n_head=2, d_model=16)).double()
    for p in gpt.parameters():  # larger random weights, so that the memory visibly matters
        p.data.add_(0.3 * torch.randn(p.shape, dtype=p.dtype))
    return gpt


def gpt2_of(gpt: GPT) -> HFBackbone:
    """transformers' GPT-2 with the built-in GPT's weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(**hf_config(gpt))).double()
    model.load_state_dict(hf_state_dict(gpt), strict=False)  # lm_head is tied to wte
    return HFBackbone(model).eval()


def with_reference(kind: str):
    """(backbone, (idx, memory) -> its logits computed by hand)."""
    if kind == "gpt":
        gpt = built_in_gpt()
        return gpt, lambda idx, memory: gpt_by_hand(gpt, idx, memory)
    if kind == "gpt2":
        gpt = built_in_gpt()
        return gpt2_of(gpt), lambda idx, memory: gpt_by_hand(gpt, idx, memory)
    backbone = HFBackbone(tiny_hf_model("llama", len(VOCAB), BLOCK).double()).eval()
    return backbone, lambda idx, memory: llama_by_hand(backbone.model, idx, memory)


@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama"])
def test_the_memory_forward_is_attention_over_one_more_position(kind):
    backbone, by_hand = with_reference(kind)
    layers, kv_heads, head_dim = backbone.memory_shape
    if kind == "llama":
        assert (kv_heads, head_dim) == (2, 8)  # GQA: 4 query heads share 2 key/value heads
    generator = torch.Generator().manual_seed(1)
    idx = torch.randint(len(VOCAB), (3, 9), generator=generator)
    memory = torch.randn(3, layers, 2, kv_heads, head_dim, generator=generator, dtype=torch.float64)
    logits = backbone(idx, memory=memory)[0]
    torch.testing.assert_close(logits, by_hand(idx, memory), rtol=0, atol=1e-5)
    assert (logits - backbone(idx)[0]).abs().amax(-1).min() > 1e-3  # the memory changed every position


def cvae_and_batch(kind: str, cfg: CVAEConfig):
    backbone = with_reference(kind)[0]
    model = build_cvae(backbone, VOCAB, cfg).double().eval()
    for p in model.conditioning.parameters():  # larger than the init's, so that z visibly matters
        p.data.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2), dtype=p.dtype))
    return model, collate_examples(list(encode([("shard.tar", s) for s in SAMPLES], VOCAB, 1, BLOCK)))


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_z_reaches_every_position_and_leaves_the_slot_alone(kind):
    model, batch = cvae_and_batch(kind, CVAEConfig(k=3, cond="memory"))
    assert model.conditioning.modulates_prefix and not model.shares_prefix
    ids = batch.zcond.input_ids
    hidden = []
    for k in (0, 1):
        onehot = torch.eye(3, dtype=torch.float64)[k].expand(len(ids), 3)
        inp, kwargs = model.conditioning.decoder_inputs(model.backbone, ids, batch.slot_pos, onehot,
                                                        model.latent.latent_ids[[k] * len(ids)])
        assert torch.equal(inp, ids) and set(kwargs) == {"memory"}  # the slot keeps its placeholder
        hidden.append(model.backbone.hidden(inp, **kwargs))
    moved = (hidden[0] - hidden[1]).abs().amax(-1)  # (B, L)
    assert moved.min() > 1e-4 and moved[:, : int(batch.z_pos.min())].min() > 1e-4  # before <z> as well


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("cfg", [CVAEConfig(k=3, cond="memory"), CVAEConfig(latent="continuous", cond="memory")],
                         ids=["discrete", "continuous"])
def test_a_gradient_reaches_the_memory_projection(kind, cfg):
    model, batch = cvae_and_batch(kind, cfg)
    b = torch.rand(batch.zfree.mask.shape, generator=torch.Generator().manual_seed(1)) * batch.zfree.mask
    pi, _ = reconstruction_weights("surprisal-share", b.double(), batch.zfree.mask, WeightingParams())
    out = model(batch, generator=torch.Generator().manual_seed(7))
    plain_objective(model.latent, out, reconstruction(out, pi), beta=0.7).loss.backward()
    grad = model.conditioning.memory_proj.weight.grad
    assert grad is not None and grad.abs().max() > 1e-6


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_the_memory_starts_at_the_scale_of_the_backbones_keys_and_values_distinct_per_latent_value(kind):
    backbone = with_reference(kind)[0]
    model = build_cvae(backbone, VOCAB, CVAEConfig(k=3, cond="memory")).double().eval()
    batch = collate_examples(list(encode([("shard.tar", s) for s in SAMPLES], VOCAB, 1, BLOCK)))
    ids, lengths = batch.zcond.input_ids[:, : int(batch.z_pos.max())], batch.z_pos
    mean, spread = token_key_values(backbone, ids, lengths)
    tokens = torch.stack([torch.stack(kv, 1) for kv in backbone.prefix(ids, lengths).cache.key_values()], 1)
    tokens = tokens.permute(0, 4, 1, 2, 3, 5)[torch.arange(ids.shape[1]) < lengths[:, None]]  # (P, layers, 2, H, dh)
    torch.testing.assert_close(tokens.norm(dim=-1).pow(2).mean(0), mean.norm(dim=-1).pow(2) + spread.pow(2))
    model.conditioning.init_memory(mean, spread, torch.Generator().manual_seed(0))
    memory = model.conditioning.memory_proj(torch.eye(3, dtype=torch.float64)).view(3, *mean.shape)
    torch.testing.assert_close(model.conditioning.memory_proj.bias.view(mean.shape), mean)  # z-free: the mean token
    off_mean = memory - mean  # (k, layers, 2, H, dh): each value's own direction at the tokens' spread
    torch.testing.assert_close(off_mean.norm(dim=-1), spread.expand(3, *spread.shape))
    cosine = torch.nn.functional.cosine_similarity(off_mean[:, None], off_mean[None], dim=-1)  # (k, k, ...)
    assert cosine[~torch.eye(3, dtype=torch.bool)].abs().max() < 0.99


def test_transformers_gradient_checkpointing_is_refused_as_it_drops_the_memory():
    backbone = HFBackbone(tiny_hf_model("llama", len(VOCAB), BLOCK))
    backbone.enable_checkpointing()
    layers, kv_heads, head_dim = backbone.memory_shape
    memory = torch.zeros(1, layers, 2, kv_heads, head_dim)
    with pytest.raises(ValueError, match="gradient checkpointing drops"):
        backbone.hidden(torch.zeros(1, 3, dtype=torch.long), memory=memory)


def test_train_cond_memory_on_the_cli_reloads_and_evaluates(tiny, tiny_store, tmp_path):
    data, ckpt = tiny
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", "--checkpoint", str(ckpt), "--data", str(data), "--store",
                                       str(tiny_store), "--out", str(out), "--cond", "memory", "--steps", "2",
                                       "--batch-size", "4", "--num-workers", "0"])
    assert result.exit_code == 0, result.output
    cfg, model, _, _ = load_run(out)
    assert cfg.cvae.cond == "memory" and model.conditioning.memory_proj is not None
    evaluated = run_eval(EvalConfig(run=str(out), data=str(data), split="test", decode_examples=4, device="cpu"))
    assert evaluated["metrics"]["examples"] > 0 and evaluated["decode"]["latent_values"] == cfg.cvae.k
