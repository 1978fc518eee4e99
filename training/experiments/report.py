"""What the grid's and the sweep's results files share: the config file, CSV tables, the Markdown header,
mean ± std cells."""

from __future__ import annotations

import csv
import math
import os
import platform
from dataclasses import asdict
from pathlib import Path

from tokweight.report.tables import MISSING
from tokweight.store.durable import write_json_atomic
from tokweight.training.experiments.task import TaskConfig


def write_csv(path: Path, rows: list[dict]) -> None:
    """Every key of any row is a column (first-seen order); None is an empty cell. Written, then renamed."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    tmp.replace(path)


def machine() -> str:
    import torch

    return (f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"torch {torch.__version__} with {torch.get_num_threads()} thread(s)")


def pm(row: dict, metric: str) -> str:
    """``metric``'s "mean ± std" over seeds in an aggregated row (training.experiments.aggregate)."""
    mean, std = row.get(f"{metric}_mean"), row.get(f"{metric}_std")
    return MISSING if mean is None else f"{mean:.3f} ± {std:.3f}"


def header_lines(title: str, recipe: str, command: str | None, wall_s: float, task: TaskConfig,
                 cells: int, reused: int) -> list[str]:
    synth, base = task.synth, task.base
    return [f"# {title}", "",
            f"- recipe: `{recipe}`", f"- command: `{command or '(library call)'}`", f"- machine: {machine()}",
            f"- wall time: {wall_s / 60:.1f} min; {cells} cells, {reused} reused from earlier runs",
            f"- task: strategies {', '.join(synth.strategies)} (K = S = {task.k}, log S = {math.log(task.k):.3f} "
            f"nats), alphabet {synth.alphabet_size}, {synth.n_train} train / {synth.n_test} test examples; "
            f"base model {base.n_layer} layers, d={base.d_model}, {base.steps} steps", ""]


def write_config(path: Path, cfg, recipe: dict) -> None:
    """A job's resolved config (a dataclass) and its recipe's overrides, next to its outputs."""
    write_json_atomic(path, {"config": asdict(cfg), "recipe_overrides": recipe})
