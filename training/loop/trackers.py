"""Experiment trackers a run reports to besides metrics.jsonl: TensorBoard, MLflow, Weights & Biases.

One interface (``Trackers``) that ``open_trackers`` builds from ``LogConfig.report_to``; with no name it is empty
and imports nothing. Each tracker's library is an optional extra (``pip install 'tokweight[tensorboard]'``, ...),
imported here, inside the function that opens it, and only when named. Every tracker writes inside the run
directory and reaches no network by default: TensorBoard's event files in RUN/tensorboard/, MLflow's local SQLite
store RUN/mlflow.db and its artifacts in RUN/mlartifacts/ (``MLFLOW_TRACKING_URI`` names another store), W&B in offline mode under RUN/wandb/ (``WANDB_MODE=online``
syncs it). RUN/trackers.json keeps each tracker's run id, so that a resumed run goes on in the same tracker run.

What they receive (``Trackers.log_record``): every metrics.jsonl record's numbers at its step, as ``train/<name>``
for a training step and ``val/<name>`` for a validation, a list (the posterior's usage per latent value, the NLL
per latent value) as one series per value, ``<split>/<name>/value_<k>``; the resolved configuration as
hyperparameters (``log_hparams``); texts (``log_text``: the stop line, eval's verdict and table) and figures
(``log_figure``), which the callers above training make.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

from tokweight.training.config.components import TRACKERS, check_report_to

IDS_FILE = "trackers.json"
"""RUN/trackers.json: each tracker's run id, which a resumed run reopens."""
SKIPPED = ("step", "split")  # a record's keys that say where it belongs, not what was measured


def require(name: str) -> None:
    """A one-line error naming the extra when ``name``'s library is not installed."""
    if importlib.util.find_spec(TRACKERS[name]) is None:
        raise ValueError(f"--report-to {name} needs the {TRACKERS[name]} package: pip install 'tokweight[{name}]'")


def series(record: dict, prefix: str = "") -> dict[str, float]:
    """{series name: value} of one metrics.jsonl record (``train/`` or ``<split>/``); lists one series per value;
    nested dicts, strings and None are left out (they stay in metrics.jsonl)."""
    head = f"{prefix}{record.get('split', 'train')}/"
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in SKIPPED:
            continue
        if isinstance(value, (bool, int, float)):
            out[head + key] = float(value)
        elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
            out |= {f"{head}{key}/value_{k}": float(v) for k, v in enumerate(value)}
    return out


def flat_params(config: dict, prefix: str = "") -> dict[str, object]:
    """A nested configuration as {"group.field": value}, lists and None as text."""
    out: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out |= flat_params(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
    return out


def rgb(fig):
    """A matplotlib ``Figure`` rendered through the Agg canvas: (H, W, 3) uint8."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


class TensorBoard:
    """Event files in RUN/tensorboard/ (``torch.utils.tensorboard.SummaryWriter``); a resumed run purges the events
    logged after its checkpoint's step."""

    def __init__(self, run: Path, resume_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run / "tensorboard"), purge_step=resume_step)

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def log_hparams(self, params: dict) -> None:
        from torch.utils.tensorboard.summary import hparams

        for summary in hparams(params, {}):  # in this run's own event file (add_hparams would start another run)
            self.writer.file_writer.add_summary(summary)

    def log_image(self, name: str, image, step: int) -> None:
        self.writer.add_image(name, image, step, dataformats="HWC")

    def log_text(self, name: str, text: str, step: int) -> None:
        self.writer.add_text(name, text, step)

    def close(self) -> None:
        self.writer.close()


class MLflow:
    """A run of experiment "tokweight" in the local SQLite store RUN/mlflow.db, its artifacts (texts, figures) in
    RUN/mlartifacts/ (``MlflowClient``, no global active run)."""

    def __init__(self, run: Path, run_id: str | None, name: str):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        if run_id is None:
            exp = self.client.get_experiment_by_name("tokweight")
            exp_id = exp.experiment_id if exp else self.client.create_experiment(
                "tokweight", artifact_location=(run / "mlartifacts").resolve().as_uri())  # not the working directory
            run_id = self.client.create_run(exp_id, run_name=name).info.run_id
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id, self.uri = run_id, uri

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # log_batch's limit
            self.client.log_batch(self.run_id, metrics=metrics[i: i + 1000])

    def log_hparams(self, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # log_batch's limit
            self.client.log_batch(self.run_id, params=items[i: i + 100])

    def log_image(self, name: str, image, step: int) -> None:
        self.client.log_image(self.run_id, image, f"{name}.png")

    def log_text(self, name: str, text: str, step: int) -> None:
        self.client.log_text(self.run_id, text, f"{name}.md")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Wandb:
    """A W&B run in RUN/wandb/, offline unless ``WANDB_MODE`` says otherwise; every series against the run's own
    ``step`` (W&B's internal step must only grow, and a start's steps begin again at 0); texts go to its summary."""

    def __init__(self, run: Path, run_id: str | None, name: str):
        import wandb

        (run / "wandb").mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(silent=True, disable_git=True, x_disable_stats=True, console="off")
        self.wandb = wandb
        self.run = wandb.init(project="tokweight", name=name, dir=str(run), id=run_id, resume="allow" if run_id else None,
                              mode=os.environ.get("WANDB_MODE", "offline"), settings=settings, reinit="create_new")
        self.run_id = self.run.id
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        self.run.log({"step": step, **values})

    def log_hparams(self, params: dict) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_image(self, name: str, image, step: int) -> None:
        self.run.log({"step": step, name: self.wandb.Image(image)})

    def log_text(self, name: str, text: str, step: int) -> None:
        self.run.summary[name] = text

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The fan-out over the trackers a run reports to (none: every call does nothing)."""

    def __init__(self, trackers: dict | None = None):
        self.trackers = trackers or {}
        self.last_step = 0  # where texts and figures logged without a step go: the last metrics' step

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        self.last_step = max(self.last_step, step)
        if values:
            for tracker in self.trackers.values():
                tracker.log_metrics(step, values)

    def log_record(self, record: dict, prefix: str = "") -> None:
        """One metrics.jsonl record's numbers at its step (``series``); a stop line as text."""
        if not self.trackers:
            return
        if "stop" in record:
            self.log_text(f"{prefix}stop", json.dumps(record["stop"]))
        elif "step" in record:
            self.log_metrics(int(record["step"]), {k: v for k, v in series(record, prefix).items() if math.isfinite(v)})

    def log_hparams(self, config: dict) -> None:
        params = flat_params(config)
        for tracker in self.trackers.values():
            tracker.log_hparams(params)

    def log_figure(self, name: str, fig, step: int | None = None) -> None:
        if fig is None or not self.trackers:
            return
        image = rgb(fig)
        for tracker in self.trackers.values():
            tracker.log_image(name, image, self.last_step if step is None else step)

    def log_text(self, name: str, text: str, step: int | None = None) -> None:
        for tracker in self.trackers.values():
            tracker.log_text(name, text, self.last_step if step is None else step)

    def close(self) -> None:
        for tracker in self.trackers.values():
            tracker.close()
        self.trackers = {}


NO_TRACKERS = Trackers()


def open_trackers(names: tuple[str, ...], run: str | Path, resume_step: int | None = None) -> Trackers:
    """The trackers ``names`` writing in ``run`` (each library imported here, only when named); every missing
    library is refused before any opens. ``resume_step``: the step a resumed run goes on from (TensorBoard drops
    what was logged after it). The MLflow and W&B run ids go to RUN/trackers.json and are reopened from it."""
    if not names:
        return NO_TRACKERS
    check_report_to(names)
    for name in names:
        require(name)
    run = Path(run)
    run.mkdir(parents=True, exist_ok=True)
    ids_path = run / IDS_FILE
    ids = json.loads(ids_path.read_text()) if ids_path.is_file() else {}
    opened = {}
    for name in names:
        if name == "tensorboard":
            opened[name] = TensorBoard(run, resume_step)
        elif name == "mlflow":
            opened[name] = MLflow(run, ids.get("mlflow"), run.name)
        else:
            opened[name] = Wandb(run, ids.get("wandb"), run.name)
    ids |= {name: t.run_id for name, t in opened.items() if hasattr(t, "run_id")}
    ids_path.write_text(json.dumps(ids, indent=1) + "\n")
    return Trackers(opened)
