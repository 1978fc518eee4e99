"""Hugging Face checkpoints through stage one: parity with transformers, fingerprints, bad input."""

import json
import shutil

import numpy as np
import pytest
import torch

from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run as extract
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import iter_samples, write_shards
from tokweight.pipeline.tokens.templates import template_ids
from tokweight.store.baseline_store import BaselineStore
from tests.support.fixtures_hf import ARCHITECTURES, save_hf_checkpoint

transformers = pytest.importorskip("transformers")


def extract_into(ckpt, data, store, **kw) -> dict:
    return extract(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(store), progress=False,
                                 reader_process=False, **kw))


def stored_rows(store, split_dir) -> dict[str, np.ndarray]:
    view = BaselineStore(store).open()
    rows = {}
    for url in sorted(split_dir.glob("*.tar")):
        rows |= {key: row["b"] for key, row in view.rows_for_shard(url).items()}
    return rows


def direct_b(model, vocab, sample: Sample) -> np.ndarray:
    """-log p(S) from a plain transformers forward over the whole z-free sequence."""
    ids, layout = template_ids(vocab, sample.x, sample.y)
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return np.array([-logp[p - 1, ids[p]].item() for p in layout.s_positions()], dtype=np.float32)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_stored_b_equals_a_direct_transformers_forward(arch, tiny, hf_checkpoints, tmp_path):
    data = tiny[0]
    summary = extract_into(hf_checkpoints[arch], data / "val", tmp_path / "store")
    ckpt = load_backbone(hf_checkpoints[arch])
    assert summary["fingerprint"] == ckpt.fingerprint and summary["parts_written"] == 1
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_checkpoints[arch], local_files_only=True).eval()
    rows = stored_rows(tmp_path / "store", data / "val")
    samples = [s for _, s in iter_samples(sorted((data / "val").glob("*.tar")))]
    assert len(rows) == len(samples) == 128
    for sample in samples:
        np.testing.assert_allclose(rows[sample.key], direct_b(model, ckpt.vocab, sample), atol=1e-5, rtol=0)


def test_export_hf_round_trip_gives_the_native_stores_b(tiny, tiny_store, tmp_path):
    """The built-in base model, exported and extracted through the HF path: the same b for every key."""
    from tokweight.training.export.checkpoint import export_hf

    data, ckpt = tiny
    exported = export_hf(ckpt, tmp_path / "exported")
    assert load_backbone(exported).fingerprint != load_backbone(ckpt).fingerprint  # another checkpoint format
    extract_into(exported, data, tmp_path / "store")
    for split in ("train", "val", "test"):
        native, via_hf = stored_rows(tiny_store, data / split), stored_rows(tmp_path / "store", data / split)
        assert native.keys() == via_hf.keys() and native
        for key in native:
            np.testing.assert_allclose(via_hf[key], native[key], atol=1e-5, rtol=0, err_msg=key)


def test_the_store_vocab_view_shows_the_tokenizers_tokens(tiny, hf_checkpoints, tmp_path):
    extract_into(hf_checkpoints["llama"], tiny[0] / "val", tmp_path / "store")
    view = BaselineStore(tmp_path / "store").open()
    assert view.vocab_tokens() == list(load_backbone(hf_checkpoints["llama"]).vocab.tokens)


def test_a_changed_tokenizer_or_template_is_another_fingerprint(hf_checkpoints, tmp_path):
    original = load_backbone(hf_checkpoints["gpt2"]).fingerprint
    renamed = shutil.copytree(hf_checkpoints["gpt2"], tmp_path / "renamed")
    (renamed / "tokweight_template.json").write_text(json.dumps({"<bos>": "<eos>"}))
    assert load_backbone(renamed).fingerprint != original
    retok = shutil.copytree(hf_checkpoints["gpt2"], tmp_path / "retok")
    config = json.loads((retok / "tokenizer_config.json").read_text())
    (retok / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    assert load_backbone(retok).fingerprint != original
    assert load_backbone(shutil.copytree(hf_checkpoints["gpt2"], tmp_path / "same")).fingerprint == original


def test_the_template_file_renames_tokens(hf_checkpoints, tmp_path):
    renamed = shutil.copytree(hf_checkpoints["gpt2"], tmp_path / "renamed")
    (renamed / "tokweight_template.json").write_text(json.dumps({"<bos>": "<eos>"}))
    vocab = load_backbone(renamed).vocab
    assert vocab.id("<bos>") == vocab.id("<eos>") == 2


def test_text_samples_are_encoded_by_the_tokenizer(hf_checkpoints, tmp_path):
    """x and y as strings: S is exactly y's tokens plus </y>."""
    write_shards([Sample(key="t0", x="a b c", y="c b"), Sample(key="t1", x=("a",), y=("b", "c", "d"))],
                 tmp_path / "data", shard_size=8)
    extract_into(hf_checkpoints["llama"], tmp_path / "data", tmp_path / "store")
    view = BaselineStore(tmp_path / "store").open()
    rows = view.rows_for_shard(next((tmp_path / "data").glob("*.tar")))
    vocab = load_backbone(hf_checkpoints["llama"]).vocab
    assert rows["t0"]["T"] == 3 and rows["t1"]["T"] == 4
    assert rows["t0"]["target_id"].tolist() == [vocab.tokenizer.convert_tokens_to_ids(t) for t in ("c", "b", "</y>")]


def test_bf16_forward_is_recorded_and_close(tiny, hf_checkpoints, tmp_path):
    from click.testing import CliRunner

    from tokweight.cli import main

    extract_into(hf_checkpoints["llama"], tiny[0] / "val", tmp_path / "f32")
    args = ["extract", "--checkpoint", str(hf_checkpoints["llama"]), "--data", str(tiny[0] / "val"), "--store",
            str(tmp_path / "bf16"), "--dtype", "bfloat16", "--no-progress", "--no-reader-process"]
    assert CliRunner().invoke(main, args).exit_code == 0
    view = BaselineStore(tmp_path / "bf16").open()
    assert view.manifest["extract_config"]["dtype"] == "bfloat16"
    full, half = stored_rows(tmp_path / "f32", tiny[0] / "val"), stored_rows(tmp_path / "bf16", tiny[0] / "val")
    assert max(np.abs(full[k] - half[k]).max() for k in full) < 0.1  # bf16 keeps ~3 significant digits


# ---------------------------------------------------------------- bad input, named


def hf_dir_without(hf_dir, tmp_path, token: str):
    """The checkpoint with ``token`` dropped from the tokenizer (it then splits into pieces or unk)."""
    from tests.support.fixtures_hf import word_level_tokenizer

    out = shutil.copytree(hf_dir, tmp_path / "broken")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / name).unlink(missing_ok=True)
    tokens = [t if t != token else "<unused>" for t in load_backbone(hf_dir).vocab.tokens]
    word_level_tokenizer(tokens, out, [t for t in tokens if t.startswith("<")])
    return out


def test_a_template_token_missing_from_the_tokenizer_is_named(hf_checkpoints, tmp_path):
    broken = hf_dir_without(hf_checkpoints["gpt2"], tmp_path, "</y>")
    with pytest.raises(ValueError, match=r"template token '</y>' \('</y>'\) is not one token of the tokenizer"):
        load_backbone(broken)


def test_pickled_weights_only_are_refused(hf_checkpoints, tmp_path):
    out = shutil.copytree(hf_checkpoints["gpt2"], tmp_path / "pickled")
    (out / "model.safetensors").rename(out / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"only pickled weights \(pytorch_model.bin\); tokweight never unpickles"):
        load_backbone(out)


def test_a_sample_longer_than_the_context_is_named(tmp_path, tiny):
    tokens = list(load_backbone(tiny[1]).vocab.tokens)
    ckpt = save_hf_checkpoint("llama", tokens, [t for t in tokens if t.startswith("<")], tmp_path / "short",
                              block_size=12)
    write_shards([Sample(key="long", x=("a",) * 8, y=("b",) * 4)], tmp_path / "data", shard_size=8)
    with pytest.raises(Exception, match=r"exceeds the model context of 12 .*key 'long'"):
        extract_into(ckpt, tmp_path / "data", tmp_path / "store")


def test_a_directory_that_is_no_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a tokweight checkpoint"):
        load_backbone(tmp_path)


def test_the_native_path_never_imports_transformers(tiny, tiny_store, tmp_path):
    """transformers is the optional [hf] extra: extraction and training of a tokweight checkpoint run without it."""
    import subprocess
    import sys

    data, ckpt = tiny
    code = ("import sys, torch; torch.set_num_threads(1)\n"
            "from tokweight.pipeline.extract.extract import run as extract\n"
            "from tokweight.pipeline.extract.config import ExtractConfig\n"
            "from tokweight.training.loop.train import run\n"
            "from tokweight.training.config.train import IOConfig, OptimConfig, LogConfig, TrainConfig\n"
            f"extract(ExtractConfig(checkpoint={str(ckpt)!r}, data={str(data)!r}, store={str(tmp_path / 's')!r}, "
            "progress=False, reader_process=False))\n"
            f"run(TrainConfig(IOConfig(checkpoint={str(ckpt)!r}, data={str(data)!r}, store={str(tiny_store)!r}, "
            f"out={str(tmp_path / 'run')!r}, num_workers=0), optim=OptimConfig(steps=1, batch_size=4), "
            "log=LogConfig(grad_diag_every=0)))\n"
            "assert not {'transformers', 'tokenizers'} & set(sys.modules), 'imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_inspect_reports_on_an_hf_store(tiny, hf_checkpoints, tmp_path):
    from tokweight.report.inspect_config import InspectConfig
    from tokweight.report.inspect import run as inspect

    extract_into(hf_checkpoints["gpt2"], tiny[0] / "val", tmp_path / "store")
    summary = inspect(InspectConfig(store=str(tmp_path / "store"), out=str(tmp_path / "report"), data=str(tiny[0])))
    assert summary["fingerprints"][0]["fingerprint"] == load_backbone(hf_checkpoints["gpt2"]).fingerprint
    assert (tmp_path / "report" / "report.md").is_file()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_whole_sequences_run_through_a_cache_that_keeps_nothing(arch, hf_checkpoints, monkeypatch):
    """``HFBackbone.hidden`` hands transformers a cache (no position ids read back) that keeps no layer's keys and
    values: a forward without a graph holds none of them to its end. Its states are those of a kept cache."""
    from tokweight.pipeline.models import hf

    backbone = load_backbone(hf_checkpoints[arch]).model
    ids = torch.randint(0, backbone.cfg.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    made = []
    monkeypatch.setattr(hf, "passing_cache", lambda config: made.append(hf._passing_cache_class()(config=config))
                        or made[-1])
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            states = backbone.hidden(ids)
            kept = transformers.DynamicCache(config=backbone.model.config)
            reference = backbone.model.base_model(input_ids=ids, **{backbone.cache_kwarg: kept}).last_hidden_state
        assert made[-1].get_seq_length() == 0 and kept.get_seq_length() == 11
        assert torch.equal(states, reference)
