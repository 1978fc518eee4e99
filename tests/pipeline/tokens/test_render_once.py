"""A chat or string template rendered once (``pipeline.tokens.rendering``) gives every row the ids of rendering it
alone (``TokenizerVocab._cut``, the per-row path), over many varied strings, on the fixtures' ChatML Qwen2
(byte-level BPE) and GPT-2 string-template checkpoints; a template or tokenizer that cannot be split is
found (probes at load, checked rows while rendering) and rendered per row, as whole rows, or stopped with
an error naming the key; extraction writes the same bytes either way, bad samples in file order."""

import json
import shutil

import numpy as np
import pytest
import torch

from tests.support.device_guard import HostTensors
from tests.support.fixtures_extract import part_bytes, sample_member, write_raw_tar
from tests.support.fixtures_hf import TEXT_TEMPLATE, text_corpus
from tokweight.pipeline.extract import prepare as extract_read
from tokweight.pipeline.tokens import rendering
from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run as extract
from tokweight.pipeline.tokens.templates import to_device
from tokweight.pipeline.tokens.hf_vocab import TokenizerVocab
from tokweight.pipeline.tokens.rendering import CHECK_EVERY, Renderer, RenderMismatch
from tokweight.pipeline.tokens.templates import Template, or_error, template_ids, template_ids_many
from tokweight.store.baseline_store import BaselineStore
from tokweight.experiments.chat_model import CHAT_SPECIALS, CHATML

transformers = pytest.importorskip("transformers")
CHAT = Template("chat")
TEXT = Template("text", TEXT_TEMPLATE["text"], TEXT_TEMPLATE["end"])
WORDS = ["what", "is", "3", "plus", "4", "?", "the sum", "Paris", "Answer:", "1,234.5", "007", "-", "!", ".", "'s",
         '"q"', "\\", "{", "}}", "{% x %}", "%", "é", "façade", "東京", "🙂", "ß", "—", "<think>", "</think>", "<",
         "|"]
SPACES = ["", " ", "  ", "\n", "\n\n", "\t", "\r\n", " \n"]
SPECIALS = ["<|im_end|>", "<|endoftext|>", "<|im_start|>"]


def varied(rng: np.random.Generator) -> str:
    """A string of 0-6 words with any spacing, at either end too; now and then a special token's text."""
    words = [str(rng.choice(WORDS)) for _ in range(rng.integers(0, 7))]
    if rng.random() < 0.05:
        words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(SPECIALS)))
    text = "".join(str(rng.choice(SPACES, p=[0.1, 0.5, 0.05, 0.1, 0.05, 0.1, 0.05, 0.05])) + w for w in words)
    return text + str(rng.choice(SPACES)) if rng.random() < 0.3 else text


def varied_rows(n: int, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    rng = np.random.default_rng(seed)
    xs = [varied(rng) for _ in range(n)]
    ys = [varied(rng) or "a" for _ in range(n)]
    return xs, ys, [f"k{i}" for i in range(n)]


def per_row(vocab: TokenizerVocab, x, y, key):
    """``render`` as it was before rendering once: the checks, the per-row path, the checks of its result."""
    try:
        vocab.ids.check_texts(x, y, key)
        return vocab.ids.checked(vocab._cut(x, y, key), key)
    except SampleError as error:
        return error


def outcome(result):
    return (result.reason, str(result)) if isinstance(result, SampleError) else result


def vocab_of(checkpoint, template: Template, chat_template: str | None = None) -> TokenizerVocab:
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return TokenizerVocab(tokenizer, {}, checkpoint, template)


@pytest.fixture(scope="module")
def vocabs(chat_checkpoint, text_checkpoint) -> dict[str, TokenizerVocab]:
    return {"chat": vocab_of(chat_checkpoint, CHAT), "text": vocab_of(text_checkpoint, TEXT)}


@pytest.mark.parametrize("which", ["chat", "text"])
def test_rendered_once_equals_rendered_per_row_over_varied_strings(vocabs, which):
    vocab = vocabs[which]
    assert vocab.rendering == "once: spans between the template's special tokens"
    spans = vocab._renderer.spans
    assert bool(spans.head) == bool(spans.middle) == (which == "chat")  # ChatML: the turns' headers tokenized once
    assert spans.tail and spans.texts("x", "y")[1].startswith(spans.anchor + "y")  # y's span: the anchor, y
    xs, ys, keys = varied_rows(600)
    once = vocab.render_many(xs, ys, keys)
    alone = [per_row(vocab, x, y, key) for x, y, key in zip(xs, ys, keys)]
    assert [outcome(r) for r in once] == [outcome(r) for r in alone]
    rendered = [r for r in once if not isinstance(r, SampleError)]
    assert len(rendered) > 0.8 * len(once)  # the strings exercise the rendering, not only its refusals
    assert not any(spans.crosses(*spans.texts(x, y)[:2]) for x, y in zip(xs, ys))  # none went per row
    assert [outcome(r) for r in template_ids_many(vocab, xs, ys, keys, [7, 7])] == [
        outcome(r) if isinstance(r, SampleError) else template_ids(vocab, x, y, [7, 7], key=k)
        for r, x, y, k in zip(once, xs, ys, keys)]


@pytest.mark.parametrize("which", ["chat", "text"])
def test_the_reading_half_travels_to_the_reader_process_and_marks_rows_to_check(vocabs, which):
    """Pickled (as the reader process receives it: ``for_reader``, no transformers), it renders as the vocabulary
    does, and marks every ``CHECK_EVERY``-th row for the per-row check where transformers is."""
    import pickle

    xs, ys, keys = varied_rows(150, seed=3)
    reading = pickle.loads(pickle.dumps(vocabs[which].for_reader()))
    assert type(reading).__module__ == "tokweight.pipeline.tokens.tokenizer_ids"
    start = reading.renderer.rows  # rows the fixture's vocabulary rendered before: the count goes on
    assert [outcome(r) for r in reading.render_many(xs, ys, keys)] == [
        outcome(r) for r in vocabs[which].render_many(xs, ys, keys)]
    checks = reading.take_unchecked()
    valid = [k for x, y, k in zip(xs, ys, keys) if or_error(reading.check_texts, x, y, k) is None]  # rendered
    assert len(valid) > 2 * CHECK_EVERY and [c.key for c in checks] == valid[-start % CHECK_EVERY::CHECK_EVERY]
    vocabs[which].verify(checks)  # the main process's check: they agree
    assert reading.take_unchecked() == []


def test_the_prompt_and_y_are_tokenized_apart(vocabs):
    """"Answer: " then "3 is the sum": the prompt's trailing space is a token of its own and y's first token is
    "3", where the whole string tokenized at once would merge them (" 3"): the prompt's ids are those of any y."""
    vocab = vocabs["text"]
    r = vocab.render("what is 1 plus 2?", "3 is the sum")
    assert vocab.decode(r.prompt)[-3:] == ["Answer", ":", "Ġ"] and vocab.decode(r.y)[0] == "3"
    whole = vocab.tokenizer("Question: what is 1 plus 2?\nAnswer: 3 is the sum", add_special_tokens=False)
    assert "Ġ3" in vocab.decode(whole["input_ids"])
    assert r == per_row(vocab, "what is 1 plus 2?", "3 is the sum", None)
    assert all(vocab.render("what is 1 plus 2?", y).prompt == r.prompt for y in (" 3", "\n3", "three", "?"))


def test_a_template_that_trims_its_contents_is_rendered_per_row(chat_checkpoint):
    trimming = CHATML.replace("message['content']", "(message['content'] | trim)")
    vocab = vocab_of(chat_checkpoint, CHAT, trimming)
    assert vocab.rendering.startswith("per row: ") and "' leading space'" in vocab.rendering
    xs, ys, keys = varied_rows(100, seed=1)
    assert [outcome(r) for r in vocab.render_many(xs, ys, keys)] == [
        outcome(per_row(vocab, x, y, k)) for x, y, k in zip(xs, ys, keys)]


ZEBRA = CHATML.replace("{{ '<|im_start|>' + message['role']",
                       "{% if 'zebra' in message['content'] %}{{ 'Z' }}{% endif %}{{ '<|im_start|>' + message['role']")


def test_a_template_the_probes_miss_stops_at_a_checked_row(chat_checkpoint):
    """A rendering that depends on the text in a way no probe shows: row 0 of a run is checked, and raises."""
    vocab = vocab_of(chat_checkpoint, CHAT, ZEBRA)
    assert vocab.rendering.startswith("once")
    xs, ys, keys = ["a zebra?", "b"], ["c", "d"], ["kz", "kb"]
    with pytest.raises(RenderMismatch, match=r"key 'kz': the template rendered once gives this sample other") as error:
        vocab.render_many(xs, ys, keys)
    assert "\n" not in str(error.value)
    vocab._renderer.rows = 1  # the next checked row is CHECK_EVERY - 1 rows ahead: an unchecked zebra passes
    assert vocab.render_many(xs, ys, keys)[0] != per_row(vocab, xs[0], ys[0], "kz")
    vocab._renderer.rows = CHECK_EVERY - 1  # the next checked row: the second of the next call
    with pytest.raises(RenderMismatch, match="key 'kb'"):
        vocab.render_many(["b", "a zebra"], ys, ["ka", "kb"])


def test_extraction_stops_at_a_checked_row_and_commits_nothing(chat_checkpoint, tmp_path):
    ckpt = shutil.copytree(chat_checkpoint, tmp_path / "zebra")
    tokenizer = transformers.AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    tokenizer.chat_template = ZEBRA
    tokenizer.save_pretrained(ckpt)
    write_raw_tar(tmp_path / "data" / "shard.tar", [sample_member(f"k{i}", {"x": f"a zebra {i}?", "y": "b"})
                                                     for i in range(3)])
    config = ExtractConfig(checkpoint=str(ckpt), data=str(tmp_path / "data"), store=str(tmp_path / "store"),
                           template="chat", progress=False, reader_process=False, on_bad_sample="skip")
    with pytest.raises(RenderMismatch, match="key 'k0'"):
        extract(config)
    assert BaselineStore(tmp_path / "store").fingerprints() == []


def test_a_row_the_reader_process_renders_is_checked_here_and_stops_the_run(chat_checkpoint, tmp_path):
    """The reader process has no transformers: it marks the rows to check, and this process renders them alone
    before the shard is scored; the first row it renders (of shard b) differs: the run stops, naming the key."""
    ckpt = shutil.copytree(chat_checkpoint, tmp_path / "zebra")
    tokenizer = transformers.AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    tokenizer.chat_template = ZEBRA
    tokenizer.save_pretrained(ckpt)
    rows = {"a": [("ka", "no stripes")], "b": [("kz", "a zebra?"), ("kb", "b")], "c": [("kc", "c")]}
    for shard, samples in rows.items():
        write_raw_tar(tmp_path / "data" / f"{shard}.tar", [sample_member(k, {"x": x, "y": "y"}) for k, x in samples])
    with pytest.raises(RenderMismatch, match="key 'kz'") as error:
        extract_into(ckpt, tmp_path / "data", tmp_path / "store", "chat", reader_process=True)
    assert "\n" not in str(error.value)
    assert BaselineStore(tmp_path / "store").fingerprints() == []


def metaspace_vocab(tmp_path) -> TokenizerVocab:
    """A SentencePiece-like BPE that marks only a text's first word with '▁' (prepend_scheme "first"): a span
    tokenized alone starts a text, inside a row it does not."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.decoder = decoders.Metaspace(prepend_scheme="first")
    tok.train_from_iterator(text_corpus() + ["user assistant"],
                            trainers.BpeTrainer(vocab_size=200, special_tokens=CHAT_SPECIALS, show_progress=False))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return TokenizerVocab(fast, {}, tmp_path, CHAT)


def test_a_tokenizer_whose_spans_are_not_alone_gets_whole_rows(tmp_path):
    vocab = metaspace_vocab(tmp_path)
    assert vocab.rendering == "once: whole rows"
    r = vocab.render("what is 1 plus 2?", "3 is the sum")  # y read after the anchor: no '▁' its text lacks
    assert vocab.decode(r.y) == ["3", "▁is", "▁the", "▁sum"] and vocab.decode(r.prompt)[-1] == "\n"
    xs, ys, keys = varied_rows(200, seed=2)
    assert [outcome(r) for r in vocab.render_many(xs, ys, keys)] == [
        outcome(per_row(vocab, x, y, k)) for x, y, k in zip(xs, ys, keys)]
    pieces = rendering.Pieces.read(lambda x, y: vocab._texts(x, y, None))
    encode = rendering.batch_encoder(vocab.tokenizer)
    split = Renderer(vocab.tokenizer, rendering.Spans.of(pieces, encode, *rendering.added_tokens(vocab.tokenizer),
                                                                rendering.anchor_of(vocab.tokenizer)), "")
    assert split.spans.kind != "whole rows" and split.first_difference(rendering.PROBES, vocab._cut) is not None  # what they found


def test_a_row_that_could_make_an_added_token_across_an_edge_is_tokenized_whole(chat_checkpoint):
    """An added token "?<|im_end|>": in a row whose x ends with "?" it forms across x's span and the template's
    <|im_end|>, which x's span alone cannot show; such rows are tokenized whole (the template's text around them,
    read once) and always checked against the per-row rendering."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(chat_checkpoint, local_files_only=True)
    tokenizer.add_tokens([transformers.AddedToken("?<|im_end|>", normalized=False)])
    vocab = TokenizerVocab(tokenizer, {}, chat_checkpoint, CHAT)
    assert vocab.rendering.startswith("once: spans")
    spans = vocab._renderer.spans
    assert spans.x_edges[1] == ("?",)
    xs, ys, keys = ["what is 1 plus 2?", "no question"], ["3", "4"], ["q", "n"]
    assert [spans.crosses(*spans.texts(x, y)[:2]) for x, y in zip(xs, ys)] == [True, False]
    reading = vocab.for_reader()
    once = reading.render_many(xs, ys, keys)
    assert once == [per_row(vocab, x, y, k) for x, y, k in zip(xs, ys, keys)]
    assert tokenizer.convert_ids_to_tokens(once[0].prompt).count("?<|im_end|>") == 1
    assert [c.key for c in reading.take_unchecked()] == ["q"]  # row 0 is due anyway; "n" (row 1) is not
    assert reading.render_many(xs[::-1], ys[::-1], keys[::-1]) == once[::-1]
    assert [c.key for c in reading.take_unchecked()] == ["q"]  # row 3 of the run: checked because it is whole


# ---------------------------------------------------------------- extraction


def extract_into(ckpt, data, store, template, **kw) -> dict:
    return extract(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(store), template=str(template),
                                 progress=False, **{"reader_process": False, **kw}))


@pytest.mark.parametrize("which", ["chat", "text"])
def test_extraction_writes_the_bytes_of_rendering_per_row(which, chat_checkpoint, text_checkpoint, text_data,
                                                          text_template, tmp_path, monkeypatch):
    ckpt, template = (chat_checkpoint, "chat") if which == "chat" else (text_checkpoint, text_template)
    once = extract_into(ckpt, text_data, tmp_path / "once", template)
    assert once["rendering"] == "once: spans between the template's special tokens"
    read_apart = extract_into(ckpt, text_data, tmp_path / "reader", template, reader_process=True)
    assert read_apart["reader_process"] is True  # shards 1-3 rendered in the reader process, checked here
    monkeypatch.setattr(Renderer, "of", classmethod(lambda cls, tokenizer, texts, ref: cls(tokenizer, None, "per row")))
    alone = extract_into(ckpt, text_data, tmp_path / "alone", template, reader_process=True)
    assert alone["rendering"] == "per row" and alone["fingerprint"] == once["fingerprint"]
    assert alone["reader_process"] is False  # rows rendered per row need transformers: read here
    assert part_bytes(tmp_path / "once") == part_bytes(tmp_path / "alone") == part_bytes(tmp_path / "reader") != {}


def test_bad_samples_keep_file_order_across_the_batched_encoding(chat_checkpoint, tmp_path, monkeypatch):
    """A list x is refused by the template (at encoding), an x of 5 by the reader (at parsing): both are
    'wrong-type', and their keys are listed, and the first raised, in file order, whatever the batch size."""
    good = {"x": "what is 1 plus 2?", "y": "3 is the sum"}
    members = [sample_member("k0", good), sample_member("k1", {"x": ["a"], "y": "b"}),
               sample_member("k2", {"x": 5, "y": "b"}), sample_member("k3", good),
               sample_member("k4", {"x": ["a"], "y": "b"}), sample_member("k5", good)]
    write_raw_tar(tmp_path / "data" / "shard.tar", members)
    stores = {}
    for rows in (1024, 2):
        monkeypatch.setattr(extract_read, "ENCODE_ROWS", rows)
        with pytest.raises(SampleError, match="key 'k1'"):
            extract_into(chat_checkpoint, tmp_path / "data", tmp_path / f"error{rows}", "chat")
        extract_into(chat_checkpoint, tmp_path / "data", tmp_path / f"skip{rows}", "chat", on_bad_sample="skip")
        view = BaselineStore(tmp_path / f"skip{rows}").open()
        (part,) = view.parts()
        assert part["skipped_keys"] == {"wrong-type": ["k1", "k2", "k4"]}
        assert view.read_part(part["name"]).column("key").to_pylist() == ["k0", "k3", "k5"]
        stores[rows] = part_bytes(tmp_path / f"skip{rows}")
    assert stores[1024] == stores[2]


def test_chat_extraction_under_the_device_guard(chat_checkpoint, text_data, tmp_path):
    with HostTensors():
        summary = extract_into(chat_checkpoint, text_data / "val", tmp_path / "store", "chat", device="cpu")
    assert summary["parts"] == 1 and summary["tokens_written"] > 0


def test_host_to_device_on_the_cpu_is_the_tensor_itself():
    t = torch.arange(6).reshape(2, 3)[:, :2]  # a view, as a batch's cut input is
    assert to_device(t, torch.device("cpu")) is t
