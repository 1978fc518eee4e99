"""`tokweight demo` end to end on the tiny preset: every stage runs, both arms are evaluated against the base
model, and the table and the sentence are read off their eval results."""

import json
import math

from tokweight.demo_config import WEIGHTINGS, DemoConfig
from tokweight.demo import run, summary


def test_demo_runs_every_stage_and_reports_both_arms(tmp_path):
    messages = []
    result = run(DemoConfig(out=str(tmp_path / "demo"), preset="tiny"), echo=messages.append)
    stages = [m.split(":")[0] for m in messages]
    assert stages == ["[demo] data, base model, store", "[demo] cvae uniform", "[demo] cvae surprisal-share",
                      "[demo] inspect"]
    assert [r["weighting"] for r in result["rows"]] == list(WEIGHTINGS)
    for row, weighting in zip(result["rows"], WEIGHTINGS):
        evaluated = json.loads((tmp_path / "demo" / f"cvae-{weighting}" / "eval.json").read_text())
        assert row["outcome"] == evaluated["z_used"]["outcome"] and math.isfinite(row["mi"])
        assert row["base_nll"] == evaluated["metrics"]["base_nll_token_mean"] > 0
        assert row["base_exact_match"] == evaluated["decode"]["label_free"]["base_exact_match"]
    md = (tmp_path / "demo" / "demo.md").read_text()
    assert "| uniform |" in md and "| surprisal-share |" in md and result["summary"] in md
    assert (tmp_path / "demo" / "report" / "report.md").stat().st_size > 0
    assert json.loads((tmp_path / "demo" / "demo_config.json").read_text())["preset"] == "tiny"


def row(weighting, outcome, mi):
    return {"weighting": weighting, "outcome": outcome, "mi": mi}


def test_the_sentence_says_whether_the_claim_shows():
    shown = summary(16.7, 2, [row("uniform", "z not used", 0.01), row("surprisal-share", "z used, decoder whole", 0.68)])
    assert shown.startswith("With the strategy decided by 1 of about 17 supervised tokens (T/(t0+1) = 16.7), "
                            "surprisal-share: z used, decoder whole (exact MI 0.68 of log 2 = 0.69 nats)")
    assert shown.endswith("is what let z be learnt here (z counts as learnt at an exact MI of 0.5 log 2 = 0.35 nats).")
    trace = summary(16.7, 2, [row("uniform", "z used, decoder damaged", 0.02),  # a trace of use is not a learnt z
                              row("surprisal-share", "z used, decoder whole", 0.68)])
    assert "uniform: z used, decoder damaged (exact MI 0.02" in trace and "is what let z be learnt here" in trace
    both = summary(16.7, 2, [row("uniform", "z used, decoder whole", 0.6), row("surprisal-share", "z used, decoder whole", 0.68)])
    damaged = summary(16.7, 2, [row("uniform", "z not used", 0.0), row("surprisal-share", "z used, decoder damaged", 0.6)])
    weak = summary(16.7, 2, [row("uniform", "z not used", 0.0), row("surprisal-share", "z used, decoder whole", 0.2)])
    assert all(s.endswith("does not show the method's claim.") for s in (both, damaged, weak))
