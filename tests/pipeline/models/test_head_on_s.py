"""The output head on the states that predict S only (pipeline/models/head.py) against full-vocabulary
logits at every position: per-token NLLs and every parameter gradient agree to 1e-5 (float32),
on the built-in GPT and on GPT-2 and Llama built from a config, in chunks of a few rows."""

import pytest
import torch

from tests.support.fixtures_hf import tiny_hf_model
from tokweight.pipeline.models.head import nll_over_s
from tokweight.pipeline.models.hf import HFBackbone
from tokweight.pipeline.models.gpt import GPT, ModelConfig
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.tokens.templates import gather_s, token_surprisal
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.training.cvae.model import CVAEConfig, build_cvae
from tokweight.training.loop.batches import collate_examples, encode

V, L, B = 300, 12, 4
LENGTHS = torch.tensor([12, 7, 9, 5])  # right-padded rows of mixed lengths
CHUNK = 5 * V  # 5 rows per chunk: several chunks, the last one short


def backbone(kind: str):
    torch.manual_seed(0)
    if kind == "gpt":
        return GPT(ModelConfig(vocab_size=V, block_size=L, n_layer=2, n_head=2, d_model=16))
    return HFBackbone(tiny_hf_model(kind, V, L))


def s_batch(seed: int = 0):
    """ids (B, L), and S as the last few tokens of each row: logit_pos, targets, mask (B, T_max)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (B, L), generator=g)
    T = LENGTHS - 3  # S starts at position 3 of every row
    t = torch.arange(int(T.max()))
    mask = t < T[:, None]
    logit_pos = torch.where(mask, 2 + t, 0)
    targets = torch.where(mask, ids.gather(1, logit_pos + 1), 0)
    return ids, logit_pos, targets, mask


def full_logits_nll(model, ids, logit_pos, targets, mask) -> torch.Tensor:
    """The reference: logits (B, L, V) at every position, gathered at S."""
    logits, _ = model(ids)
    return token_surprisal(gather_s(logits, logit_pos), targets, mask)


def nll_and_grads(model, fn, *batch) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    nll = fn(model, *batch)
    (nll * torch.linspace(0.5, 2.0, nll.numel()).view(nll.shape)).sum().backward()  # unequal weights per token
    return nll.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def head_on_s(model, ids, logit_pos, targets, mask) -> torch.Tensor:
    return nll_over_s(model, model.hidden(ids), logit_pos, targets, mask, chunk_elements=CHUNK)


@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama"])
def test_head_on_s_equals_full_logits_in_value_and_gradient(kind):
    model = backbone(kind).eval()  # no dropout: the two passes see the same network
    batch = s_batch()
    assert int(batch[3].sum()) > CHUNK // V  # more rows than one chunk
    got, got_grads = nll_and_grads(model, head_on_s, *batch)
    want, want_grads = nll_and_grads(model, full_logits_nll, *batch)
    assert got.dtype == torch.float32 and (got[~batch[3]] == 0).all() and (got[batch[3]] > 0).all()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert got_grads.keys() == want_grads.keys() and len(want_grads) == len(list(model.parameters()))
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=0, atol=1e-5 * max(1.0, grad.abs().max().item()),
                                   msg=name)


@pytest.mark.parametrize("kind", ["gpt", "gpt2", "llama"])
def test_the_head_of_some_tokens_is_those_columns_of_the_full_head(kind):
    model = backbone(kind)
    hidden = torch.randn(3, model.cfg.d_model, generator=torch.Generator().manual_seed(2))
    ids = torch.tensor([7, 2, 250])
    torch.testing.assert_close(model.head(hidden, ids), model.head(hidden)[:, ids], rtol=0, atol=1e-6)


def test_a_bf16_model_is_scored_in_float32():
    model = backbone("gpt").to(torch.bfloat16)
    batch = s_batch(1)
    with torch.no_grad():
        got = nll_over_s(model, model.hidden(batch[0]), *batch[1:], chunk_elements=CHUNK)
        want = full_logits_nll(model, *batch)  # bf16 logits, their log-softmax in float32
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_a_cvae_step_runs_the_head_on_s_and_the_latent_rows_only():
    vocab = Vocab(("a", "b", "c", "d"), k_max=4)
    samples = [Sample("k0", ("a", "b"), ("b", "a", "c")), Sample("k1", ("c",), ("d",))]
    cfg = CVAEConfig(k=3, cond="prefix", slots=2)
    model = build_cvae(GPT(ModelConfig(vocab_size=len(vocab), block_size=32, n_layer=1, n_head=2, d_model=16)),
                       vocab, cfg)
    batch = collate_examples(list(encode([("shard.tar", s) for s in samples], vocab, cfg.slots, 32)))
    calls, head = [], model.backbone.head
    model.backbone.head = lambda h, ids=None: calls.append((h.shape[0], ids)) or head(h, ids)  # this instance only
    model(batch).nll.sum().backward()
    del model.backbone.head
    n_s = int(batch.zfree.mask.sum())  # 4 + 2 tokens of S
    rows = [n for n, ids in calls if ids is None]
    # forward: the z-free pass, then the K copies; backward: the copies' head again (recomputed, not kept)
    assert rows == [n_s, cfg.k * n_s, cfg.k * n_s]
    assert [(n, ids.tolist()) for n, ids in calls if ids is not None] == [(2, model.latent.latent_ids.tolist())]


def test_the_host_count_indexes_s_as_nonzero_does_and_gives_the_same_nlls_bitwise():
    """``s_index`` with the host's count of S tokens (no read-back of the mask) is the mask's nonzero, in its
    order; a row of no S token is allowed. The head's NLLs and gradients through it are bitwise those of the
    nonzero path."""
    from tokweight.pipeline.models.head import s_index

    mask = torch.arange(6) < torch.tensor([3, 0, 6, 1])[:, None]
    for got, want in zip(s_index(mask, int(mask.sum())), mask.nonzero(as_tuple=True)):
        assert torch.equal(got, want)
    model = backbone("gpt")
    batch = s_batch(3)
    runs = []
    for count in (None, int(batch[3].sum())):
        model.zero_grad()
        nll = nll_over_s(model, model.hidden(batch[0]), *batch[1:], chunk_elements=CHUNK, count=count)
        (nll * torch.linspace(0.5, 2.0, nll.numel()).view(nll.shape)).sum().backward()
        runs.append((nll.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_head_chunks_are_sized_for_the_device_and_do_not_change_the_values():
    from tokweight.pipeline.models.head import LOGIT_CHUNK_BYTES, chunk_rows

    cpu = torch.device("cpu")
    assert chunk_rows(152_064, cpu) == LOGIT_CHUNK_BYTES["cpu"] // 4 // 152_064 >= 100
    assert LOGIT_CHUNK_BYTES["cuda"] // 4 // 152_064 >= 1000  # a GPU's chunk: over a thousand rows at 152k
    assert chunk_rows(152_064, torch.device("meta")) == chunk_rows(152_064, cpu)  # other devices: the CPU's
    assert chunk_rows(10 ** 9, cpu) == 1 and chunk_rows(V, cpu, chunk_elements=CHUNK) == 5
    model = backbone("gpt").eval()
    batch = s_batch(4)
    with torch.no_grad():
        hidden = model.hidden(batch[0])
        by_size = [nll_over_s(model, hidden, *batch[1:], chunk_elements=n * V) for n in (1, 3, 1000)]
    assert all(torch.equal(by_size[0], other) for other in by_size[1:])
