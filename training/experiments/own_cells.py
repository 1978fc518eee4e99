"""A user task's cells: arm (a weighting, and for surprisal-share its repairs: lambda < 1, the anchor term)
x beta x seed.

Each is a cell of the synthetic grid, run by ``cells.run_cell`` under the plan of its arm (the arm's
LossConfig fields in ``CellPlan.loss``): its TrainConfig through the recipe, its content key over the
config, base fingerprint, data key and evaluation, train + evaluate on test, reuse. The decode-per-
latent control against each example's own reference y (training.control) is read back from the
run's eval.json, which cells' records leave out (their control is the synthetic strategy check).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tokweight.report.tables import fixed
from tokweight.training.experiments.aggregate import GROUP_KEYS, mean_std, seed_stats
from tokweight.training.experiments.artefacts import Echo, Prepared, read_json
from tokweight.training.experiments.cells import STATUSES, Cell, CellPlan, each_cell, run_cell
from tokweight.training.experiments.own_inputs import SETTING

CONTROL = ("exact_match", "chance_exact_match", "first_token_match", "chance_first_token_match")
"""Decode-per-latent against the references: the rate under each example's matched latent value, and chance
(the same examples under the other values); training.control.reference_control."""
OWN_METRICS = ("usage_perplexity", *CONTROL)
"""Per-cell numbers besides cells.METRICS: usage perplexity exp H(mean q) (how many latent values the aggregate
posterior spreads over; a discrete latent has no active units) and the control rates."""

Loss = tuple[tuple[str, float], ...]
"""LossConfig fields as (name, value) pairs, as ``CellPlan.loss`` holds them."""
LAMBDA = "token_weighted_reconstruction_weight"
"""LossConfig's mixing weight lambda: (1 - lambda) * uniform + lambda * the weighting."""


@dataclass(frozen=True)
class OwnCell:
    """One CVAE run of the user task: the synthetic grid's cell, and the arm it belongs to."""

    cell: Cell
    arm: str
    """The compared objective's name: the weighting, and its repair if any."""
    loss: Loss = ()
    """The arm's LossConfig fields besides weighting and beta."""

    @property
    def label(self) -> str:
        return f"{self.arm} beta={self.cell.beta:g} seed={self.cell.seed}"


def own_cell(cond: str, weighting: str, beta: float, seed: int, arm: str, loss: Loss = ()) -> OwnCell:
    return OwnCell(Cell(SETTING, "discrete", cond, weighting, beta, seed, SETTING), arm, loss)


def reference_control(run_dir: Path) -> dict:
    """The control rates of the run's eval.json (None where none was measured) and its verdict on z."""
    evaluated = read_json(run_dir / "eval.json")
    control = evaluated["decode"].get("reference", {})
    return {**{m: control.get(m) for m in CONTROL}, "control_above_chance": control.get("above_chance"),
            "z_used": evaluated["z_used"]["used"]}


def run_own_cell(own: OwnCell, prep: Prepared, plan: CellPlan, root: Path) -> tuple[dict, bool]:
    """(the cell's record with its control, reused): ``cells.run_cell`` under the arm's plan."""
    record, reused = run_cell(own.cell, prep, replace(plan, loss=own.loss), root)
    return {**record, **reference_control(root / "runs" / record["run"])}, reused


def _run_own_cell_args(args: tuple) -> tuple[dict, bool]:
    return run_own_cell(*args)


def cell_line(own: OwnCell, record: dict) -> str:
    return (f"{own.label}: MI {fixed(record['mi'])} KL {fixed(record['kl'])} exact match "
            f"{fixed(record['exact_match'])} (chance {fixed(record['chance_exact_match'])}) first token "
            f"{fixed(record['first_token_match'])} (chance {fixed(record['chance_first_token_match'])}) "
            f"NLL {fixed(record['recon_uniform'])}")


def run_own_cells(cells: list[OwnCell], prep: Prepared, plan: CellPlan, root: Path, echo: Echo,
                  jobs: int = 1) -> list[dict]:
    """Every cell (cells.each_cell: ``jobs`` at a time, a progress line with the ETA per cell in cell
    order); one row per cell (cells are seeded: no row depends on ``jobs``)."""
    work = [(own, prep, plan, root) for own in cells]
    rows = []
    for i, (own, *_), record, reused, took in each_cell(_run_own_cell_args, work, jobs):
        echo(f"[cell {i}/{len(cells)}] {cell_line(own, record)} ({took})")
        rows.append({"arm": own.arm, **asdict(own.cell), **dict(own.loss), "recipe": plan.recipe,
                     **prep.stats_brief, **record, "reused": reused})
    return rows


def aggregate_arms(rows: list[dict]) -> list[dict]:
    """One row per (arm, beta) in first-seen order: mean and std over seeds of every metric, and how many
    seeds eval's verdict says use z."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["arm"], r["beta"]), []).append(r)
    return [arm_stats(arm, rs) for (arm, _), rs in groups.items()]


def arm_stats(arm: str, rows: list[dict]) -> dict:
    out = {"arm": arm, "lambda": rows[0].get(LAMBDA, 1.0), **seed_stats({k: rows[0][k] for k in GROUP_KEYS}, rows)}
    for m in OWN_METRICS:
        out[f"{m}_mean"], out[f"{m}_std"] = mean_std([r.get(m) for r in rows])
    return out | {"seeds_z_used": sum(bool(r["z_used"]) for r in rows),
                  **{f"seeds {status}": sum(r.get("status") == status for r in rows) for status in STATUSES}}
