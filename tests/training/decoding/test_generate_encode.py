"""`tokweight generate` and `tokweight encode` on runs of a few steps: generate's greedy outputs are eval's
decodes, its sampling is seeded; encode's rows are eval's posteriors, and `tokweight sql --run` joins them
with the store."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import torch
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.data.shards import iter_shard, write_shards
from tokweight.training.evaluation import evaluate
from tokweight.training.config.components import CVAEConfig, EStepConfig
from tokweight.pipeline.data.splits import split_urls
import tokweight.training.decoding.encode as encode_module
from tokweight.training.objective.baselines import make_baseline
from tokweight.training.config.use import EncodeConfig
from tokweight.training.decoding.encode import run as encode
from tokweight.training.config.use import EvalConfig
from tokweight.training.evaluation.evaluate import run_eval
from tokweight.training.export.checkpoint import export_hf
from tokweight.training.config.use import GenerateConfig
from tokweight.training.decoding.generate import run as generate
from tokweight.training.loop.run_dir import read_config
from tokweight.training.objective.schedules import Schedule
from tokweight.training.loop.train import run as train
from tokweight.training.config.train import IOConfig, LossConfig, OptimConfig, TrainConfig

DECODED = 8  # examples eval decodes (all of them in eval.json's sample_outputs)
KINDS = {"discrete": CVAEConfig(), "continuous": CVAEConfig(latent="continuous", z_dim=2)}
READING = "discrete, reading the likelihood"  # hardened from step 0: the posterior reads y's likelihood


def trained_and_evaluated(data, ckpt, store, out, cvae: CVAEConfig, split: str = "test",
                          estep: EStepConfig = EStepConfig()):
    """Train 3 steps (b from the store, or without one from the frozen base), evaluate on ``split``; returns
    eval's pass records (captured from run_eval)."""
    policy = "frozen" if store is None else "precomputed"
    train(TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), out=str(out), store=store and str(store),
                               num_workers=0),
                      cvae=cvae, loss=LossConfig(policy=policy), optim=OptimConfig(steps=3, batch_size=8),
                      estep=estep))
    captured = []

    def spy(*args, **kwargs):
        captured.append(evaluate_pass(*args, **kwargs))
        return captured[-1]

    evaluate_pass = evaluate.evaluate_pass
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(evaluate, "evaluate_pass", spy)
        run_eval(EvalConfig(run=str(out), data=str(data), split=split, decode_examples=DECODED, device="cpu"))
    return captured[0]


@pytest.fixture(scope="module")
def runs(tiny, tiny_store, tmp_path_factory):
    """latent kind -> (run dir, eval's records of the test split)."""
    data, ckpt = tiny
    root = tmp_path_factory.mktemp("use")
    made = {kind: (root / kind, trained_and_evaluated(data, ckpt, tiny_store, root / kind, cvae))
            for kind, cvae in KINDS.items()}
    made[READING] = (root / "reading", trained_and_evaluated(data, ckpt, tiny_store, root / "reading", CVAEConfig(),
                                                             estep=EStepConfig(harden_from=0)))
    return made


@pytest.fixture(scope="module")
def confident_runs(two_regime, tmp_path_factory):
    """latent kind -> run dir evaluated on val, over a base model sure of y after its first two tokens (so that
    decodes are whole sequences, not the one or two tokens the tiny base model emits)."""
    data, ckpt = two_regime
    root = tmp_path_factory.mktemp("confident")
    for kind, cvae in KINDS.items():
        trained_and_evaluated(data, ckpt, None, root / kind, cvae, split="val")
    return {kind: root / kind for kind in KINDS}


def first_test_samples(data, n, split="test"):
    return [s for url in split_urls(data, split) for _, s in iter_shard(url)][:n]


def write_inputs(path, samples, *, with_y=True):
    """One line per sample; a y is there (generate ignores it) on every other line."""
    lines = [{"key": s.key, "x": list(s.x), **({"y": list(s.y)} if with_y and i % 2 else {})}
             for i, s in enumerate(samples)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def generated(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_greedy_outputs_are_evals_decodes(confident_runs, two_regime, tmp_path, kind):
    run_dir, data = confident_runs[kind], two_regime[0]
    samples = first_test_samples(data, DECODED, "val")
    max_new = max(len(s.y) for s in samples) + 2  # eval's own bound on these examples
    result = generate(GenerateConfig(run=str(run_dir), input=str(write_inputs(tmp_path / "in.jsonl", samples)),
                                     out=str(tmp_path / "out.jsonl"), max_new_tokens=max_new, device="cpu",
                                     data=str(data) if kind == "continuous" else None, split="val"))
    lines = generated(tmp_path / "out.jsonl")
    assert result["lines"] == DECODED and result["decoding"] == "greedy" and result["latent_values"] == 4
    assert [(line["line"], line["key"]) for line in lines] == [(i + 1, s.key) for i, s in enumerate(samples)]
    evaluated = {row["key"]: row for row in json.loads((run_dir / "eval.json").read_text())["decode"]["sample_outputs"]}
    for line in lines:
        assert len(line["outputs"]) == 4 and all(isinstance(y, list) for y in line["outputs"])
        assert [" ".join(y) for y in line["outputs"]] == [out["y"] for out in evaluated[line["key"]]["outputs"]]
    assert min(len(y) for line in lines for y in line["outputs"]) >= 5  # sequences (y has 12 symbols), not a token


def test_generate_stops_at_a_finite_length_by_default():
    """A decode that never writes </y> stops at max_new_tokens, not at the end of a real model's 32k-131k context."""
    default = GenerateConfig(run="r", input="i", out="o").max_new_tokens
    assert isinstance(default, int) and 1 <= default <= 1024
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        GenerateConfig(run="r", input="i", out="o", max_new_tokens=0)


def test_sampling_is_seeded_and_a_high_temperature_differs_across_seeds(runs, tiny, tmp_path):
    run_dir, _ = runs["discrete"]
    inputs = write_inputs(tmp_path / "in.jsonl", first_test_samples(tiny[0], 4), with_y=False)

    def sample(seed, name):
        generate(GenerateConfig(run=str(run_dir), input=str(inputs), out=str(tmp_path / name), temperature=50.0,
                                seed=seed, max_new_tokens=6, batch_size=3, device="cpu"))
        return [line["outputs"] for line in generated(tmp_path / name)]

    first, again, other = sample(0, "a.jsonl"), sample(0, "b.jsonl"), sample(1, "c.jsonl")
    assert first == again and first != other
    assert all(len(outs) == 4 and all(len(y) <= 6 for y in outs) for outs in first)
    assert len({tuple(y) for outs in first for y in outs}) > 4  # near-uniform draws: the outputs vary


def test_encode_rows_are_evals_posteriors_by_key(runs, tiny):
    """Key by key; a run whose posterior reads the likelihood where q* is sure is passed b as eval took it (the
    store's), since q* reads b; the others b from the run's own backbone, which q never reads."""
    assert Schedule.of(read_config(runs[READING][0])).at(2).reads_likelihood
    assert not Schedule.of(read_config(runs["discrete"][0])).at(2).reads_likelihood  # the starts not yet compared
    for kind, (run_dir, records) in runs.items():
        policies = []
        with pytest.MonkeyPatch.context() as mp:  # which b the pass reads: the store's where q* decides the read
            mp.setattr(encode_module, "make_baseline", lambda policy, model: policies.append(policy) or
                       make_baseline(policy, model))
            result = encode(EncodeConfig(run=str(run_dir), data=str(tiny[0]), split="test", batch_size=32,
                                         device="cpu"))
        assert policies == ["precomputed" if kind == READING else "dynamic"]
        table = pq.read_table(run_dir / "posteriors-test.parquet").to_pylist()
        assert result["examples"] == len(table) == len(records.rows["key"]) == 128
        rows = {row["key"]: row for row in table}
        post = np.stack(records.rows["post"])
        _, clusters = evaluate.split_clusters(post, CVAEConfig(latent=kind.split(",")[0]), 0)
        for i, key in enumerate(records.rows["key"]):
            row = rows[key]
            assert row["split"] == "test" and row["strategy"] == records.rows["strategy"][i]
            assert row["latent"] == clusters[i] and row["kl"] == pytest.approx(records.rows["kl"][i], abs=1e-5)
            if kind != "continuous":
                np.testing.assert_allclose(row["q"], post[i], atol=1e-6)
                assert row["latent"] == int(np.argmax(row["q"]))
            else:
                np.testing.assert_allclose(row["mu"], post[i], atol=1e-6)
                np.testing.assert_allclose(np.log(np.square(row["sigma"])), records.rows["logvar"][i], atol=1e-5)


def test_sql_joins_the_posteriors_with_the_store_by_key(runs, tiny, tiny_store, tmp_path):
    run_dir, _ = runs["discrete"]
    bare = tmp_path / "bare"
    bare.mkdir()
    refused = CliRunner().invoke(main, ["sql", str(tiny_store), "SELECT 1", "--run", str(bare)])
    assert refused.exit_code == 1 and f"tokweight encode --run {bare}" in refused.output
    encode(EncodeConfig(run=str(run_dir), data=str(tiny[0]), split="val", device="cpu"))
    encode(EncodeConfig(run=str(run_dir), data=str(tiny[0]), split="test", device="cpu"))
    query = ("SELECT p.split, count(*) AS n, count(DISTINCT p.key) AS keys, sum((e.T = len(e.b))::INT)::BIGINT AS whole "
             "FROM examples e JOIN posteriors p USING (fingerprint, key) GROUP BY p.split ORDER BY p.split")
    result = CliRunner().invoke(main, ["sql", str(tiny_store), query, "--run", str(run_dir), "--format", "json"])
    assert result.exit_code == 0, result.output
    counts = {row["split"]: row for row in json.loads(result.output)}
    sizes = {split: len(pq.read_table(run_dir / f"posteriors-{split}.parquet")) for split in ("val", "test")}
    assert set(counts) == {"val", "test"}
    for split, row in counts.items():
        assert row["n"] == row["keys"] == row["whole"] == sizes[split]
    described = CliRunner().invoke(main, ["sql", str(tiny_store), "--run", str(run_dir)]).output
    assert "posteriors:" in described and "  q " in described


def invoke_generate(run_dir, path, out, *extra):
    return CliRunner().invoke(main, ["generate", "--run", str(run_dir), "--input", str(path), "--out", str(out),
                                     "--device", "cpu", *extra])


@pytest.mark.parametrize("line, message", [
    ('{"key": "a", "y": ["a"]}', 'line 2 (key \'a\'): no "x"; give the input as "x": a list of symbols'),
    ('{"key": "a", "x": "a b"}', "line 2 (key 'a'): x is a string, but this vocabulary has no tokenizer"),
    ('{"x": ["no-such-symbol"]}', "line 2: unknown symbol 'no-such-symbol' in 'x'; x must use the run's vocabulary"),
    ('{"x": 3}', 'line 2: "x" is a int; give it as "x": a list of symbols'),
    ('["a"]', "line 2: a JSON list, not an object"),
    ("{x", "line 2: not JSON"),
    (json.dumps({"x": ["a"] * 4096}), "line 2: x makes a prompt of 4103 tokens, and the backbone's context is"),
])
def test_bad_input_is_one_line_naming_the_file_and_line(runs, tiny, tmp_path, line, message):
    run_dir, _ = runs["discrete"]
    good = json.dumps({"x": list(first_test_samples(tiny[0], 1)[0].x)})
    path = tmp_path / "in.jsonl"
    path.write_text(f"{good}\n{line}\n")
    result = invoke_generate(run_dir, path, tmp_path / "out.jsonl")
    assert result.exit_code == 1 and f"{path} {message}" in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out.jsonl").exists()


def test_a_run_without_a_checkpoint_and_missing_centres_say_what_to_do(runs, tiny, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"x": list(first_test_samples(tiny[0], 1)[0].x)}) + "\n")
    empty = tmp_path / "empty-run"
    empty.mkdir()
    result = invoke_generate(empty, path, tmp_path / "out.jsonl")
    assert result.exit_code == 1 and f"train one with `tokweight train --out {empty}`" in result.output
    result = invoke_generate(runs["continuous"][0], path, tmp_path / "out.jsonl")
    assert result.exit_code == 1 and "has a continuous latent" in result.output and "give --data DATA" in result.output
    result = invoke_generate(runs["discrete"][0], path, tmp_path / "out.jsonl", "--data", str(tiny[0]))
    assert result.exit_code == 1 and "leave --data out" in result.output
    result = CliRunner().invoke(main, ["encode", "--run", str(empty), "--data", str(tiny[0])])
    assert result.exit_code == 1 and "no checkpoint/state.json" in result.output


def test_a_tokenizer_run_on_string_data_generates_strings(two_regime, tmp_path):
    """The confident base model exported as a GPT-2 with its tokenizer, a CVAE trained on x and y as strings: a
    string x gets detokenized strings, a list x token lists, and both are eval's decodes."""
    pytest.importorskip("transformers")
    data, ckpt = two_regime
    hf = export_hf(ckpt, tmp_path / "hf")
    text = tmp_path / "text"
    for split in ("train", "val"):
        samples = [replace(s, x=" ".join(s.x), y=" ".join(s.y)) for s in first_test_samples(data, 128, split)]
        write_shards(samples, text / split, shard_size=64)
    run_dir = tmp_path / "run"
    trained_and_evaluated(text, hf, None, run_dir, CVAEConfig(k=2, cond="prefix", slots=2), split="val")
    samples = first_test_samples(text, 4, "val")
    lines = [{"key": s.key, "x": s.x} for s in samples] + [{"x": s.x.split()} for s in samples[:1]]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    max_new = max(len(s.y.split()) for s in samples) + 2  # eval's bound: y's tokens (one per symbol here) + 2
    generate(GenerateConfig(run=str(run_dir), input=str(tmp_path / "in.jsonl"), out=str(tmp_path / "out.jsonl"),
                            max_new_tokens=max_new, device="cpu"))
    *texts, listed = generated(tmp_path / "out.jsonl")
    evaluated = {row["key"]: row for row in json.loads((run_dir / "eval.json").read_text())["decode"]["sample_outputs"]}
    for line in texts:
        assert len(line["outputs"]) == 2 and all(isinstance(y, str) for y in line["outputs"])
        assert line["outputs"] == [out["y"] for out in evaluated[line["key"]]["outputs"]]
        assert all(y.endswith("e e e e e") for y in line["outputs"])  # the base model's certain suffix, as text
    assert listed["key"] is None and listed["outputs"] == [y.split() for y in texts[0]["outputs"]]


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_eval_generate_and_encode_run_in_bfloat16(runs, tiny, tmp_path, kind):
    """--dtype bfloat16 loads the run's weights in bfloat16 and runs every pass in it: eval's verdict, encode's
    posteriors (within bfloat16's precision of float32's) and generate's outputs, with nothing left in float32."""
    import shutil

    from tokweight.training.decoding.encode import load_trained

    run_dir = tmp_path / "run"
    shutil.copytree(runs[kind][0], run_dir)  # eval writes eval.json into the run
    _, model, _, _ = load_trained(str(run_dir), "cpu", "bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    common = dict(run=str(run_dir), data=str(tiny[0]), split="test", device="cpu")
    posteriors = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / f"{dtype}.parquet"
        encode(EncodeConfig(**common, out=str(out), dtype=dtype))
        column = "q" if kind == "discrete" else "mu"
        posteriors[dtype] = np.array([row[column] for row in pq.read_table(out).to_pylist()])
    np.testing.assert_allclose(posteriors["bfloat16"], posteriors["float32"], atol=0.05)
    evaluated = run_eval(EvalConfig(**common, decode_examples=DECODED, dtype="bfloat16"))
    assert evaluated["config"]["dtype"] == "bfloat16" and evaluated["z_used"]["outcome"]
    inputs = write_inputs(tmp_path / "in.jsonl", first_test_samples(tiny[0], 4), with_y=False)
    result = generate(GenerateConfig(run=str(run_dir), input=str(inputs), out=str(tmp_path / "out.jsonl"),
                                     max_new_tokens=6, device="cpu", dtype="bfloat16",
                                     data=str(tiny[0]) if kind == "continuous" else None))
    assert result["lines"] == 4 and all(len(line["outputs"]) == 4 for line in generated(tmp_path / "out.jsonl"))
