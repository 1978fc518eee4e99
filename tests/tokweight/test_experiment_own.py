"""`tokweight experiment --checkpoint --data`: the user-task comparison on a converted dataset, with the
tiny built-in checkpoint (library call) and a tiny Hugging Face one (the command), and its bad inputs."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.data.config import ConvertConfig
from tokweight.pipeline.data.convert import run as convert
from tokweight.pipeline.data.samples import sample_to_json
from tokweight.config_files import flat, plain, preset, preset_config
from tokweight.pipeline.data.config import SynthConfig
from tokweight.pipeline.data.synth import generate
from tests.support.fixtures_experiment import TINY_BUDGET
from tests.tokweight.test_cli_errors import fails_in_one_line
from tokweight.experiments import own_task


def convert_jsonl(jsonl, out, **options) -> dict:
    """`tokweight convert` of ``jsonl`` into ``out``."""
    return convert(ConvertConfig(str(jsonl), str(out), **options))

ARMS = ("uniform", "sum", "surprisal-share")
FINITE = ("mi", "strategy_mi", "kl", "usage_perplexity", "recon_uniform", "exact_match", "chance_exact_match",
          "first_token_match", "chance_first_token_match")


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def own_data(tmp_path_factory) -> Path:
    """The tiny preset's 512 train examples as JSON lines (another seed than the tiny base's data),
    converted with its 0.8 / 0.1 / 0.1 key-hash split: the user path, labels and all."""
    root = tmp_path_factory.mktemp("own")
    lines = [json.dumps({"key": s.key, **sample_to_json(s)}) for s in generate(preset_config(SynthConfig, "synth", "tiny", seed=5), "train")]
    (root / "task.jsonl").write_text("\n".join(lines) + "\n")
    convert_jsonl(root / "task.jsonl", root / "data", shard_size=128)
    return root / "data"


@pytest.fixture(scope="module")
def native_run(own_data, tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("own-native") / "exp"
    cfg = own_task.OwnTaskConfig(checkpoint=str(tiny[1]), data=str(own_data), out=str(out), seeds=(0,),
                                 budget=TINY_BUDGET)
    lines: list[str] = []
    return out, own_task.run(cfg, echo=lines.append, command="test"), lines


def check_results(out: Path, k: int, betas: tuple[str, ...] = ("0.3", "1.0")) -> None:
    """Every file, one row per arm and beta with finite numbers, and a verdict that quotes the table."""
    for name in ("results.md", "results.csv", "cells.csv", "store_predictions.csv", "profile.csv",
                 "own_task_config.json"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "mi_and_control.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "own_task_config.json").read_text())["config"]["k"] == k
    results = read_csv(out / "results.csv")
    assert sorted((r["arm"], r["beta"]) for r in results) == sorted((a, b) for a in ARMS for b in betas)
    for r in results:
        for m in FINITE:
            assert math.isfinite(float(r[f"{m}_mean"])) and math.isfinite(float(r[f"{m}_std"])), (r["arm"], m)
        assert 0 <= float(r["mi_mean"]) <= math.log(k) + 1e-6
    assert len(read_csv(out / "cells.csv")) == len(results)  # one seed
    predicted = read_csv(out / "store_predictions.csv")[0]
    assert all(math.isfinite(float(predicted[c])) for c in ("mean_dilution", "base_nll_test", "mean_amplification"))
    check_verdict((out / "results.md").read_text(), results)


def check_verdict(md: str, results: list[dict]) -> None:
    verdict, tables = md.split("## Verdict", 1)[1].split("- command:", 1)
    bullets = [line for line in verdict.splitlines() if line.startswith("- ")]
    assert [b.split(" keeps z")[0][2:] for b in bullets] == list(ARMS)
    for figure in re.findall(r"[+-]?\d+\.\d{3}", verdict):
        assert figure in tables, figure  # every figure of the verdict is a figure of the tables
    rows = {(r["arm"], float(r["beta"])): r for r in results}
    for arm, bullet in zip(ARMS, bullets):
        beta, nll = re.search(r"at β = ([\d.]+), of \d+ seeds: .* token-mean NLL averaged over q\(z \| x, y\) "
                              r"is ([\d.]+)", bullet).groups()
        assert nll == f"{float(rows[arm, float(beta)]['recon_uniform_mean']):.3f}"


def test_native_checkpoint_on_converted_data(native_run, own_data):
    out, result, lines = native_run
    assert result["k"] == 4  # the tiny preset's strategies, read off the converted labels
    check_results(out, 4)
    assert sum(line.startswith("[cell ") for line in lines) == 6 and "ETA" in "\n".join(lines)  # 3 arms x 2 betas
    assert any("extracted" in line for line in lines if line.startswith("[store]"))


def test_rerun_reuses_the_store_and_every_cell(native_run, own_data, tiny):
    out, first, _ = native_run
    lines: list[str] = []
    again = own_task.run(own_task.OwnTaskConfig(checkpoint=str(tiny[1]), data=str(own_data), out=str(out),
                                                seeds=(0,), budget=TINY_BUDGET), echo=lines.append)
    assert all(r["reused"] for r in again["cells"]) and any("complete already" in line for line in lines)
    assert [r["mi_mean"] for r in again["results"]] == [r["mi_mean"] for r in first["results"]]


def test_hf_checkpoint_through_the_command(hf_checkpoints, own_data, tmp_path):
    out = tmp_path / "exp"
    result = CliRunner().invoke(main, ["experiment", "--checkpoint", str(hf_checkpoints["gpt2"]), "--data",
                                       str(own_data), "--out", str(out), "--seeds", "0", "--betas", "1",
                                       "--cvae-steps", "3"])
    assert result.exit_code == 0, result.output
    check_results(out, 4, betas=("1.0",))
    assert "huggingface" in (out / "results.md").read_text()


def test_bad_inputs_fail_in_one_line_before_any_work(own_data, tiny, tiny_store, hf_checkpoints, tmp_path):
    def experiment(data, *extra, checkpoint=tiny[1]):
        return ["experiment", "--checkpoint", str(checkpoint), "--data", str(data), "--out", str(tmp_path / "o"),
                *extra]

    fails_in_one_line(experiment(own_data, "--template", "chat"), "chat template")  # a symbol vocabulary renders none
    unlabelled = tmp_path / "unlabelled"
    shutil.copytree(own_data, unlabelled)
    meta = json.loads((unlabelled / "dataset.json").read_text())
    (unlabelled / "dataset.json").write_text(json.dumps({**meta, "strategies": []}))
    fails_in_one_line(experiment(unlabelled), "dataset.json", "--k")
    shutil.rmtree(unlabelled / "test")
    fails_in_one_line(experiment(unlabelled, "--k", "2"), "'test'", "--test-fraction")
    fails_in_one_line(experiment(own_data, "--store", str(tiny_store), checkpoint=hf_checkpoints["gpt2"]),
                      str(tiny_store), "--store")
    assert not (tmp_path / "o").exists()


def test_quick_and_sweep_shape_the_config_not_what_is_compared():
    from tokweight.commands.experiment import own_job

    own = {"checkpoint": "ckpt", "data": "data", "store": None, "k": None, "cond": None, "slots": None}
    cfg, run = own_job("out", True, "beta", own, {})
    full, _ = own_job("out", False, None, own, {})
    assert run is own_task.run and cfg.betas == own_task.SWEEP_BETAS and full.betas != cfg.betas
    # --quick changes exactly the fields its preset file names, each to another value than the full job's
    quick_fields, full_fields = flat(plain(cfg)), flat(plain(full))
    changed = {k for k, v in quick_fields.items() if full_fields[k] != v} - {"betas"}
    assert changed == set(flat(preset("experiment", "own-quick"))) and cfg.seeds == (0,)
    assert cfg.budget.starts == 1 and cfg.budget.steps < full.budget.steps  # one start, a shorter cap
    names = [name for name, _, _ in own_task.arms(cfg)]
    assert names == list(ARMS)
    with pytest.raises(ValueError, match="mix_lambdas"):
        own_task.OwnTaskConfig(checkpoint="c", data="d", out="o", mix_lambdas=(1.0,))


def test_verdict_says_where_each_arm_keeps_z():
    from tokweight.experiments.own_task.render import verdict

    def row(arm, weighting, beta, mi, lam=1.0, used=1):
        return {"arm": arm, "weighting": weighting, "lambda": lam, "beta": beta, "mi_mean": mi, "strategy_mi_mean": mi,
                "recon_uniform_mean": 0.5, "seeds_z_used": used, "n_seeds": 1, "seeds collapsed at convergence": 1}

    agg = [row("uniform", "uniform", 0.1, 0.9), row("uniform", "uniform", 1.0, 0.1),
           row("surprisal-share", "surprisal-share", 0.1, 0.9), row("surprisal-share", "surprisal-share", 1.0, 0.8),
           row("surprisal-share λ=0.5", "surprisal-share", 0.1, 0.2, 0.5),
           row("surprisal-share λ=0.5", "surprisal-share", 1.0, 0.1, 0.5)]
    stats = {"base_nll_test": 0.4, "beta_c_predicted": {"uniform": 0.5, "sum": 2.0, "surprisal-share": 1.5}}
    lines = verdict(agg, 2, stats, (0,))[2:]
    assert lines[0].startswith("- uniform keeps z up to β = 0.1 (MI 0.900") and "loses it above (MI 0.100" in lines[0]
    assert "the store predicted β_c = 0.5;" in lines[0] and "(+0.100)" in lines[0]
    assert lines[1].startswith("- surprisal-share keeps z at every β up to 1 (MI 0.800")
    assert ("of 1 seeds: 0 z used, decoder whole, 0 z used, decoder damaged, 1 collapsed at convergence, "
            "0 not converged by the cap") in lines[1]
    assert lines[2].startswith("- surprisal-share λ=0.5 keeps z at no β of the grid (MI 0.200")
    assert "the store predicted β_c = 1;" in lines[2]  # (1 - 0.5) * 0.5 + 0.5 * 1.5
    # an exact MI above the bar that eval does not call used (a code of x) keeps nothing
    x_code = [row("uniform", "uniform", 0.1, 0.9, used=0), row("uniform", "uniform", 1.0, 0.1, used=0)]
    assert verdict(x_code, 2, stats, (0,))[2].startswith("- uniform keeps z at no β of the grid (MI 0.900")


def test_a_cell_that_lost_z_says_whether_training_had_converged():
    from tokweight.experiments.cells import cell_status

    assert cell_status("z used, decoder whole", "step cap") == "z used, decoder whole"
    assert cell_status("z used, decoder damaged", "converged") == "z used, decoder damaged"
    assert cell_status("z not used", "converged") == "collapsed at convergence"
    assert cell_status("z not used", "step cap") == "not converged by the cap"
    assert cell_status("z not used", None) == "not converged by the cap"  # no stop rule ran: the cap ended it
