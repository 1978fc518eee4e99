"""Devices under torchrun: "cuda" puts rank r on cuda:LOCAL_RANK, in both stages."""

import torch

from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run as extract
from tokweight.pipeline.ranks import Ranks, rank_device
from tokweight.training.loop.train import run as train
from tokweight.training.config.train import IOConfig, LogConfig, OptimConfig, TrainConfig


def test_cuda_means_the_nodes_gpu_numbered_by_local_rank():
    assert rank_device("cuda", 1) == "cuda:1"
    assert rank_device("cuda:0", 1) == "cuda:0"  # an explicit device is kept
    assert rank_device("cpu", 1) == "cpu"


def test_extraction_and_training_take_their_device_from_the_rank(tiny, tiny_store, tmp_path, monkeypatch):
    data, ckpt = tiny
    asked = []

    def device(self, requested):  # records what each stage asks for, runs it on the CPU
        asked.append((requested, rank_device(requested, self.local_rank)))
        return torch.device("cpu")

    monkeypatch.setattr(Ranks, "device", device)
    monkeypatch.setenv("LOCAL_RANK", "1")
    extract(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(tmp_path / "store"), device="cuda",
                          progress=False, reader_process=False))
    train(TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), store=str(tiny_store), out=str(tmp_path / "run"),
                               num_workers=0, device="cuda"),
                      optim=OptimConfig(steps=1, batch_size=8), log=LogConfig(grad_diag_every=0)))
    assert asked == [("cuda", "cuda:1"), ("cuda", "cuda:1")]
