"""Every script in scripts/ loads and answers --help: its imports and module-level code still match the
package (a renamed recipe or config field breaks a driver nobody runs until a session needs it)."""

import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_script_answers_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out.lower()  # argparse: "usage:", click: "Usage:"


def test_defaults_table_reads_a_setting_over_the_default_and_refuses_a_bad_one():
    cell_overrides = runpy.run_path(str(SCRIPTS[0].parent / "defaults_table.py"))["cell_overrides"]
    fields = dict(cell_overrides(["estep.prior=learned", "cvae.latent_init_norm=1.0", "loss.anchor_start_step=0"],
                                 "discrete"))
    assert fields == {"estep.prior": "learned", "cvae.latent_init_norm": 1.0, "loss.anchor_start_step": 0}
    for bad, message in ((["estep.prior=bogus"], "estep prior must be one of"), (["prior"], "group.field=value"),
                         (["estep.nope=1"], "nope"),
                         (["loss.anchor_weight=-1"], "anchor_weight"),
                         (["loss.weighting=sum"], "sets the loss's weighting")):
        with pytest.raises(SystemExit, match=message):
            cell_overrides(bad, "discrete")


def test_merge_probe_recovers_a_planted_order_and_finds_the_shared_values():
    probe = runpy.run_path(str(SCRIPTS[0].parent / "merge_probe.py"))
    rng = np.random.default_rng(0)
    rank = rng.permutation(16)  # the planted order: symbol i scores rank[i]
    first_a, first_b = rng.integers(0, 16, 400), rng.integers(0, 16, 400)
    keep = first_a != first_b
    first_a, first_b = first_a[keep], first_b[keep]
    chose_a = rank[first_a] > rank[first_b]
    accuracy, scores = probe["order_accuracy"](first_a, first_b, chose_a, 16)
    assert accuracy > 0.95 and np.corrcoef(scores, rank)[0, 1] > 0.9
    coin = rng.random(len(chose_a)) < 0.5  # a choice no order predicts
    assert probe["order_accuracy"](first_a, first_b, coin, 16)[0] < 0.65
    hits = [["copy", "reverse", "sort"], ["reverse", "copy", None], ["copy", "copy", "sort"], ["reverse", None, "sort"]]
    assert probe["shared_pairs"](hits, ["copy", "reverse", "sort"]) == [(0, "copy", "reverse"), (1, "copy", "reverse")]
    stray = hits + [["sort", "sort", "sort"]] * 36  # value 0's 2 + 2 are now a tenth of 40 inputs, value 1's 2 + 1 not
    assert probe["shared_pairs"](stray, ["copy", "reverse", "sort"]) == [(0, "copy", "reverse")]


def test_merge_probe_tells_a_symbol_order_from_a_position():
    """A value that begins with the best-ranked of its candidate first tokens is one order of the symbols; one
    that always begins with the first strategy's token (a position: copy's x[0]) is not."""
    probe = runpy.run_path(str(SCRIPTS[0].parent / "merge_probe.py"))
    rng = np.random.default_rng(0)
    rank = rng.permutation(16)
    cands = rng.integers(0, 16, (400, 4))
    cands[:, 3] = cands[:, 2]  # two strategies that begin alike: one candidate, not two
    by_order = cands[np.arange(400), rank[cands].argmax(1)]
    assert probe["first_token_order"](cands, by_order, 16) > 0.95
    assert probe["first_token_order"](cands, cands[:, 0], 16) < 0.5


def test_merge_probe_finds_the_one_symbol_that_decides_a_merge():
    """A value that takes symbol 15 whenever one of its pair begins with it, else executes b: the rule is found
    with its side and share; its partner that avoids 15 is found as avoiding it; a coin is at chance."""
    probe = runpy.run_path(str(SCRIPTS[0].parent / "merge_probe.py"))
    rng = np.random.default_rng(0)
    first_a, first_b = rng.integers(0, 16, 600), rng.integers(0, 16, 600)
    keep = first_a != first_b
    first_a, first_b = first_a[keep], first_b[keep]
    takes = first_a == 15  # a where a begins with 15; b where b does, and on the inputs where neither does
    assert probe["one_symbol"](first_a, first_b, takes, 16)[:3] == (15, True, 1.0)
    assert probe["one_symbol"](first_a, first_b, ~takes, 16)[:3] == (15, False, 1.0)
    c, _, share, n = probe["one_symbol"](first_a, first_b, rng.random(len(first_a)) < 0.5, 16)
    assert n == ((first_a == c) | (first_b == c)).sum() and share < 0.75


def test_merge_probe_counts_what_each_value_begins_like():
    """copy and evens-odds both begin with x[0] and part at the second token: a value that decodes one or the
    other per input begins like both on its first token, like one of them on its first two."""
    probe = runpy.run_path(str(SCRIPTS[0].parent / "merge_probe.py"))

    class Labels:
        @staticmethod
        def outputs(x):
            return {"copy": tuple(x), "evens-odds": tuple(x[0::2] + x[1::2]), "reverse": tuple(x[::-1])}

    class Sample:
        def __init__(self, x):
            self.x = x

    samples = [Sample(("a", "b", "c", "d")), Sample(("e", "f", "g", "h"))]
    decodes = [[("a", "b", "c", "d"), ("d", "c", "b", "a")], [("e", "g", "f", "h"), ("z", "z", "z", "z")]]
    first, two = (probe["prefix_shares"](samples, decodes, Labels, n) for n in (1, 2))
    parting, outputs = probe["parting"], Labels.outputs(("a", "b", "c", "d"))
    assert parting(outputs["copy"], outputs["evens-odds"]) == 1 and parting(outputs["copy"], outputs["reverse"]) == 0
    assert parting(outputs["copy"], outputs["copy"]) is None
    assert first[0] == {"copy/evens-odds": 2} and two[0] == {"copy": 1, "evens-odds": 1}
    assert first[1] == {"reverse": 1, "none": 1} and two[1] == first[1]


def test_merge_probe_ranks_each_values_strategy_among_the_bases_choices(tiny):
    """The base's NLL of every s(x), batched, equals each one scored alone; a value's executed strategies are
    placed by that ranking, and a value that executes nothing on an input adds to no place."""
    import torch

    from tokweight.pipeline.models.backbone import load_backbone, s_nll
    from tokweight.pipeline.data.labels import load_labels
    from tokweight.pipeline.tokens.templates import collate, template_ids
    from tokweight.training.loop.train_base import load_split

    probe = runpy.run_path(str(SCRIPTS[0].parent / "merge_probe.py"))
    data, ckpt = tiny
    labels, samples = load_labels(data), load_split(data, "test")[:5]
    names = sorted(labels.outputs(samples[0].x))
    nll = probe["base_nll"](str(ckpt), samples, labels, names, batch=3)  # batches cut across inputs
    model = load_backbone(ckpt)
    for i, s in enumerate(samples):
        for j, n in enumerate(names):
            with torch.no_grad():
                alone = s_nll(model.model, collate(*zip(template_ids(model.vocab, s.x, labels.outputs(s.x)[n])))).sum()
            assert nll[i, j] == pytest.approx(float(alone), rel=1e-5)
    nll = np.array([[0.1, 2.0, 1.0], [3.0, 0.2, 0.5]])  # input 0 ranks a, c, b; input 1 ranks b, c, a
    hits = [["a", "b", None], ["c", "b", "a"]]
    shares = probe["base_choice_shares"](nll, hits, ["a", "b", "c"])
    assert np.allclose(shares[0], [0.5, 0.5, 0.0])  # a: 1st choice on input 0; c: 2nd on input 1
    assert np.allclose(shares[1], [0.5, 0.0, 0.5]) and np.allclose(shares[2], [0.0, 0.0, 0.5])


def test_gpu_check_runs_every_stage_on_a_tiny_model_on_the_cpu(tmp_path, monkeypatch, capsys):
    """The GPU check's stages, end to end, on the CPU: the script a lent device runs must not fail there first.
    Every timed stage has a positive time and its FLOPs counted; none failed; the GPU-only rows say why not."""
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", str(tmp_path), "--small", "--device", "cpu", "--rows", "120",
                                      "--steps", "1"])
    runpy.run_path(str(SCRIPTS[0].parent / "gpu_check.py"), run_name="__main__")
    rows = {r["stage"]: r for r in json.loads((tmp_path / "gpu_check.json").read_text())}
    assert list(rows) == ["extract command (task)", "extract: bare forward, head on S", "extract: scoring loop",
                          "train full", "resume", "planner peak vs measured", "train full, io.length_groups 4",
                          "train full, io.merge_passes True", "train LoRA (rank 16)",
                          "train continuous latent", "train --starts 3", "eval pass (float32)",
                          "generate (sampled, T=1)", "full step, tiny-wide shape", "full, 2 ranks (DDP, NCCL)"]
    assert not [name for name, r in rows.items() if r["status"].startswith("failed")]
    timed = [r for r in rows.values() if r["per"] in ("step", "batch of 8") or r["per"].startswith(("pass", "decode"))]
    assert len(timed) == 10 and all(r["seconds"] > 0 and r["tflops"] > 0 and r["tokens_per_s"] > 0 for r in timed)
    assert all(r["mfu"] is None and r["peak_gib"] is None for r in rows.values())  # no GPU figure from a CPU
    assert rows["planner peak vs measured"]["status"].startswith("skipped")
    assert rows["full, 2 ranks (DDP, NCCL)"]["status"] == "skipped: fewer than 2 GPUs"
    assert "at step 3" in rows["resume"]["note"]  # 1 warm-up, 1 timed and 1 counted step: checkpointed, resumed
    assert "Targets:" in (tmp_path / "gpu_check.md").read_text()
    assert (tmp_path / "run-starts3" / "starts.json").is_file()


def test_start_alignment_reads_the_values_apart_and_their_agreement_with_the_strategy():
    alignment = runpy.run_path(str(SCRIPTS[0].parent / "start_alignment.py"))["alignment"]
    strategies = ["copy", "reverse"] * 50
    follows = np.array([[0.1, 0.6] if s == "copy" else [0.9, 0.2] for s in strategies])  # argmin = the strategy
    spread, mi = alignment(follows, strategies, 2)
    assert spread == pytest.approx(0.6) and mi == pytest.approx(np.log(2))
    ignores = np.array([[0.1, 0.6], [0.1, 0.6], [0.9, 0.2], [0.9, 0.2]] * 25)  # argmin alternates in pairs
    assert alignment(ignores, strategies, 2)[1] == pytest.approx(0.0, abs=1e-12)


def test_merge_probe_indexes_the_symbols_strategies_write_that_x_lacks():
    """A format writes the month's name where x holds its digits: where two outputs part, the probe must know it."""
    from types import SimpleNamespace

    probe = runpy.run_path(str(SCRIPTS[0].parent / "merge_probe.py"))
    samples = [SimpleNamespace(x=("e", ",", "3", ",", "1", "0")), SimpleNamespace(x=("f", ",", "1", "2", ",", "2"))]
    outputs = {("e", ",", "3", ",", "1", "0"): {"csv": ("e", ",", "3", "-", "1", "0"), "letter": ("e", ",", "oct", "3")},
               ("f", ",", "1", "2", ",", "2"): {"csv": ("f", ",", "1", "2", "-", "2"), "letter": ("f", ",", "feb", "1", "2")}}
    labels = SimpleNamespace(outputs=lambda x: outputs[tuple(x)])
    symbols = probe["symbol_index"](samples, labels)
    assert {"oct", "feb", "-"} <= set(symbols) and {"e", "f", ",", "0", "1", "2", "3"} <= set(symbols)
    assert sorted(symbols.values()) == list(range(len(symbols)))
