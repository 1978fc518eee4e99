"""torchrun entry point for the multi-rank tests: ``-m tests.support.ddp_runs CONFIGS.json``.

Runs each TrainConfig of the JSON list in turn inside one process group (created here,
so that ``train.run`` joins it instead of creating and destroying one per run), and writes the weight files each
rank read to CONFIGS.json.reads-<rank>.json.
"""

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tokweight.training.config.migrations import train_config_from
from tokweight.training.loop.train import run


def recording_weight_reads(reads: list[str]) -> None:
    """Every read of a weight file (a checkpoint's model, a run's model or optimizer state; not its RNG states, which
    each rank reads) appended to ``reads``, by file name."""
    import tokweight.pipeline.models.checkpoint as checkpoint
    import tokweight.training.loop.run_dir as run_dir

    def recorded(load):
        def load_file(path, *args, **kwargs):
            if Path(path).name != "rng.safetensors":
                reads.append(Path(path).name)
            return load(path, *args, **kwargs)
        return load_file

    checkpoint.load_file, run_dir.load_file = recorded(checkpoint.load_file), recorded(run_dir.load_file)
    try:
        import transformers
    except ImportError:
        return
    auto = transformers.AutoModelForCausalLM
    from_pretrained = auto.from_pretrained.__func__

    def recorded_from_pretrained(cls, path, *args, **kwargs):
        reads.append(f"{Path(path).name}/ (transformers)")
        return from_pretrained(cls, path, *args, **kwargs)

    auto.from_pretrained = classmethod(recorded_from_pretrained)


def main(path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    reads: list[str] = []
    recording_weight_reads(reads)
    try:
        for obj in json.loads(open(path).read()):
            run(train_config_from(obj))
    finally:
        Path(f"{path}.reads-{dist.get_rank()}.json").write_text(json.dumps(reads))
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
