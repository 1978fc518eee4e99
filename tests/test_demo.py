"""`tokweight demo` end to end on the tiny preset: every stage runs and leaves its outputs."""

import json
import math

from tokweight.training.demo import DemoConfig, run


def test_demo_runs_every_stage(tmp_path):
    messages = []
    result = run(DemoConfig(out=str(tmp_path / "demo"), preset="tiny", cvae_steps=3), echo=messages.append)
    stages = [m.split(":")[0] for m in messages]
    assert stages == ["[demo] synth", "[demo] train-base", "[demo] extract", "[demo] train", "[demo] eval",
                      "[demo] inspect"]
    assert set(result["timings"]) == {"synth_s", "train-base_s", "extract_s", "train_s", "eval_s", "inspect_s"}
    assert math.isfinite(result["cvae"]["mi"]) and result["cvae"]["examples"] == 128
    assert (tmp_path / "demo" / "report" / "report.md").stat().st_size > 0
    saved = json.loads((tmp_path / "demo" / "demo_summary.json").read_text())
    assert saved["base"]["fingerprint"] == result["base"]["fingerprint"]
    assert json.loads((tmp_path / "demo" / "demo_config.json").read_text())["recipe"] == "em-balanced"
