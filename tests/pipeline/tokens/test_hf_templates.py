"""Checkpoints as users have them: a chat model in its own chat template, a GPT-2 in a plain string
template, latent tokens appended by train (tiny models built from a config, tokenizers trained here)."""

import json
import re
import shutil

import numpy as np
import pytest
import torch

from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run as extract
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import iter_samples, write_shards
from tokweight.pipeline.tokens.templates import Template
from tokweight.store.baseline_store import BaselineStore
from tokweight.training.config.components import CVAEConfig
from tokweight.training.config.use import EvalConfig
from tokweight.training.evaluation.evaluate import run_eval
from tokweight.training.loop.run_dir import load_run, read_metrics
from tokweight.training.loop.train import run as train
from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig
from tests.support.fixtures_hf import save_chat_checkpoint

transformers = pytest.importorskip("transformers")
CHAT = Template("chat")


def extract_into(ckpt, data, store, template) -> dict:
    return extract(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(store), template=str(template),
                                 progress=False, reader_process=False))


@pytest.fixture(scope="module")
def chat_store(chat_checkpoint, text_data, tmp_path_factory):
    store = tmp_path_factory.mktemp("chat_store") / "store"
    extract_into(chat_checkpoint, text_data, store, "chat")
    return store


@pytest.fixture(scope="module")
def text_store(text_checkpoint, text_data, text_template, tmp_path_factory):
    store = tmp_path_factory.mktemp("text_store") / "store"
    extract_into(text_checkpoint, text_data, store, text_template)
    return store


def stored_rows(store, split_dir) -> dict[str, dict]:
    view = BaselineStore(store).open()
    return {key: row for url in sorted(split_dir.glob("*.tar")) for key, row in view.rows_for_shard(url).items()}


def chat_oracle_b(model, tokenizer, sample: Sample) -> tuple[np.ndarray, list[int]]:
    """-log p of the assistant's tokens and its end-of-turn token, from a plain transformers forward over
    ``apply_chat_template``'s ids; the assistant's tokens found as what follows the generation prompt."""
    user = [{"role": "user", "content": sample.x}]
    prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True)["input_ids"]
    ids = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": sample.y}])["input_ids"]
    assert ids[: len(prompt)] == prompt
    end = ids.index(tokenizer.convert_tokens_to_ids("<|im_end|>"), len(prompt))
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    positions = range(len(prompt), end + 1)
    return np.array([-logp[p - 1, ids[p]].item() for p in positions], np.float32), [ids[p] for p in positions]


def test_chat_b_equals_a_transformers_forward_over_apply_chat_template(chat_checkpoint, chat_store, text_data):
    model = transformers.AutoModelForCausalLM.from_pretrained(chat_checkpoint, local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(chat_checkpoint, local_files_only=True)
    rows = stored_rows(chat_store, text_data / "val")
    samples = [s for _, s in iter_samples(sorted((text_data / "val").glob("*.tar")))]
    assert len(rows) == len(samples) == 16
    worst = 0.0
    for sample in samples:
        b, targets = chat_oracle_b(model, tokenizer, sample)
        assert rows[sample.key]["target_id"].tolist() == targets
        worst = max(worst, float(np.abs(rows[sample.key]["b"] - b).max()))
    print(f"chat oracle: max |b_store - b_transformers| = {worst:.3g} nats")
    assert worst <= 1e-5


def test_the_store_records_the_template_and_the_fingerprint_covers_it(chat_checkpoint, chat_store, text_checkpoint,
                                                                      text_store, text_template):
    view = BaselineStore(chat_store).open()
    assert view.manifest["template"] == {"kind": "chat"}
    assert view.fingerprint == load_backbone(chat_checkpoint, template=CHAT).fingerprint
    text = BaselineStore(text_store).open()
    assert text.manifest["template"] == {"kind": "text", **json.loads(text_template.read_text())}
    other = Template("text", "Q: {x}\nA: {y}", "<|endoftext|>")
    fingerprints = {load_backbone(text_checkpoint, template=t).fingerprint
                    for t in (Template.from_json(text.manifest["template"]), other)}
    assert len(fingerprints) == 2 and text.fingerprint in fingerprints


def run_config(ckpt, data, store, out, *, cvae=CVAEConfig(k=2), steps=3) -> TrainConfig:
    """No --template anywhere: train reads it from the store."""
    return TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), store=str(store), out=str(out), num_workers=0,
                                device="cpu"),
                       cvae=cvae, loss=LossConfig(beta=0.3),
                       optim=OptimConfig(steps=steps, batch_size=8, lr=3e-4),
                       log=LogConfig(log_every=1, grad_diag_every=0, ckpt_every=3, eval_batch_size=16))


def store_bytes(store) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("which", ["chat", "text"])
def test_a_user_checkpoint_extracts_trains_and_evaluates(which, chat_checkpoint, chat_store, text_checkpoint,
                                                         text_store, text_data, tmp_path):
    """The stock checkpoint has no latent token: train appends K of them to its copy, load_run rebuilds
    them, and the checkpoint, its store and its fingerprint stay as they were."""
    ckpt, store = (chat_checkpoint, chat_store) if which == "chat" else (text_checkpoint, text_store)
    before, fingerprint = store_bytes(store), BaselineStore(store).open().fingerprint
    out = tmp_path / "run"
    result = train(run_config(ckpt, text_data, store, out))
    assert np.isfinite(result["recon"]) and result["examples"] == 16
    assert len([r for r in read_metrics(out) if "loss" in r]) == 3
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["template"] == BaselineStore(store).open().manifest["template"]
    _, model, vocab, _ = load_run(out)
    checkpoint = load_backbone(ckpt, template=Template.from_json(state["template"]))
    assert checkpoint.vocab.k_max == 0 and vocab.k_max == 2 and len(vocab) == len(checkpoint.vocab) + 2
    assert model.backbone.cfg.vocab_size == len(vocab) and vocab.tokens[vocab.latent_id(1)] == "<z_1>"
    assert model.latent.latent_ids.tolist() == [len(checkpoint.vocab), len(checkpoint.vocab) + 1]
    evaluated = run_eval(EvalConfig(run=str(out), data=str(text_data), split="test", decode_examples=4,
                                    device="cpu"))
    assert evaluated["metrics"]["examples"] == 16 and evaluated["decode"]["latent_values"] == 2
    assert evaluated["decode"]["sample_outputs"][0]["reference"]  # y as the template tokenizes it
    assert store_bytes(store) == before and checkpoint.fingerprint == fingerprint
    train(run_config(ckpt, text_data, store, out, steps=4))  # resumes at step 3 with the grown embeddings
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [0, 1, 2, 3]


def test_a_continuous_latent_appends_one_placeholder_token(chat_checkpoint, chat_store, text_data, tmp_path):
    train(run_config(chat_checkpoint, text_data, chat_store, tmp_path / "run", cvae=CVAEConfig(latent="continuous"),
                     steps=1))
    _, model, vocab, _ = load_run(tmp_path / "run")
    assert vocab.k_max == 1 and model.backbone.cfg.vocab_size == len(load_backbone(chat_checkpoint,
                                                                                    template=CHAT).vocab) + 1


def test_appended_rows_start_at_the_mean_row_and_the_recipe_centres_on_it(chat_checkpoint):
    from tokweight.training.cvae.model import add_latent_tokens, spread_latent_embeddings

    ckpt = load_backbone(chat_checkpoint, template=CHAT)
    old_in = ckpt.model.wte.weight.detach().clone()
    old_out = ckpt.model.model.get_output_embeddings().weight.detach().clone()
    vocab = add_latent_tokens(ckpt.model, ckpt.vocab, 3)
    ids = [vocab.latent_id(k) for k in range(3)]
    torch.testing.assert_close(ckpt.model.wte.weight[: len(old_in)], old_in)
    torch.testing.assert_close(ckpt.model.wte.weight[ids], old_in.mean(0).expand(3, -1))
    torch.testing.assert_close(ckpt.model.model.get_output_embeddings().weight[ids], old_out.mean(0).expand(3, -1))
    spread_latent_embeddings(ckpt.model, ids, 1.0, torch.Generator().manual_seed(0), center=True)
    rows = ckpt.model.wte.weight[ids].detach().double()
    offsets = rows - old_in.mean(0).double()
    torch.testing.assert_close(offsets.norm(dim=1), torch.ones(3, dtype=torch.float64), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- bad input, one line naming what to do


def test_a_tokenizer_without_a_chat_template_is_named(tmp_path):
    ckpt = save_chat_checkpoint(tmp_path / "plain", chat_template=None)
    with pytest.raises(ValueError, match=r"--template chat, but the tokenizer has no chat template .*set one, or "
                                         r"pass --template FILE") as error:
        load_backbone(ckpt, template=CHAT)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("text,missing", [("Question: {x}\nAnswer:", "{y}"), ("Answer: {y}", "{x}")])
def test_a_string_template_without_x_or_y_is_named(text, missing, tmp_path):
    from tokweight.pipeline.tokens.templates import template_option

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"text": text, "end": "<|endoftext|>"}))
    with pytest.raises(ValueError, match=re.escape(f"{path}: 'text' holds 0 {missing}: write the format once")) as error:
        template_option(str(path))
    assert "\n" not in str(error.value)


def test_token_list_data_under_a_chat_template_is_named(chat_checkpoint, tmp_path):
    write_shards([Sample(key="listy", x="what is 1 plus 2?", y=("3", "is"))], tmp_path / "data", shard_size=8)
    with pytest.raises(SampleError, match=r"y is a list of tokens, but the checkpoint's chat template renders text: "
                                          r"give x and y as strings .*key 'listy'"):
        extract_into(chat_checkpoint, tmp_path / "data", tmp_path / "store", "chat")


def test_the_built_in_template_on_a_chat_tokenizer_points_to_template_chat(chat_checkpoint):
    with pytest.raises(ValueError, match=r"template token '<bos>' .* or extract with --template chat"):
        load_backbone(chat_checkpoint)


def test_a_tokweight_checkpoint_refuses_a_chat_template(tiny):
    with pytest.raises(ValueError, match="has a symbol vocabulary and no tokenizer to render a chat template"):
        load_backbone(tiny[1], template=CHAT)


def test_a_copied_checkpoint_keeps_its_fingerprint_in_each_template(chat_checkpoint, tmp_path):
    copy = shutil.copytree(chat_checkpoint, tmp_path / "copy")
    assert load_backbone(copy, template=CHAT).fingerprint == load_backbone(chat_checkpoint, template=CHAT).fingerprint


def test_extract_cli_takes_a_template_file(text_checkpoint, text_data, text_template, text_store, tmp_path):
    from click.testing import CliRunner

    from tokweight.cli import main

    args = ["extract", "--checkpoint", str(text_checkpoint), "--data", str(text_data / "val"), "--store",
            str(tmp_path / "store"), "--template", str(text_template), "--no-progress", "--no-reader-process"]
    assert CliRunner().invoke(main, args).exit_code == 0
    view = BaselineStore(tmp_path / "store").open()
    assert view.fingerprint == BaselineStore(text_store).open().fingerprint and view.manifest["template"]["kind"] == "text"
    missing = CliRunner().invoke(main, [*args[:-4], "--template", str(tmp_path / "none.json")])
    assert missing.exit_code != 0 and "neither 'tokweight', 'chat' nor a template file" in missing.output
