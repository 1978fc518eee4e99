"""`tokweight inspect`: the store's inspection (``store.inspection``) as files a researcher reads top to bottom.

OUT/report.md (tables and PNGs, ``inspect_md``), OUT/summary.json (the headline numbers per
fingerprint), OUT/config.json (the resolved config) and OUT/*.csv (the full profile and confusion
tables). With ``data``, the dataset's labels (strategy, t0) fill in what the stored rows lack.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import duckdb

from tokweight.pipeline.data.labels import ground_truth_from_data
from tokweight.report.inspect_config import InspectConfig
from tokweight.report.inspect_md import render_report
from tokweight.report.inspect_plots import inspection_plots
from tokweight.report.plots import save_figures
from tokweight.store.durable import write_json_atomic
from tokweight.store.inspection import PROFILE_QUERIES, inspect_store, records


def run(cfg: InspectConfig) -> dict:
    """Write the report files and return the summary."""
    truth = ground_truth_from_data(cfg.store, list(cfg.fingerprints), cfg.data) if cfg.data else None
    found = inspect_store(cfg.store, cfg.fingerprints, cfg.params, truth, cfg.exact_quantiles)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    csv = duckdb.connect()  # DuckDB's CSV writer, as `tokweight sql --format csv` writes them
    for name, table in found.tables.items():
        csv.from_arrow(table).write_csv(str(out / f"{name}.csv"))
    profiles = {name: records(found.tables[name]) for name in PROFILE_QUERIES}
    saved = save_figures(inspection_plots(profiles, found.per_example), out)
    write_json_atomic(out / "summary.json", found.summary)
    write_json_atomic(out / "config.json", asdict(cfg))
    confusion = records(found.tables["t0_confusion"])
    (out / "report.md").write_text(render_report(cfg.store, found.summary, profiles, confusion, saved))
    return found.summary
