"""torchrun entry point for the multi-rank tests: ``-m tests.ddp_runs CONFIGS.json``.

Runs each TrainConfig of the JSON list in turn inside one process group (created here,
so that ``train.run`` joins it instead of creating and destroying one per run).
"""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from tokweight.training.train import run
from tokweight.training.train_config import TrainConfig


def main(path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        for obj in json.loads(open(path).read()):
            run(TrainConfig.from_json(obj))
    finally:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
