"""The CVAE against brute force: per example, per latent value, unpadded, float64."""

import pytest
import torch

from tokweight.pipeline.models.gpt import GPT, ModelConfig
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.tokens.vocab import Vocab
from tokweight.training.cvae.model import CVAEConfig, build_cvae
from tokweight.training.objective.loss import plain_objective, reconstruction
from tokweight.training.loop.batches import collate_examples, encode
from tokweight.training.objective.terms import WeightingParams, reconstruction_weights

VOCAB = Vocab(("a", "b", "c", "d"), k_max=4)
SAMPLES = [Sample("k0", ("a", "b"), ("b", "a", "c")), Sample("k1", ("c",), ("d",)),
           Sample("k2", ("a", "b", "c", "d"), ("d", "c"))]
EPS = 1e-6


def make(cfg: CVAEConfig, seed=0):
    torch.manual_seed(seed)
    backbone = GPT(ModelConfig(vocab_size=len(VOCAB), block_size=32, n_layer=2, n_head=2, d_model=16))
    model = build_cvae(backbone, VOCAB, cfg).double()
    for p in model.parameters():  # larger random weights, so that z visibly matters
        p.data.add_(0.3 * torch.randn(p.shape, dtype=p.dtype))
    batch = collate_examples(list(encode([("shard.tar", s) for s in SAMPLES], VOCAB, cfg.slots, 32)))
    return model, batch


def hand_ids(s: Sample, slot: list[int] | None) -> list[int]:
    v = VOCAB.id
    z = [v("<z>"), *slot, v("</z>")] if slot is not None else []
    return [v("<bos>"), v("<x>"), *map(v, s.x), v("</x>"), *z, v("<y>"), *map(v, s.y), v("</y>"), v("<eos>")]


def hand_nll(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """l_t for S = y + </y>: the token after <y> at offset t is predicted at <y>'s index + t."""
    j = ids.index(VOCAB.id("<y>"))
    T = len(ids) - j - 2
    return torch.stack([-torch.log_softmax(logits[j + t], -1)[ids[j + 1 + t]] for t in range(T)])


def beyond_slots(cond, z: torch.Tensor) -> dict:
    """The GPT keyword arguments by which z (1, F) reaches the decoder other than through its slots."""
    if cond.ln_proj is not None:
        return {"ln_cond": cond.ln_proj(z).view(1, -1, 2, 16)}
    if cond.memory_proj is not None:
        return {"memory": cond.memory_proj(z).view(1, 2, 2, 2, 8)}  # 2 layers, keys and values, 2 heads of 8
    if cond.query_proj is not None:
        return {"query": cond.query_proj(z).view(1, 2, 2, 8)}  # 2 layers, 2 heads of 8
    return {}


def brute_force(model, cfg, b_rows, beta, noise=None):
    """mean_i [ E_q R_i + beta KL_i ] by loops over examples and latent values."""
    bb, lat, cond = model.backbone, model.latent, model.conditioning
    total = 0.0
    for i, s in enumerate(SAMPLES):
        free = hand_ids(s, None)
        _, hidden = bb(torch.tensor([free]))
        w = b_rows[i]
        if cfg.latent == "discrete":
            log_q = torch.log_softmax(lat.head(hidden[0, -1]), -1)
            R = []
            for k in range(cfg.k):
                ids = hand_ids(s, [VOCAB.latent_id(k if cond.writes_slots else 0)] * cfg.slots)
                onehot = torch.eye(cfg.k, dtype=torch.float64)[k][None]
                logits, _ = bb(torch.tensor([ids]), **beyond_slots(cond, onehot))
                l = hand_nll(logits[0], ids)
                R.append((w * l).sum() / (w.sum() + EPS))
            zpos = ids.index(VOCAB.id("<z>"))
            prior_logits, _ = bb(torch.tensor([ids[: zpos + 1]]))  # has not seen z
            log_p = torch.log_softmax(prior_logits[0, zpos, [VOCAB.latent_id(k) for k in range(cfg.k)]], -1)
            q = log_q.exp()
            total = total + (q * torch.stack(R)).sum() + beta * (q * (log_q - log_p)).sum()
        else:
            mu, logvar = lat.head(hidden[0, -1]).chunk(2)
            ids = hand_ids(s, [VOCAB.latent_id(0)] * cfg.slots)
            zpos = ids.index(VOCAB.id("<z>"))
            R = 0.0
            for draw in noise[i]:  # E_q R as the mean over the example's draws
                z = mu + (0.5 * logvar).exp() * draw
                emb = bb.wte(torch.tensor([ids])).clone()
                if cond.writes_slots:
                    emb[0, zpos + 1: zpos + 1 + cfg.slots] = cond.slot_proj(z).view(cfg.slots, 16)
                logits, _ = bb(torch.tensor([ids]), tok_emb=emb, **beyond_slots(cond, z[None]))
                l = hand_nll(logits[0], ids)
                R = R + (w * l).sum() / (w.sum() + EPS) / len(noise[i])
            _, hid = bb(torch.tensor([ids[: zpos + 1]]))  # has not seen z
            mu_p, lv_p = lat.prior_head(hid[0, zpos]).chunk(2)
            kl = 0.5 * (lv_p - logvar + (logvar.exp() + (mu - mu_p) ** 2) / lv_p.exp() - 1).sum()
            total = total + R + beta * kl
    return total / len(SAMPLES)


LAST = dict(posterior_pool="last")  # the brute force's posterior reads the state at <eos>


@pytest.mark.parametrize("cfg", [CVAEConfig(k=3, cond="token", **LAST), CVAEConfig(k=2, cond="prefix", slots=2, **LAST),
                                 CVAEConfig(k=3, cond="layernorm", **LAST), CVAEConfig(k=3, cond="memory", **LAST),
                                 CVAEConfig(k=3, cond="query", **LAST),
                                 CVAEConfig(latent="continuous", z_dim=3, cond="token", **LAST),
                                 CVAEConfig(latent="continuous", z_dim=2, cond="prefix", slots=3, **LAST),
                                 CVAEConfig(latent="continuous", z_dim=2, cond="memory", **LAST)])
def test_exact_objective_against_brute_force(cfg):
    model, batch = make(cfg)
    b = torch.rand(batch.zfree.mask.shape, generator=torch.Generator().manual_seed(1)) * batch.zfree.mask
    b_rows = [b[i, : len(s.y) + 1].double() for i, s in enumerate(SAMPLES)]
    pi, _ = reconstruction_weights("surprisal-share", b.double(), batch.zfree.mask, WeightingParams(eps=EPS))
    out = model(batch, generator=torch.Generator().manual_seed(7))
    got = plain_objective(model.latent, out, reconstruction(out, pi), beta=0.7).loss
    noise = torch.randn((3, cfg.samples, cfg.z_dim), generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    want = brute_force(model, cfg, b_rows, 0.7, noise)
    # token_surprisal computes in float32 (templates.py), hence 1e-6 and not 1e-12
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    # z matters: the per-copy reconstructions differ across latent values
    if cfg.latent == "discrete":
        assert (out.nll[:, 0] - out.nll[:, 1]).abs().max() > 1e-4


def test_index_maps_of_the_two_templates():
    """S position t is predicted at logit_pos[t] in both templates: the token there is <y>
    for t = 0, the token after it is the target, and the targets agree."""
    batch = collate_examples(list(encode([("shard.tar", s) for s in SAMPLES], VOCAB, 2, 32)))
    for tpl in (batch.zfree, batch.zcond):
        rows = torch.arange(len(SAMPLES))[:, None]
        assert (tpl.input_ids[rows, tpl.logit_pos][:, 0] == VOCAB.id("<y>")).all()
        nxt = tpl.input_ids[rows, tpl.logit_pos + 1]
        assert torch.equal(nxt[tpl.mask], tpl.targets[tpl.mask])
    assert torch.equal(batch.zfree.targets, batch.zcond.targets)
    assert torch.equal(batch.zfree.mask, batch.zcond.mask)
    for i, s in enumerate(SAMPLES):
        want = [VOCAB.id(t) for t in s.y] + [VOCAB.id("</y>")]
        assert batch.zfree.targets[i, : len(want)].tolist() == want
        assert batch.zcond.input_ids[i, batch.z_pos[i]] == VOCAB.id("<z>")
        assert batch.zcond.input_ids[i, batch.slot_pos[i] + 2].tolist()[-1] == VOCAB.id("<y>")
        assert batch.zfree.input_ids[i, batch.last_pos[i]] == VOCAB.id("<eos>")


def test_copies_are_one_forward_and_match_separate_forwards():
    cfg = CVAEConfig(k=4, cond="token")  # one slot: <z> <z_k> </z>
    model, batch = make(cfg)
    calls, hidden = [], model.backbone.hidden
    model.backbone.hidden = lambda ids, **kw: calls.append(ids.shape) or hidden(ids, **kw)  # this instance only
    out = model(batch)
    del model.backbone.hidden
    # the z-free pass and the copies continue the shared <bos> <x> x </x> (computed by GPT.prefix):
    # <y> y </y> <eos>, and <z> <z_k> </z> before it
    suffix = max(len(s.y) for s in SAMPLES) + 3
    assert calls == [(len(SAMPLES), suffix), (4 * len(SAMPLES), suffix + 3)]
    for k in range(4):  # copy k of the batched pass == a pass with <z_k> written in by hand
        ids = batch.zcond.input_ids.scatter(1, batch.slot_pos, VOCAB.latent_id(k))
        logits, _ = model.backbone(ids)
        from tokweight.pipeline.tokens.templates import gather_s, token_surprisal
        nll = token_surprisal(gather_s(logits, batch.zcond.logit_pos), batch.zcond.targets, batch.zcond.mask)
        torch.testing.assert_close(out.nll[:, k], nll)


def test_discrete_prior_is_the_decoders_distribution_at_z():
    cfg = CVAEConfig(k=3)
    model, batch = make(cfg)
    out = model(batch)
    torch.testing.assert_close(out.prior.exp().sum(-1), torch.ones(3, dtype=torch.float64))
    ids = hand_ids(SAMPLES[0], [VOCAB.latent_id(1)])
    logits, _ = model.backbone(torch.tensor([ids]))
    zpos = ids.index(VOCAB.id("<z>"))
    want = torch.softmax(logits[0, zpos, [VOCAB.latent_id(k) for k in range(3)]], -1)
    torch.testing.assert_close(out.prior[0].exp(), want)


def test_mean_pool_posterior_reads_the_mean_state_over_s():
    cfg = CVAEConfig(latent="discrete", k=3, posterior_pool="mean")
    model, batch = make(cfg)
    out = model(batch)
    for i, s in enumerate(SAMPLES):
        ids = hand_ids(s, None)
        _, hidden = model.backbone(torch.tensor([ids]))
        j, T = ids.index(VOCAB.id("<y>")), len(s.y) + 1  # S = y + </y>, predicted at <y> .. the last y token
        expected = torch.log_softmax(model.latent.head(hidden[0, j:j + T].mean(0)), -1)
        assert torch.allclose(out.post[i], expected, atol=1e-10)
        last = torch.log_softmax(model.latent.head(hidden[0, -1]), -1)
        assert not torch.allclose(out.post[i], last, atol=1e-3)  # not the <eos> read


def test_the_likelihood_posterior_is_a_discrete_latents_default_and_refused_for_a_continuous_one():
    assert CVAEConfig().posterior_likelihood is True
    assert CVAEConfig(posterior_likelihood=False).posterior_likelihood is False
    assert CVAEConfig(latent="continuous").posterior_likelihood is False
    with pytest.raises(ValueError, match="posterior_likelihood needs a discrete latent"):
        CVAEConfig(latent="continuous", posterior_likelihood=True)


def test_centred_latent_rows_keep_the_mean_and_offset_it_orthogonally():
    from tokweight.training.cvae.model import spread_latent_embeddings

    model, _ = make(CVAEConfig(latent="discrete", k=3))
    ids = model.latent.latent_ids.tolist()
    weight = model.backbone.wte.weight
    before = weight[ids].detach().clone()
    spread_latent_embeddings(model.backbone, ids, 0.5, torch.Generator().manual_seed(0), center=True)
    offsets = weight[ids].detach() - before.mean(0)
    assert torch.allclose(offsets @ offsets.T, 0.25 * torch.eye(3, dtype=offsets.dtype), atol=1e-10)
    assert torch.allclose(offsets @ before.mean(0), torch.zeros(3, dtype=offsets.dtype), atol=1e-10)
    spread_latent_embeddings(model.backbone, ids, 2.0, torch.Generator().manual_seed(0))  # replaced, not offset
    rows = weight[ids].detach()
    assert torch.allclose(rows @ rows.T, 4.0 * torch.eye(3, dtype=rows.dtype), atol=1e-10)


def test_continuous_slots_start_at_the_mean_latent_row_spread_by_the_norm():
    """A continuous z's slot projection (``Conditioning.init_slots``): its bias is the mean latent row, its
    columns orthogonal to that row and to each other, 1/sqrt(F) long, so a standard-normal z moves each slot by
    a mean squared norm of norm^2."""
    from tokweight.training.cvae.conditioning import Conditioning

    cond = Conditioning("prefix", 4, 32, 0, 8, True, memory_shape=(2, 2, 16))
    mean = torch.randn(32, generator=torch.Generator().manual_seed(1))
    cond.init_slots(mean, 1.0, torch.Generator().manual_seed(0))
    weight = cond.slot_proj.weight.detach().double().view(4, 32, 8)
    torch.testing.assert_close(cond.slot_proj.bias.detach().view(4, 32), mean.expand(4, 32))
    torch.testing.assert_close(weight.transpose(1, 2) @ weight, torch.eye(8, dtype=torch.float64).expand(4, 8, 8) / 8)
    assert (mean.double() @ weight).abs().max() < 1e-5
    with pytest.raises(ValueError, match="orthogonal"):
        Conditioning("prefix", 1, 8, 0, 8, True, memory_shape=(1, 1, 8)).init_slots(torch.ones(8), 1.0,
                                                                                      torch.Generator())


def test_continuous_nll_under_the_own_value_is_at_the_posterior_mean_whatever_its_spread():
    """eval's token-mean NLL (``validation.matched_nll``) for a Gaussian z is the decoder's at mu, one copy per
    example, as written in by hand; widening q moves the draws' NLL but not it."""
    from tokweight.training.evaluation.validation import matched_nll
    cfg = CVAEConfig(latent="continuous", z_dim=2, cond="prefix", slots=2, samples=3, **LAST)
    model, batch = make(cfg)
    out = model(batch, generator=torch.Generator().manual_seed(0))
    own = matched_nll(model, batch, out)
    bb, cond = model.backbone, model.conditioning
    for i, s in enumerate(SAMPLES):
        ids = hand_ids(s, [VOCAB.latent_id(0)] * cfg.slots)
        zpos = ids.index(VOCAB.id("<z>"))
        emb = bb.wte(torch.tensor([ids])).clone()
        emb[0, zpos + 1: zpos + 1 + cfg.slots] = cond.slot_proj(out.post[0][i]).view(cfg.slots, 16)
        logits, _ = bb(torch.tensor([ids]), tok_emb=emb)
        torch.testing.assert_close(own[i].double(), hand_nll(logits[0], ids).sum(), rtol=1e-6, atol=1e-6)  # float32 l_t
    with torch.no_grad():
        model.latent.head.bias[cfg.z_dim:] += 4.0  # log-variance up by 4: the draws scatter e^2 times as far
    wide = model(batch, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(matched_nll(model, batch, wide), own)
    assert (wide.nll.sum(-1) - out.nll.sum(-1)).abs().max() > 1e-3  # the draws' NLL did move
