"""One configuration system: `train --config FILE` (TOML, or a run's own config.json), `--set group.field=value`
reaching every field, and flags whose type and shown default come from the dataclasses."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.config_files import build, flat, parse_value, preset, preset_names, with_sets, with_values
from tokweight.commands.flags import default_of, resolve
from tokweight.commands.train import FLAGS, train_config
from tokweight.training.config.migrations import train_config_from
from tokweight.training.config.components import CVAEConfig
from tokweight.training.objective.schedules import Schedule, warmed_up
from tokweight.training.config.train import IOConfig, TrainConfig

IO = {"io": {"checkpoint": "/c", "data": "/d", "out": "/o", "store": "/s"}}


def test_every_field_is_reached_by_set():
    """Each leaf of the resolved config, set to its own value through --set, gives the same config back; a field
    that does not exist is refused by its dotted name."""
    default = train_config_from(IO)
    leaves = flat(default.to_json())
    assert len(leaves) > 50
    for key, value in leaves.items():
        assert train_config_from(with_values(default.to_json(), {key: value})) == default, key
    changed = train_config(None, {}, ("io.checkpoint=/c", "io.data=/d", "io.out=/o", "io.store=/s", "loss.beta=0.5",
                                      "estep.balance_iters=3", "optim.stop.patience=4", "cvae.cond=\"token\""))
    assert (changed.loss.beta, changed.estep.balance_iters, changed.optim.stop.patience, changed.cvae.cond) == \
        (0.5, 3, 4, "token")
    with pytest.raises(ValueError, match=r"loss.betta"):
        train_config(None, {}, ("io.checkpoint=/c", "io.data=/d", "io.out=/o", "io.store=/s", "loss.betta=0.5"))


def test_a_flags_help_shows_the_dataclass_default_and_every_flag_names_a_field():
    """The help of each flag, as `tokweight train --help` prints it, ends with the dataclass's default (or the
    rule that resolves it)."""
    helps = {opt.opts[0]: opt.help for opt in main.commands["train"].params}
    assert CliRunner().invoke(main, ["train", "--help"]).exit_code == 0
    for flag in FLAGS:
        resolve(TrainConfig, flag.field)  # a field that exists
        shown = flag.default if flag.default is not None else default_of(TrainConfig, flag.field)
        if shown is None or flag.field in ("io.checkpoint", "io.data", "io.out"):
            assert "[default:" not in helps[flag.name], flag.name
            continue
        assert helps[flag.name].endswith(f"[default: {shown}]"), (flag.name, helps[flag.name], shown)


def test_a_toml_file_flags_and_set_apply_in_order(tmp_path):
    path = tmp_path / "cfg.toml"
    path.write_text('[io]\ncheckpoint = "/c"\ndata = "/d"\nout = "/o"\nstore = "/s"\n'
                    '[loss]\nbeta = 0.7\nweighting = "sum"\n[optim]\nsteps = 50\n')
    cfg = train_config(str(path), {"optim.steps": 60}, ("loss.beta=0.2",))
    assert (cfg.loss.beta, cfg.loss.weighting, cfg.optim.steps) == (0.2, "sum", 60)
    with pytest.raises(ValueError, match="missing --checkpoint, --data"):
        train_config(None, {"io.out": "/o"}, ())
    (tmp_path / "bad.toml").write_text("[loss\nbeta=")
    with pytest.raises(ValueError, match="bad.toml: not a valid toml configuration"):
        train_config(str(tmp_path / "bad.toml"), {}, ())
    assert parse_value("0.5") == 0.5 and parse_value("true") is True and parse_value("prefix") == "prefix"
    assert with_sets({}, ["a.b=[1, 2]"]) == {"a": {"b": [1, 2]}}


def test_a_runs_own_config_json_trains_to_the_same_losses(tiny, tiny_store, tmp_path):
    data, ckpt = tiny
    args = ["train", "--checkpoint", str(ckpt), "--data", str(data), "--store", str(tiny_store), "--steps", "3",
            "--batch-size", "8", "--num-workers", "0", "--log-every", "1", "--starts", "1"]
    first = CliRunner().invoke(main, args + ["--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(main, ["train", "--config", str(tmp_path / "a" / "config.json"),
                                      "--out", str(tmp_path / "b")])
    assert again.exit_code == 0, again.output

    def losses(run):
        return [json.loads(x)["loss"] for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()
                if '"loss"' in x]

    assert losses("a") == losses("b") and len(losses("a")) == 3
    refused = CliRunner().invoke(main, ["train", "--config", str(tmp_path / "a" / "config.json"), "--out",
                                        str(tmp_path / "c"), "--set", "loss.nope=1"])
    assert refused.exit_code == 1 and "loss.nope" in refused.output and "Traceback" not in refused.output


def test_presets_are_files_built_into_their_dataclasses():
    assert {"baseline", "default", "survival"} <= set(preset_names("recipes"))
    with pytest.raises(ValueError, match="no recipes preset 'nope'"):
        preset("recipes", "nope")
    assert build(CVAEConfig, {"k": 3, "cond": "token"}) == CVAEConfig(k=3, cond="token")
    with pytest.raises(ValueError, match="cvae.kk: no such field"):
        build(CVAEConfig, {"kk": 3}, "cvae.")
    assert build(TrainConfig, {"io": {"checkpoint": "c", "data": "d", "out": "o", "store": "s"}}).io == \
        IOConfig(checkpoint="c", data="d", out="o", store="s")


def test_a_run_config_given_another_pathway_or_latent_resolves_what_follows_from_it_anew(tmp_path):
    """A run's config.json holds its resolved fields (the query's 1 slot): changing the pathway or the latent on
    top of it resolves the fields that follow from them again, unless they are set too."""
    path = tmp_path / "config.json"
    run = TrainConfig(io=IOConfig(checkpoint="/c", data="/d", out="/o", store="/s"))
    path.write_text(json.dumps(run.to_json()))
    assert (run.cvae.cond, run.cvae.slots) == ("query", 1)
    assert train_config(str(path), {"cvae.cond": "prefix"}, ()).cvae.slots == 4
    assert train_config(str(path), {"cvae.cond": "prefix", "cvae.slots": 2}, ()).cvae.slots == 2
    continuous = train_config(str(path), {}, ("cvae.latent=continuous",))
    assert (continuous.cvae.cond, continuous.cvae.slots, continuous.cvae.samples, continuous.optim.starts,
            continuous.estep.mode, continuous.estep.harden) == ("prefix", 4, 4, 1, "hard", 0.0)
    from_0 = replace(run, cvae=replace(run.cvae, posterior_likelihood=True),
                     estep=replace(run.estep, harden_from=0))  # the read acts where the hardening does
    at = Schedule.of(from_0).at(0)
    assert at.reads_likelihood and at.estep == from_0.estep and at.beta == warmed_up(0.3, 0, 100)
    assert not Schedule.of(replace(run, cvae=from_0.cvae)).at(10 ** 6).reads_likelihood  # harden_from None: a start
    assert run.cvae.posterior_likelihood is True  # a discrete latent's default
    off = replace(from_0, cvae=replace(run.cvae, posterior_likelihood=False))
    assert not Schedule.of(off).at(0).reads_likelihood
    k2 = replace(from_0, cvae=replace(from_0.cvae, k=2), estep=replace(from_0.estep, harden=None))
    assert k2.estep.harden == 0.0 and not Schedule.of(k2).at(10 ** 6).reads_likelihood  # nothing hardens at K = 2
    assert (run.estep.harden, run.estep.harden_from) == (0.5, None)  # a soft E-step's, from the starts' comparison
    hard = train_config(str(path), {"estep.mode": "hard"}, ())
    assert (hard.estep.mode, hard.estep.harden) == ("hard", 0.0)
    one = train_config(str(path), {"optim.starts": 1, "optim.start_steps_max": 400}, ())
    assert one.estep.harden_from == 400  # one start: where the starts' window would close
    kept = tmp_path / "kept.json"  # a job's run: its kept seed, hardened from the step its starts were compared at
    kept.write_text(json.dumps(replace(run, estep=replace(run.estep, harden_from=200)).to_json()))
    assert train_config(str(kept), {}, ()).estep.harden_from == 200
    assert train_config(str(kept), {"optim.seed": 5}, ()).estep.harden_from is None  # other starts, compared anew
    assert train_config(str(path), {}, ()) == replace(run, io=train_config(str(path), {}, ()).io)
    prefix = tmp_path / "prefix.json"  # the latent named as it was changes nothing that follows from it
    prefix.write_text(json.dumps(replace(run, cvae=CVAEConfig(cond="prefix", slots=2)).to_json()))
    again = train_config(str(prefix), {"cvae.latent": "discrete"}, ())
    assert (again.cvae.cond, again.cvae.slots) == ("prefix", 2)


def test_every_command_reads_its_config_as_train_does(tmp_path):
    """extract's ExtractConfig: the defaults, then a file, then the flags, then --set; a missing required field is
    named by its flag, an unknown one by its dotted name, a bad file by its path."""
    from tokweight.commands.extract import FLAGS as EXTRACT_FLAGS
    from tokweight.commands.flags import configured
    from tokweight.pipeline.extract.config import ExtractConfig

    path = tmp_path / "extract.toml"
    path.write_text('checkpoint = "/c"\ndata = "/d"\nstore = "/s"\nbatch_tokens = 100\n[retry]\nattempts = 2\n')

    def made(flags, sets=()):
        return configured(ExtractConfig, EXTRACT_FLAGS, {f.dest: flags.get(f.field) for f in EXTRACT_FLAGS},
                          str(path), sets)

    assert (made({}).batch_tokens, made({}).retry.attempts, made({}).reader_process) == (100, 2, None)
    assert made({"batch_tokens": 200}).batch_tokens == 200
    assert made({"batch_tokens": 200}, ("batch_tokens=300", "retry.backoff_s=0")).batch_tokens == 300
    assert made({}, ("retry.backoff_s=0",)).retry.backoff_s == 0 and made({}).format == "parquet"
    with pytest.raises(ValueError, match=r"^missing --checkpoint, --store: give them on the command line or in "):
        configured(ExtractConfig, EXTRACT_FLAGS, {}, None, ("data=\"/d\"",))
    with pytest.raises(ValueError, match=r"retry.attemptz: no such field"):
        made({}, ("retry.attemptz=3",))
    (tmp_path / "bad.toml").write_text("batch_tokens = [")
    with pytest.raises(ValueError, match="bad.toml: not a valid toml configuration"):
        configured(ExtractConfig, EXTRACT_FLAGS, {}, str(tmp_path / "bad.toml"), ())


def test_a_commands_help_is_its_fields_docstring_and_default():
    """Every option of a command that sets a field shows the field's docstring (unless the flag says more) and its
    default; a field without a default is [required] unless None may stand for it."""
    from tokweight.commands.flags import field_doc, help_text
    from tokweight.pipeline.data.config import ConvertConfig
    from tokweight.pipeline.extract.config import ExtractConfig
    from tokweight import cli
    from tokweight.commands import extract as extract_cli

    helps = {opt.opts[0]: opt.help for opt in main.commands["extract"].params}
    for flag in extract_cli.FLAGS:
        assert helps[flag.name.split("/")[0]] == help_text(ExtractConfig, flag)
        assert helps[flag.name.split("/")[0]].startswith(flag.help or field_doc(ExtractConfig, flag.field))
    assert helps["--batch-tokens"].endswith("a memory/speed knob only.  [default: 16384]")
    assert helps["--checkpoint"].endswith("[required]")
    convert = {opt.opts[0]: opt.help for opt in main.commands["convert"].params}
    assert "[required]" not in convert["--jsonl"] and convert["--out"].endswith("[required]")
    assert help_text(ConvertConfig, cli.CONVERT_FLAGS[4]) == "Samples per shard.  [default: 1000]"


def test_synth_and_plan_take_config_and_set_on_the_command_line(tmp_path):
    """A preset, then --config, then the flags, then --set; a field that does not exist is one line naming it."""
    config = tmp_path / "synth.toml"
    config.write_text("n_train = 12\nn_val = 6\nn_test = 6\nseed = 3\n")
    done = CliRunner().invoke(main, ["synth", "--out", str(tmp_path / "d"), "--preset", "tiny", "--config", str(config),
                                     "--seed", "4", "--set", "n_test=7", "--k", "2"])
    assert done.exit_code == 0, done.output
    written = json.loads((tmp_path / "d" / "dataset.json").read_text())["config"]
    assert (written["n_train"], written["n_test"], written["seed"], len(written["strategies"])) == (12, 7, 4, 2)
    refused = CliRunner().invoke(main, ["plan", "--model", "gpt-tiny", "--set", "batch_sise=2"])
    assert refused.exit_code == 1 and "batch_sise: no such field" in refused.output
    assert "Traceback" not in refused.output and len(refused.output.strip().splitlines()) == 1
