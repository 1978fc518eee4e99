"""Ground truth through the dataset (pipeline/data/labels.py): synth fully, converted data as far as its labels go."""

import json

from tokweight.pipeline.data.config import ConvertConfig
from tokweight.pipeline.data.convert import run as convert
from tokweight.pipeline.data.labels import load_labels, shard_labels
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import write_shards
from tokweight.pipeline.data.synth import load_synth_config


def convert_jsonl(jsonl, out, **options) -> dict:
    """`tokweight convert` of ``jsonl`` into ``out``."""
    return convert(ConvertConfig(str(jsonl), str(out), **options))


def test_synthetic_data_says_what_each_strategy_outputs(tiny):
    data, _ = tiny
    labels = load_labels(data)
    assert labels.source == "tokweight.synth"
    assert labels.strategies == tuple(load_synth_config(data).strategies)
    assert labels.outputs(("c", "a", "b"))["sort"] == ("a", "b", "c")
    assert labels.outputs(("c", "a", "b"))["reverse"] == ("b", "a", "c")


def test_converted_data_has_its_lines_labels_and_no_decode_check(tmp_path):
    lines = [{"key": f"k{i}", "x": ["a"], "y": ["b", "c"], "strategy": s} for i, s in enumerate("zyz")]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    convert_jsonl(tmp_path / "in.jsonl", tmp_path / "data")
    labels = load_labels(tmp_path / "data")
    assert (labels.source, labels.strategies) == ("tokweight.convert", ("y", "z"))
    assert labels.outputs(("a",)) is None
    assert labels.consistent_at_t0(Sample(key="k0", x=("a",), y=("b",), strategy="z", t0=0)) is None


def test_a_folder_of_shards_knows_only_what_its_samples_carry(tmp_path):
    paths = write_shards([Sample(key="k0", x=("a",), y=("b",), strategy="s", t0=1),
                          Sample(key="k1", x=("a",), y=("b",))], tmp_path / "shards", shard_size=8)
    labels = load_labels(tmp_path / "shards")
    assert (labels.source, labels.strategies, labels.outputs(("a",))) == ("unknown", (), None)
    assert shard_labels(paths[0]) == [("k0", "s", 1), ("k1", None, None)]
