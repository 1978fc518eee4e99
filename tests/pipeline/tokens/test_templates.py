import pytest
import torch

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.tokens.templates import (Layout, check_length, collate, gather_s, s_targets, template_ids,
                                          token_surprisal)
from tokweight.pipeline.tokens.vocab import SPECIALS, Vocab


def zfree(vocab, x, y, **kw) -> list[int]:
    """The z-free template's ids."""
    return template_ids(vocab, x, y, **kw)[0]


def zcond(vocab, x, y, slot_ids, **kw) -> list[int]:
    """The z-conditioned template's ids, ``slot_ids`` in its latent slots."""
    return template_ids(vocab, x, y, slot_ids, **kw)[0]


VOCAB = Vocab(("a", "b", "c", "d"), k_max=4)


def test_vocab_order_and_round_trip():
    assert VOCAB.tokens[:9] == SPECIALS and VOCAB.id("<pad>") == 0
    assert VOCAB.latent_id(0) == 9 and VOCAB.tokens[VOCAB.latent_id(3)] == "<z_3>"
    assert VOCAB.id("a") == 9 + 4
    assert Vocab.from_json(VOCAB.to_json()) == VOCAB
    with pytest.raises(ValueError, match="collide"):
        Vocab(("a", "<eos>"))


@pytest.mark.parametrize("m,n,slots", [(1, 1, 1), (3, 5, 1), (4, 2, 3), (6, 6, 4)])
def test_s_aligns_between_templates(m, n, slots):
    x = ["abcd"[i % 4] for i in range(m)]
    y = ["dcba"[i % 4] for i in range(n)]
    free = zfree(VOCAB, x, y)
    cond = zcond(VOCAB, x, y, [VOCAB.latent_id(1)] * slots)
    lf, lc = Layout(m, n), Layout(m, n, slots)
    assert lf.length == len(free) and lc.length == len(cond)
    expected = VOCAB.encode_symbols(y) + [VOCAB.id("</y>")]
    assert s_targets(free, lf) == expected == s_targets(cond, lc)
    # the logit predicting S position 0 reads <y> in both templates
    assert free[lf.s_logit_positions()[0]] == VOCAB.id("<y>") == cond[lc.s_logit_positions()[0]]
    assert cond[lc.z_pos] == VOCAB.id("<z>")
    assert [cond[p] for p in lc.slot_positions] == [VOCAB.latent_id(1)] * slots
    assert lc.s_start - lf.s_start == slots + 2
    assert VOCAB.decode(free)[-2:] == ["</y>", "<eos>"]


def test_bad_samples_name_the_key():
    with pytest.raises(SampleError, match="'k1'") as e:
        zfree(VOCAB, ["a"], ["z"], key="k1")
    assert e.value.reason == "unknown-symbol"
    with pytest.raises(SampleError, match="k2") as e:
        zfree(VOCAB, ["a"], [], key="k2")
    assert e.value.reason == "empty-y"
    with pytest.raises(SampleError, match="k3") as e:
        zfree(VOCAB, ["<z_0>"], ["a"], key="k3")
    with pytest.raises(SampleError, match="k4") as e:
        check_length(70, 64, key="k4")
    assert e.value.reason == "too-long"


def test_collate_gather_and_surprisal_match_cross_entropy():
    torch.manual_seed(0)
    samples = [(["a", "b"], ["c"]), (["a"], ["d", "c", "b"]), (["b", "b", "c"], ["a", "a"])]
    seqs = [zfree(VOCAB, x, y) for x, y in samples]
    lays = [Layout(len(x), len(y)) for x, y in samples]
    batch = collate(seqs, lays)
    assert batch.mask.sum().item() == sum(lay.T for lay in lays)
    logits = torch.randn(*batch.input_ids.shape, len(VOCAB))
    b = token_surprisal(gather_s(logits, batch.logit_pos), batch.targets, batch.mask)
    for i, (seq, lay) in enumerate(zip(seqs, lays)):
        pos = list(lay.s_logit_positions())
        ref = torch.nn.functional.cross_entropy(logits[i, pos], torch.tensor(seq)[[p + 1 for p in pos]],
                                                reduction="none")
        torch.testing.assert_close(b[i, : lay.T], ref)
        assert (b[i, lay.T:] == 0).all()


def test_text_needs_a_tokenizer():
    """A string x is a valid sample (docs/contract.md §5), but a symbol vocabulary cannot encode it: named, by key."""
    with pytest.raises(SampleError, match="x is a string, but this vocabulary has no tokenizer") as info:
        zfree(VOCAB, "a b", ["a"], key="k9")
    assert (info.value.reason, info.value.key) == ("wrong-type", "k9")


# ---------------------------------------------------------------- chat and text templates (no tokenizer needed)


def test_cut_at_y_gives_y_a_token_that_begins_in_the_prompt():
    """"Answer: 5 is<end>" tokenized as [Answer, :, " 5", " is", <end>]: " 5" is y's first token."""
    from tokweight.pipeline.tokens.templates import cut_at_y

    text = "Answer: 5 is<end>"
    offsets = [(0, 6), (6, 7), (7, 9), (9, 12), (12, 17)]
    r = cut_at_y([10, 11, 12, 13, 2], offsets, y_start=8, y_end=12)
    assert (r.prompt, r.y, r.end, r.tail) == ((10, 11), (12, 13), 2, ())
    assert text[8:12] == "5 is"
    with pytest.raises(SampleError, match="runs on into the end token's text") as e:
        cut_at_y([10, 11, 12, 14], [(0, 6), (6, 7), (7, 13), (13, 17)], y_start=8, y_end=12, key="k")
    assert (e.value.reason, e.value.key) == ("template-token", "k")


@pytest.mark.parametrize("m,n,slots,tail", [(1, 1, 1, 0), (5, 3, 4, 1), (9, 2, 2, 3)])
def test_a_rendered_layout_puts_the_slots_after_the_prompt_and_s_aligns(m, n, slots, tail):
    from tokweight.pipeline.tokens.templates import Skeleton

    prompt, y, end, rest = list(range(100, 100 + m)), list(range(200, 200 + n)), 7, [8] * tail
    free, cond = prompt + y + [end] + rest, prompt + [9] * slots + y + [end] + rest
    lf, lc = Layout(m, n, 0, Skeleton.rendered(tail)), Layout(m, n, slots, Skeleton.rendered(tail))
    assert (lf.length, lc.length, lc.zfree) == (len(free), len(cond), lf)
    assert s_targets(free, lf) == y + [end] == s_targets(cond, lc)
    assert lc.z_pos == m - 1 and [cond[p] for p in lc.slot_positions] == [9] * slots  # the prior: prompt's last


def test_a_template_describes_itself_and_refuses_what_it_cannot_render():
    from tokweight.pipeline.tokens.templates import TOKWEIGHT, Template

    text = Template("text", "Q: {x}\nA: {y}", "</s>")
    assert Template.from_json(text.to_json()) == text and Template.from_json(None) == TOKWEIGHT
    with pytest.raises(ValueError, match="'text' has {y} before {x}"):
        Template("text", "{y} {x}", "</s>")
    with pytest.raises(ValueError, match="'end' is empty"):
        Template("text", "{x} {y}", "")
    with pytest.raises(ValueError, match="takes no text"):
        Template("chat", "{x} {y}")
