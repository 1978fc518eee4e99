"""`tokweight export`: for every backbone (built-in, GPT-2, Llama, a chat model) and exportable z pathway, greedy
generation through stock transformers (AutoModelForCausalLM and AutoTokenizer from the exported directory, no
custom code), with export.json's prompt and answer prefix, is `tokweight generate`'s output for every latent value,
token for token. The memory pathway is refused in one line. Runs of 2 steps on the tiny fixtures."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.tokens.templates import template_ids
from tokweight.training.config.components import CVAEConfig, LoRAConfig
from tokweight.training.decoding.decode import latent_values, prompt_maker
from tokweight.training.decoding.encode import load_trained
from tokweight.training.config.use import GenerateConfig
from tokweight.training.decoding.generate import in_form, run as generate
from tokweight.training.loop.train import run as train
from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig
from tokweight.training.loop.train_base import load_split

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

CONTINUOUS = dict(latent="continuous", z_dim=2)
CASES = {  # name: (backbone, CVAEConfig fields, LoRA rank)
    "builtin-token": ("builtin", dict(cond="token"), 0),
    "builtin-prefix": ("builtin", dict(cond="prefix", slots=2, k=3), 0),
    "builtin-query": ("builtin", dict(cond="query"), 0),
    "builtin-layernorm": ("builtin", dict(cond="layernorm", k=2), 0),
    "builtin-prefix-continuous": ("builtin", dict(cond="prefix", slots=2, **CONTINUOUS), 0),
    "builtin-layernorm-continuous": ("builtin", dict(cond="layernorm", **CONTINUOUS), 0),
    "gpt2-query": ("gpt2", dict(cond="query", k=2), 0),
    "gpt2-token-continuous": ("gpt2", dict(cond="token", **CONTINUOUS), 0),
    "llama-token": ("llama", dict(cond="token", k=2), 0),
    "llama-query": ("llama", dict(cond="query", k=2), 0),
    "chat-token": ("chat", dict(cond="token", k=2), 0),
    "chat-query": ("chat", dict(cond="query", k=2), 0),
    "text-prefix": ("text", dict(cond="prefix", slots=2, k=2), 0),
}
LINES = 8  # inputs generated per case
MAX_NEW = 12


def extracted(ckpt, data, template, root):
    from tokweight.pipeline.extract.config import ExtractConfig
    from tokweight.pipeline.extract.extract import run as extract

    extract(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(root / "store"), template=str(template),
                          progress=False, reader_process=False))
    return root / "store"


@pytest.fixture(scope="module")
def chat_store(chat_checkpoint, text_data, tmp_path_factory):
    return extracted(chat_checkpoint, text_data, "chat", tmp_path_factory.mktemp("export_chat_store"))


@pytest.fixture(scope="module")
def text_store(text_checkpoint, text_data, text_template, tmp_path_factory):
    return extracted(text_checkpoint, text_data, text_template, tmp_path_factory.mktemp("export_text_store"))


def where(backbone, request):
    """(checkpoint, data, store) of a backbone: the built-in base model sure of y after its first two tokens (so
    that decodes are whole sequences), the tiny HF models over the tiny data, the chat model and a GPT-2 with a
    string template over string data; b from the store for the chat model and the GPT-2 with a string template, from
    the run's own backbone (the dynamic policy) for the others."""
    tiny = request.getfixturevalue("tiny")
    if backbone == "builtin":
        data, ckpt = request.getfixturevalue("two_regime")
        return ckpt, data, None
    if backbone in ("chat", "text"):
        return (request.getfixturevalue(f"{backbone}_checkpoint"), request.getfixturevalue("text_data"),
                request.getfixturevalue(f"{backbone}_store"))
    return request.getfixturevalue("hf_checkpoints")[backbone], tiny[0], None


def trained(name, request, root, case=None) -> tuple:
    """(run dir, data) of a 2-step run of ``case`` (backbone, CVAEConfig fields, LoRA rank): CASES[name] by
    default."""
    backbone, cvae, rank = case or CASES[name]
    ckpt, data, store = where(backbone, request)
    out = root / name
    train(TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), out=str(out), store=store and str(store),
                               num_workers=0, device="cpu"),
                      cvae=CVAEConfig(**cvae), lora=LoRAConfig(rank=rank),
                      loss=LossConfig(policy="precomputed" if store else "dynamic"),
                      optim=OptimConfig(steps=2, batch_size=8, lr=3e-3),
                      log=LogConfig(log_every=1, grad_diag_every=0, eval_every=0)))
    return out, data


def exported(run_dir, data, continuous: bool, root) -> tuple:
    """(the export directory, its export.json) of `tokweight export` on a trained run."""
    export = root / "export"
    args = ["export", "--run", str(run_dir), "--out", str(export)] + (
        ["--data", str(data), "--split", "val"] if continuous else [])
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return export, json.loads((export / "export.json").read_text())


def exported_prompt(spec: dict, tok, x) -> str:
    """export.json's prompt for x: the chat template's user turn, or the text around x (a symbol list joined by
    spaces)."""
    if "chat" in spec["prompt"]:
        return tok.apply_chat_template([{"role": "user", "content": x}], add_generation_prompt=True, tokenize=False)
    return spec["prompt"]["text"].replace("{x}", x if isinstance(x, str) else " ".join(x))


def load_full(export_dir, spec: dict, value: dict) -> tuple:
    """(model, tokenizer, generation config) of a full-weight entry: AutoModelForCausalLM and AutoTokenizer from
    its directory, its own generation_config.json."""
    assert value["adapter"] is None
    path = export_dir / value["model"]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path, local_files_only=True), None


def generated_by_transformers(export_dir, xs, load=load_full) -> list[list]:
    """Per value, per x: the greedy continuation's tokens (up to the end token, excluded), or its text for a
    string x, through the stock libraries alone (``load``)."""
    spec = json.loads((export_dir / "export.json").read_text())
    outputs = []
    for value in spec["values"]:
        model, tok, gen = load(export_dir, spec, value)
        end = tok.convert_tokens_to_ids(spec["end_token"])
        rows = []
        for x in xs:
            text = exported_prompt(spec, tok, x) + value["answer_prefix"]
            ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            new = model.generate(input_ids=ids, generation_config=gen, max_new_tokens=MAX_NEW)
            new = new[0, ids.shape[1]:].tolist()
            new = new[: new.index(end)] if end in new else new
            rows.append(tok.decode(new) if isinstance(x, str) else tok.convert_ids_to_tokens(new))
        outputs.append(rows)
    return outputs


def generated_by_tokweight(run_dir, data, xs, tmp_path, continuous=None) -> list[list]:
    """Per value, per x: `tokweight generate`'s greedy output (a continuous latent's centres from data's val
    split; ``continuous`` None: as CASES says)."""
    if continuous is None:
        continuous = CASES[run_dir.name][1].get("latent") == "continuous"
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"x": x}) + "\n" for x in xs))
    generate(GenerateConfig(run=str(run_dir), input=str(tmp_path / "in.jsonl"), out=str(tmp_path / "out.jsonl"),
                            max_new_tokens=MAX_NEW, device="cpu", data=str(data), split="val")
             if continuous else
             GenerateConfig(run=str(run_dir), input=str(tmp_path / "in.jsonl"), out=str(tmp_path / "out.jsonl"),
                            max_new_tokens=MAX_NEW, device="cpu"))
    lines = [json.loads(line)["outputs"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    return [[line[v] for line in lines] for v in range(len(lines[0]))]


@pytest.mark.parametrize("name", list(CASES))
def test_transformers_greedy_generation_is_tokweight_generate_for_every_value(name, request, tmp_path):
    run_dir, data = trained(name, request, tmp_path)
    continuous = CASES[name][1].get("latent") == "continuous"
    export, spec = exported(run_dir, data, continuous, tmp_path)
    K = len(spec["values"])
    assert K == (4 if continuous else CASES[name][1].get("k", 4)) and spec["pathway"] == CASES[name][1]["cond"]
    shared = {v["model"] for v in spec["values"]}
    assert shared == ({"model"} if spec["pathway"] in ("token", "prefix") else {f"value_{v}" for v in range(K)})
    xs = [s.x for s in load_split(data, "val")[:LINES]]
    ours = generated_by_tokweight(run_dir, data, xs, tmp_path)
    assert generated_by_transformers(export, xs) == ours
    assert sum(len(y) > 1 for rows in ours for y in rows) >= K  # sequences, not only empty decodes
    if not continuous:
        assert_logits_are_the_decoders(run_dir, export, load_split(data, "val")[0])


def assert_logits_are_the_decoders(run_dir, export_dir, sample, load=load_full):
    """Teacher-forced over x's prompt and y: the exported model's input ids are those the CVAE's decoder reads under
    each value, and its logits over the run's vocabulary are the decoder's at every position (1e-4)."""
    _, model, vocab, _ = load_trained(str(run_dir), "cpu", "float32")
    z, slot_ids = latent_values(model, None)
    prompt = prompt_maker(vocab, model.conditioning.slots)(sample.x, sample.key)  # generate's
    full, layout = template_ids(vocab, sample.x, sample.y, [vocab.latent_id(0)], key=sample.key)
    ids = torch.tensor([[*prompt.ids, *full[layout.s_start: layout.s_start + layout.T]]])  # y through its end token
    slot_pos = torch.tensor([list(prompt.slot_positions)])
    spec = json.loads((export_dir / "export.json").read_text())
    for value in spec["values"]:
        v = value["value"]
        inputs, kwargs = model.conditioning.decoder_inputs(model.backbone, ids, slot_pos, z[v:v + 1], slot_ids[v:v + 1])
        with torch.no_grad():
            ours = model.backbone(inputs, **kwargs)[0][0]  # (L, V)
        hf, tok, _ = load(export_dir, spec, value)
        text = exported_prompt(spec, tok, sample.x) + value["answer_prefix"]
        hf_ids = tok(text, add_special_tokens=False)["input_ids"] + ids[0, len(prompt.ids):].tolist()
        assert hf_ids == inputs[0].tolist()
        with torch.no_grad():
            theirs = hf(torch.tensor([hf_ids])).logits[0, :, : ours.shape[1]]
        torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)


def test_the_memory_pathway_is_refused_in_one_line(tiny, tiny_store, tmp_path):
    out = tmp_path / "run"
    train(TrainConfig(IOConfig(checkpoint=str(tiny[1]), data=str(tiny[0]), out=str(out), store=str(tiny_store),
                               num_workers=0, device="cpu"),
                      cvae=CVAEConfig(cond="memory", k=2), optim=OptimConfig(steps=1, batch_size=8),
                      log=LogConfig(log_every=1, grad_diag_every=0, eval_every=0)))
    result = CliRunner().invoke(main, ["export", "--run", str(out), "--out", str(tmp_path / "export")])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "memory z pathway" in result.output and "--cond token, prefix, query, layernorm" in result.output
    assert not (tmp_path / "export").exists()


def test_export_imports_no_exporter_until_asked():
    """`tokweight generate --help` and the CLI's import leave training.export.cvae unimported."""
    import subprocess
    import sys

    code = ("import sys, tokweight.cli; from click.testing import CliRunner; "
            "CliRunner().invoke(tokweight.cli.main, ['generate', '--help']); "
            "print('tokweight.training.export.cvae' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
