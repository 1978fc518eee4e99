"""--report-to: a tiny train run reporting to TensorBoard, MLflow and W&B (offline, in its run directory), each read
back with its own library's reader (W&B's offline records by their log format) and compared with metrics.jsonl;
the one-line error of a missing extra; no tracker imported by a run that names none; and the figures the trackers
get, each rendered to a PNG of the expected size with drawn pixels."""

from __future__ import annotations

import json
import math
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.support.fixtures_train import tiny, tiny_store  # noqa: F401 (fixtures)
from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig
from tokweight.training.config.components import check_report_to, parse_report_to
from tokweight.training.loop.trackers import open_trackers

ALL = ("tensorboard", "mlflow", "wandb")
OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
           "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"}


def config(tiny, store, out, report_to=ALL, steps=6) -> TrainConfig:
    data, ckpt = tiny
    return TrainConfig(io=IOConfig(checkpoint=str(ckpt), data=str(data), store=str(store), out=str(out),
                                   num_workers=0),
                       loss=LossConfig(policy="precomputed"), optim=OptimConfig(steps=steps, batch_size=8),
                       log=LogConfig(log_every=2, grad_diag_every=3, ckpt_every=2, eval_every=2, eval_examples=64,
                                     eval_batch_size=64, report_to=report_to))


def expected(records: list[dict]) -> dict[str, dict[int, float]]:
    """{series: {step: value}} as the reference says the trackers get metrics.jsonl: the numbers of a training line
    as train/NAME, a validation's as val/NAME, a list as NAME/value_K."""
    out: dict[str, dict[int, float]] = {}
    for r in records:
        if "step" not in r:
            continue
        head = "val/" if r.get("split") == "val" else "train/"
        for key, value in r.items():
            if key in ("step", "split"):
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                out.setdefault(head + key, {})[r["step"]] = float(value)
            elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
                for k, v in enumerate(value):
                    out.setdefault(f"{head}{key}/value_{k}", {})[r["step"]] = float(v)
    return out


@pytest.fixture(scope="module")
def reported(tiny, tiny_store, tmp_path_factory):
    """(run directory, its metrics.jsonl records, eval's result): a run reporting to every tracker (with its figures),
    with no connection out of the machine, then `tokweight eval` on it and eval's report to TensorBoard."""
    for module in ALL:
        pytest.importorskip(module)
    from tokweight.cli import main
    from tokweight.commands.tracking import log_eval, train_reported

    run = tmp_path_factory.mktemp("tracked") / "run"
    cwd = tmp_path_factory.mktemp("cwd")  # where nothing may be written
    outside = []
    connect = socket.socket.connect

    def guarded(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            outside.append(address)
            raise OSError(f"test: no network ({address})")
        return connect(sock, address)

    with pytest.MonkeyPatch.context() as mp:
        for name, value in OFFLINE.items():
            mp.setenv(name, value)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setattr(socket.socket, "connect", guarded)
        mp.chdir(cwd)
        train_reported(config(tiny, tiny_store, run))
        evaluated = CliRunner().invoke(main, ["eval", "--run", str(run), "--data", str(tiny[0]), "--split", "val",
                                              "--decode-examples", "8", "--threads", "1"])
        assert evaluated.exit_code == 0, evaluated.output
        result = json.loads((run / "eval.json").read_text())
        trackers = open_trackers(("tensorboard",), run)
        log_eval(trackers, result)
        trackers.close()
    assert not outside, f"a tracker tried to reach {outside}"
    assert not list(cwd.iterdir()), "a tracker wrote outside the run directory"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return run, records, result


def test_tensorboard_holds_every_metric_the_configuration_and_the_figures(reported):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run, records, _ = reported
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    want = expected(records)
    assert {"train/loss", "train/usage/value_0", "val/mi", "val/usage/value_3", "val/nll_by_value/value_0"} <= set(want)
    assert set(want) <= set(acc.Tags()["scalars"])
    for name, by_step in want.items():
        got = {e.step: e.value for e in acc.Scalars(name)}
        assert set(got) == set(by_step), name
        assert np.allclose([got[s] for s in by_step], list(by_step.values()), rtol=1e-6, atol=1e-7), name
    start = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info.hparams
    assert start["optim.steps"].number_value == 6 and start["loss.policy"].string_value == "precomputed"
    images = {tag: acc.Images(tag)[-1] for tag in acc.Tags()["images"]}
    assert {"figures/usage", "figures/kl_mi", "figures/surprisal_profile", "figures/strategies"} <= set(images)
    assert all(im.width > 100 and im.height > 100 and im.step == 6 for im in images.values())
    texts = acc.Tags()["tensors"]
    assert {"stop/text_summary", "eval/verdict/text_summary", "eval/table/text_summary"} <= set(texts)
    verdict = acc.Tensors("eval/verdict/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert reported[2]["z_used"]["outcome"] in verdict
    assert {e.step for e in acc.Scalars("eval/z_used")} == {6}


def test_mlflow_local_store_holds_every_metric_and_the_configuration(reported):
    from mlflow.tracking import MlflowClient

    run, records, _ = reported
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    run_id = json.loads((run / "trackers.json").read_text())["mlflow"]
    for name, by_step in expected(records).items():
        got = {m.step: m.value for m in client.get_metric_history(run_id, name)}
        assert got == pytest.approx(by_step, rel=1e-12), name
    info = client.get_run(run_id)
    assert info.data.params["optim.steps"] == "6" and info.data.params["log.report_to"] == json.dumps(list(ALL))
    assert info.info.status == "FINISHED"
    figures = {Path(a.path).name for a in client.list_artifacts(run_id, "figures")}
    assert {"usage.png", "kl_mi.png", "surprisal_profile.png"} <= figures
    assert (run / "mlartifacts").is_dir() and "stop.md" in {a.path for a in client.list_artifacts(run_id)}


def wandb_records(path: Path):
    """The protobuf records of a W&B offline run file: LevelDB's log format (32 KiB blocks, each record a 7-byte
    header: checksum, length, type FULL 1 / FIRST 2 / MIDDLE 3 / LAST 4) after a 7-byte ":W&B" file header."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, pending = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4: pos + 7])
        if length == 0 and kind == 0:
            break
        pending += data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_run_holds_every_metric_and_the_configuration(reported):
    run, records, _ = reported
    [path] = run.glob("wandb/offline-run-*/run-*.wandb")
    history: dict[str, dict[int, float]] = {}
    config = {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for key, value in items.items():
                if isinstance(value, (int, float)) and not key.startswith("_") and key != "step":
                    history.setdefault(key, {})[items["step"]] = float(value)
        elif kind == "config":
            config |= {item.key: json.loads(item.value_json) for item in record.config.update}
    for name, by_step in expected(records).items():
        assert history.get(name) == pytest.approx(by_step, rel=1e-12), name
    assert config["optim.steps"] == 6 and config["loss.policy"] == "precomputed"


def test_eval_writes_its_figure_beside_eval_md(reported):
    from PIL import Image

    run, _, result = reported
    assert "executes" in result["decode"]
    with Image.open(run / "strategies.png") as image:
        pixels = np.asarray(image.convert("L"))
    assert pixels.shape[0] > 100 and pixels.std() > 10


def test_a_missing_extra_is_one_line_naming_it(tiny, tiny_store, tmp_path, monkeypatch):
    import importlib.util

    from tokweight.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install 'tokweight\[mlflow\]'"):
        open_trackers(("tensorboard", "mlflow"), tmp_path / "run")
    assert not (tmp_path / "run" / "tensorboard").exists()  # refused before any tracker opened
    data, ckpt = tiny
    out = CliRunner().invoke(main, ["train", "--checkpoint", str(ckpt), "--data", str(data), "--store",
                                    str(tiny_store), "--out", str(tmp_path / "cli"), "--report-to", "mlflow"])
    assert out.exit_code == 1
    assert out.output.strip().splitlines()[-1] == (
        "Error: --report-to mlflow needs the mlflow package: pip install 'tokweight[mlflow]'")


def test_report_to_names_are_checked():
    assert parse_report_to("tensorboard, wandb") == ("tensorboard", "wandb") and parse_report_to("none") == ()
    assert LogConfig(report_to="mlflow").report_to == ("mlflow",)
    assert LogConfig(report_to=["mlflow", "wandb"]).report_to == ("mlflow", "wandb")
    with pytest.raises(ValueError, match="unknown tracker 'neptune'"):
        check_report_to(("neptune",))
    with pytest.raises(ValueError, match="twice"):
        LogConfig(report_to=("wandb", "wandb"))


NO_TRACKER = """
import sys
from tokweight.training.loop.train import run
from tests.training.loop.test_trackers import config
run(config((sys.argv[1], sys.argv[2]), sys.argv[3], sys.argv[4], report_to=(), steps=2))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorboard", "mlflow", "wandb", "tensorboardX")
                or m.startswith("torch.utils.tensorboard"))
print(loaded)
"""


def test_a_run_without_report_to_imports_no_tracker(tiny, tiny_store, tmp_path):
    data, ckpt = tiny
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", NO_TRACKER, str(data), str(ckpt), str(tiny_store),
                           str(tmp_path / "run")], capture_output=True, text=True, cwd=root, timeout=600,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert not (tmp_path / "run" / "trackers.json").exists()


def rendered(fig, tmp_path: Path, name: str) -> np.ndarray:
    """``fig`` saved as a PNG at 100 dpi, read back as (H, W) grey levels, checked to be the figure's size."""
    from PIL import Image

    from tokweight.report.plots import save_figures

    save_figures({name: fig}, tmp_path, dpi=100)
    with Image.open(tmp_path / name) as image:
        assert image.format == "PNG"
        assert image.size == tuple(round(v * 100) for v in fig.get_size_inches())
        return np.asarray(image.convert("L"))


def test_each_figure_renders_to_a_png_with_drawn_pixels(reported, tmp_path):
    from tokweight.report import run_plots

    run, records, result = reported
    starts = {"seed-0": [{"split": "val", "step": s, "recon": 2.0 - 0.1 * s, "kl": 0.5} for s in (2, 4)],
              "seed-1": [{"split": "val", "step": s, "recon": 2.5 - 0.2 * s, "kl": 0.3} for s in (2, 4)]}
    figures = {"usage.png": run_plots.plot_usage(records), "kl_mi.png": run_plots.plot_kl_mi(records, 4),
               "starts.png": run_plots.plot_starts(starts, beta=0.3),
               "surprisal_profile.png": run_plots.run_figures(run)["surprisal_profile.png"],
               "strategies.png": run_plots.plot_strategies(result)}
    for name, fig in figures.items():
        assert fig is not None, name
        pixels = rendered(fig, tmp_path, name)
        assert (pixels < 200).mean() > 0.01 and pixels.std() > 10, name  # lines and text, not a blank canvas
    assert run_plots.plot_usage([]) is None and run_plots.plot_starts({}, 0.3) is None


def test_train_base_reports_each_metrics_line(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tokweight.config_files import preset_config
    from tokweight.training.config.base import BaseTrainConfig
    from tokweight.training.loop.train_base import run as train_base

    out = tmp_path / "base"
    train_base(preset_config(BaseTrainConfig, "base", "tiny", data=str(tiny[0]), out=str(out), steps=4,
                             report_to=("tensorboard",)))
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for name, by_step in expected(records).items():
        got = {e.step: e.value for e in acc.Scalars(name)}
        assert got == pytest.approx(by_step, rel=1e-6), name
    assert "train/val_nll" in acc.Tags()["scalars"]


def test_only_rank_0_opens_trackers(tiny, tiny_store, tmp_path, monkeypatch):
    from tokweight.commands.tracking import main_rank
    from tokweight.training.loop.train import run_trackers

    cfg = config(tiny, tiny_store, tmp_path / "run", report_to=("tensorboard",))
    assert not run_trackers(cfg, main=False) and not (tmp_path / "run").exists()
    monkeypatch.setenv("RANK", "1")
    assert not main_rank()
    monkeypatch.setenv("RANK", "0")
    assert main_rank()


def test_each_start_reports_under_its_own_prefix(tiny, tiny_store, tmp_path):
    """A run of two starts: each start's lines under start-SEED/ (the values of its metrics.jsonl, which a later
    round cuts back to the start's checkpoint), and the run's own metrics.jsonl (the chosen start's lines, then those
    of the run that goes on) under train/ and val/; the starts' figure."""
    pytest.importorskip("tensorboard")
    from dataclasses import replace

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tokweight.commands.tracking import train_reported

    cfg = config(tiny, tiny_store, tmp_path / "run", report_to=("tensorboard",))
    cfg = replace(cfg, optim=replace(cfg.optim, starts=2, start_steps=2, start_steps_max=2))
    train_reported(cfg)
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    starts = sorted((tmp_path / "run" / "starts").glob("seed-*"))
    assert len(starts) == 2
    for start in starts:
        records = [json.loads(line) for line in (start / "metrics.jsonl").read_text().splitlines()]
        prefix = f"start-{start.name.removeprefix('seed-')}/"
        want = expected(records)
        assert "train/loss" in want
        for name, by_step in want.items():
            got = {e.step: e.value for e in acc.Scalars(prefix + name)}
            assert {s: got[s] for s in by_step} == pytest.approx(by_step, rel=1e-6), prefix + name
    run_records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for name, by_step in expected(run_records).items():  # the chosen start's lines, then the run's own
        assert {e.step: e.value for e in acc.Scalars(name)} == pytest.approx(by_step, rel=1e-6), name
    assert "figures/starts" in acc.Tags()["images"]
