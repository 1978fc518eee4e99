"""`tokweight inspect`: the store's report, with ground truth from the dataset where the store lacks it.

The report itself is the store's (``store.report``); reading the dataset's labels is the
data layer's (``labels.ground_truth_from_data``). This module is where the two meet.
"""

from __future__ import annotations

from tokweight.pipeline.labels import ground_truth_from_data
from tokweight.store.report import InspectConfig
from tokweight.store.report import run as write_report


def run(cfg: InspectConfig) -> dict:
    """Write the report files (``store.report.run``) and return the summary."""
    truth = ground_truth_from_data(cfg.store, list(cfg.fingerprints), cfg.data) if cfg.data else None
    return write_report(cfg, truth)
