"""Every CLI failure is one line: `Error: ...` on stderr naming the file, a non-zero exit, no traceback,
and no empty output directory left behind."""

import json
import shutil

import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import write_shards
from tokweight.store.manifest import write_checked_json
from tests.support.fixtures_extract import sample_member, write_raw_tar


def fails_in_one_line(args: list[str], *names: str) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr  # progress bars aside
    assert "Traceback" not in result.output + result.stderr
    for name in names:
        assert name in errors[0], (name, errors[0])
    return errors[0]


@pytest.fixture
def small_data(tmp_path):
    write_shards([Sample(key=f"k{i}", x=("a",), y=("b",)) for i in range(4)], tmp_path / "data" / "train",
                 shard_size=4)
    return tmp_path / "data"


def test_train_base_on_a_folder_without_shards(tmp_path):
    (tmp_path / "empty").mkdir()
    fails_in_one_line(["train-base", "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "base")], "empty")
    assert not (tmp_path / "base").exists()


def test_convert_into_a_folder_that_holds_a_dataset(tmp_path, small_data):
    (tmp_path / "in.jsonl").write_text(json.dumps({"x": ["a"], "y": ["b"]}) + "\n")
    fails_in_one_line(["convert", "--jsonl", str(tmp_path / "in.jsonl"), "--out", str(small_data)], "--overwrite")


def test_convert_a_line_of_bad_json(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"x": ["a"], "y": ["b"]}\n{not json\n')
    fails_in_one_line(["convert", "--jsonl", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out")],
                      "in.jsonl", "line 2")
    assert not (tmp_path / "out").exists()


def test_extract_a_sample_without_y(tiny, tmp_path):
    write_raw_tar(tmp_path / "data" / "shard-000000.tar", [sample_member("nokey", {"x": ["a"]})])
    fails_in_one_line(["extract", "--checkpoint", str(tiny[1]), "--data", str(tmp_path / "data"), "--store",
                       str(tmp_path / "store")], "nokey", "shard-000000.tar")


def train_args(tiny, store, out, *extra) -> list[str]:
    return ["train", "--checkpoint", str(tiny[1]), "--data", str(tiny[0]), "--store", str(store), "--out", str(out),
            "--steps", "1", "--batch-size", "4", "--num-workers", "0", *extra]


def test_train_with_a_store_of_another_checkpoint(tiny, tmp_path):
    (tmp_path / "store").mkdir()
    fails_in_one_line(train_args(tiny, tmp_path / "store", tmp_path / "run"), str(tmp_path / "store"))
    assert not (tmp_path / "run").exists()


def test_train_with_an_incomplete_store(tiny, tiny_store, tmp_path):
    store = shutil.copytree(tiny_store, tmp_path / "store")
    manifest = next(store.glob("fingerprint=*/manifest.json"))
    write_checked_json(manifest, {**json.loads(manifest.read_text()), "complete": False})  # a valid, incomplete one
    fails_in_one_line(train_args(tiny, store, tmp_path / "run"), "incomplete")
    assert not (tmp_path / "run").exists()


def test_extract_in_a_template_the_checkpoint_cannot_render(tiny, tmp_path):
    """(K above the checkpoint's latent tokens is no error any more: train appends the missing ones.)"""
    fails_in_one_line(["extract", "--checkpoint", str(tiny[1]), "--data", str(tiny[0]), "--store",
                       str(tmp_path / "store"), "--template", "chat"], str(tiny[1]), "leave out --template")
    assert not (tmp_path / "store").exists()


def test_eval_on_a_split_that_does_not_exist(tiny, tiny_store, tmp_path):
    assert CliRunner().invoke(main, train_args(tiny, tiny_store, tmp_path / "run")).exit_code == 0
    fails_in_one_line(["eval", "--run", str(tmp_path / "run"), "--data", str(tiny[0]), "--split", "nope"],
                      "nope", "train, val, test")


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
    (tmp_path / "not-a-store").mkdir()
    args = ["store", "verify", str(tmp_path / "not-a-store")]
    line = CliRunner().invoke(main, args).stderr
    assert "Traceback" not in line
    result = CliRunner().invoke(main, ["--debug", *args])
    assert result.exit_code != 0 and result.exception is not None
