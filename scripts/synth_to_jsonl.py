"""Write a synthetic task as JSON lines, so that it enters tokweight the way a researcher's own data does.

    python scripts/synth_to_jsonl.py --out task.jsonl [--preset small] [--examples 5000] [--seed 0]

One line per example, ``{"key", "x", "y", "strategy", "t0"}``; `tokweight convert` then
splits it by key hash, and nothing downstream knows that a generator made it (no
generator config in dataset.json: evaluation checks decodes against each line's own y).
"""

from __future__ import annotations

import argparse
import json
from tokweight.config_files import preset_config, preset_names
from tokweight.pipeline.data.samples import sample_to_json
from tokweight.pipeline.data.config import SynthConfig
from tokweight.pipeline.data.synth import generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--preset", default="small", choices=preset_names("synth"))
    parser.add_argument("--examples", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cfg = preset_config(SynthConfig, "synth", args.preset, seed=args.seed, n_train=args.examples)
    with open(args.out, "w") as f:
        for sample in generate(cfg, "train"):
            f.write(json.dumps({"key": sample.key, **sample_to_json(sample)}) + "\n")


if __name__ == "__main__":
    main()
