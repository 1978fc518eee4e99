"""A run with several starts trains each for ``start_steps`` (more rounds while no start's code has formed), goes on
from the one whose validation objective is least, and ends bitwise where a single run from that start's seed
ends (CPU, one torch thread)."""

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tests.training.loop.test_resume import (CKPT_EVERY, CONVERGED_END, FILES, STEPS, Killed, config, kill_after_step,
                                             train)
from tokweight.training.config.migrations import train_config_from
from tokweight.training.config.components import CVAEConfig
from tokweight.training.loop.faults import Hooks
from tokweight.training.loop.run_dir import read_config, read_metrics
from tokweight.training.objective.schedules import Schedule
import tokweight.training.loop.starts as starts_module
from tokweight.training.loop.starts import another_round, code_formed

STARTS, START_STEPS, SEED = 3, 2, 1
HARDEN = 1 / CVAEConfig().k + 1e-4


def with_starts(cfg, **optim):
    """``cfg`` with STARTS starts of START_STEPS, and a hardening that takes nearly every example (harden just above
    1/k: every q* not exactly uniform gives one value that much) and the posterior's read of the likelihood, so that
    where they start shows in the run."""
    return replace(cfg, optim=replace(cfg.optim, **({"starts": STARTS, "start_steps": START_STEPS, "seed": SEED}
                                                     | optim)),
                   estep=replace(cfg.estep, harden=HARDEN), cvae=replace(cfg.cvae, posterior_likelihood=True))


def rounds_while_room(rounds, cfg, last) -> bool:
    """``another_round`` for codes that keep forming and never form (the tiny runs' MI is noise): a round more
    while one fits. The rule itself is tested on its own below."""
    return rounds[-1]["steps"] + cfg.optim.start_steps <= last


@pytest.fixture
def forming(monkeypatch):
    monkeypatch.setattr(starts_module, "another_round", rounds_while_room)


def never_step(step: int) -> None:
    raise AssertionError(f"a finished job trained again (step {step})")


@pytest.fixture(scope="module")
def started(tiny_dropout, tmp_path_factory):
    """(run dir, result) of the job with starts, in rounds up to the cap's last step."""
    out = tmp_path_factory.mktemp("starts") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(starts_module, "another_round", rounds_while_room)
        return out, train(with_starts(config(tiny_dropout, out, "to the cap")))


def test_each_start_has_its_own_seed_and_the_least_validation_objective_is_chosen(started):
    out, result = started
    made = json.loads((out / "starts.json").read_text())
    assert made["seeds"] == [SEED * STARTS + i for i in range(STARTS)]  # another --seed tries other starts
    assert made["start_steps"] == START_STEPS and result["start"] == made
    # every start goes on by START_STEPS while another round fits below the cap of 8, the last round's compared
    rounds, steps = made["rounds"], [r["steps"] for r in made["rounds"]]
    assert steps == [2, 4, 6] and made["compared_at"] == 6
    compared = rounds[-1]
    beta = json.loads((out / "config.json").read_text())["loss"]["beta"]
    for seed, recon, mi, objective in zip(made["seeds"], compared["val_recon"], compared["val_mi"],
                                          compared["val_objective"]):
        run = out / "starts" / f"seed-{seed}"
        assert json.loads((run / "config.json").read_text())["optim"]["seed"] == seed
        final = [r for r in read_metrics(run) if r.get("split") == "val"][-1]
        assert final["step"] == 6 and final["recon"] == recon and final["mi"] == mi
        assert objective == pytest.approx(final["recon"] + beta * final["kl"], rel=1e-12)
    assert len(set(compared["val_objective"])) == STARTS  # the starts differ, so the choice means something
    assert made["seed"] == made["seeds"][compared["val_objective"].index(min(compared["val_objective"]))]
    assert json.loads((out / "config.json").read_text())["optim"]["seed"] == made["seed"]


def test_a_start_whose_z_costs_more_than_it_gains_is_not_chosen(tmp_path):
    """The objective, not the reconstruction alone: a start that reconstructs best with a code whose KL costs more
    than it gains loses to one without z (uniform's K = 2 through the query)."""
    from tokweight.pipeline.ranks import Ranks
    from tokweight.training.config.train import IOConfig, LossConfig, OptimConfig, TrainConfig

    cfg = TrainConfig(io=IOConfig(checkpoint="ckpt", data="data", store="store", out=str(tmp_path)),
                      loss=LossConfig(beta=0.3),
                      optim=OptimConfig(steps=300, starts=3, start_steps=200))
    val = {0: {"recon": 0.154, "kl": 0.001, "mi": 0.0}, 1: {"recon": 0.165, "kl": 0.004, "mi": 0.002},
           2: {"recon": 0.009, "kl": 0.689, "mi": 0.686}}  # k2, uniform, start seeds 0-2 at step 200
    made = starts_module.compare_starts(cfg, Ranks(), lambda seed, until, announce: val[seed])
    assert min(val, key=lambda s: val[s]["recon"]) == 2 and made["seed"] == 0
    assert made["rounds"][-1]["val_objective"] == pytest.approx([0.1543, 0.1662, 0.2157])
    val[2] = {"recon": 0.009, "kl": 0.2, "mi": 0.2}  # a code worth its KL: chosen
    again = starts_module.compare_starts(replace(cfg, io=replace(cfg.io, out=str(tmp_path / "again"))), Ranks(),
                                         lambda seed, until, announce: val[seed])
    assert again["seed"] == 2
    old = tmp_path / "old"  # rounds recorded before the objective was: refused where they would be compared
    old.mkdir()
    (old / "starts.json").write_text(json.dumps({"seeds": [0, 1, 2], "start_steps": 200, "start_steps_max": 800,
                                                 "rounds": [{"steps": 200, "val_recon": [0.154, 0.165, 0.009],
                                                             "val_mi": [0.0, 0.002, 0.686]}]}))
    with pytest.raises(ValueError, match="old/starts.json holds rounds from before the starts were compared by the "
                                         "objective; use a new --out"):
        starts_module.compare_starts(replace(cfg, io=replace(cfg.io, out=str(old))), Ranks(),
                                     lambda seed, until, announce: val[seed])


def test_the_starts_go_on_while_a_code_is_forming_and_not_yet_formed(tiny_dropout, tmp_path):
    cfg = with_starts(config(tiny_dropout, tmp_path, "to the cap"), start_steps=200, start_steps_max=800, steps=1500)
    cfg = replace(cfg, cvae=replace(cfg.cvae, k=4))  # a code formed at log(4) / 2 = 0.69; rising by 0.02 a round

    def rounds(*best):
        return [{"steps": 200 * (i + 1), "val_mi": [0.0, mi]} for i, mi in enumerate(best)]

    assert another_round(rounds(0.05), cfg, 800) and another_round(rounds(0.05, 0.3), cfg, 800)
    assert another_round(rounds(0.05, 0.3, 0.5), cfg, 800)  # its round ends at 800, start_steps_max itself
    assert not another_round(rounds(0.05, 0.3, 0.5, 0.6), cfg, 800)  # at start_steps_max
    assert not another_round(rounds(0.7), cfg, 800)  # formed
    assert not another_round(rounds(0.01), cfg, 800)  # not forming: uniform's, or past beta_c
    assert not another_round(rounds(0.05, 0.065), cfg, 800)  # stopped rising (by no more than 0.02)
    assert not another_round(rounds(0.05), cfg, 399)  # the next round would pass the cap's last step
    assert code_formed([None], SimpleNamespace(cvae=CVAEConfig(latent="continuous")))


def test_at_start_steps_max_the_starts_are_compared_once(tiny_dropout, tmp_path, forming):
    cfg = with_starts(config(tiny_dropout, tmp_path / "run", "to the cap"), start_steps_max=START_STEPS)
    made = train(cfg)["start"]
    assert [r["steps"] for r in made["rounds"]] == [START_STEPS] and made["compared_at"] == START_STEPS


def test_a_z_not_being_found_is_compared_at_once(tiny_dropout, tmp_path):
    """The rule itself on a tiny run: two steps find no z (exact MI far under 0.02), so no second round."""
    made = train(with_starts(config(tiny_dropout, tmp_path / "run", "to the cap")))["start"]
    assert len(made["rounds"]) == 1 and max(made["rounds"][0]["val_mi"]) < 0.02 and made["compared_at"] == START_STEPS


def test_a_start_past_its_round_is_refused(tiny_dropout, tmp_path, forming):
    """starts.json lost (deleted by hand) while the starts hold later checkpoints: the rounds cannot be replayed."""
    cfg = with_starts(config(tiny_dropout, tmp_path / "run", "to the cap"))
    with pytest.raises(Killed):
        train(cfg, kill_after_step(2 * START_STEPS + 1))  # the first step past round 2: every start is at step 4
    (tmp_path / "run" / "starts.json").unlink()
    with pytest.raises(ValueError, match=r"is at step 4, past the round's 2: .*starts.json has lost its rounds"):
        train(cfg)


def alone(cfg, made: dict):
    """``cfg`` as the single run from the kept start's seed, hardened from the step the starts were compared at."""
    return replace(cfg, optim=replace(cfg.optim, seed=made["seed"]), cvae=replace(cfg.cvae, posterior_likelihood=True),
                   estep=replace(cfg.estep, harden=HARDEN, harden_from=made["compared_at"]))


def test_the_job_ends_where_a_single_run_from_the_chosen_seed_ends(tiny_dropout, started, tmp_path):
    out, result = started
    made = result["start"]
    assert json.loads((out / "config.json").read_text())["estep"]["harden_from"] == made["compared_at"]
    single = tmp_path / "single"
    single_result = train(alone(config(tiny_dropout, single, "to the cap"), made))
    for name in FILES:
        assert (out / "checkpoint" / name).read_bytes() == (single / "checkpoint" / name).read_bytes(), name
    assert (out / "metrics.jsonl").read_text() == (single / "metrics.jsonl").read_text()
    assert result["nll_token_mean"] == single_result["nll_token_mean"]
    unhardened = tmp_path / "unhardened"  # the hardening acts in the job: the run without it ends elsewhere
    cfg = alone(config(tiny_dropout, unhardened, "to the cap"), made)
    train(replace(cfg, estep=replace(cfg.estep, harden=0.0)))
    assert (unhardened / "checkpoint" / "model.safetensors").read_bytes() != (
        single / "checkpoint" / "model.safetensors").read_bytes()


def last_read(run) -> bool:
    """Whether a run's posterior read the likelihood at its last step (eval and encode read it so)."""
    step = json.loads((run / "checkpoint" / "state.json").read_text())["step"]
    return Schedule.of(read_config(run)).at(step - 1).reads_likelihood


def test_the_posterior_reads_the_likelihood_in_the_run_that_goes_on_and_not_in_the_starts(tiny_dropout, started,
                                                                                           tmp_path):
    """The starts are compared by the head alone, and a run that never reaches ``estep.harden_from`` is the run the
    head alone trains, bitwise; the run that goes on reads the likelihood, and eval loads it so."""
    out, result = started
    assert last_read(out) and read_config(out).cvae.posterior_likelihood is True
    for seed in result["start"]["seeds"]:
        assert not last_read(out / "starts" / f"seed-{seed}")
    runs = {}
    for reads in (True, False):  # one start: from step 800, past the cap
        cfg = config(tiny_dropout, tmp_path / str(reads), "to the cap")
        train(replace(cfg, cvae=replace(cfg.cvae, posterior_likelihood=reads)))
        runs[reads] = (tmp_path / str(reads) / "checkpoint" / "model.safetensors").read_bytes()
    assert runs[True] == runs[False]
    old = tmp_path / "old"  # a run's config.json from before the field: its run trained the head alone
    old.mkdir()
    written = json.loads((out / "config.json").read_text())
    del written["cvae"]["posterior_likelihood"]
    (old / "config.json").write_text(json.dumps(written))
    assert read_config(old).cvae.posterior_likelihood is False  # as it trained, where the default is now true
    assert train_config_from(written).cvae.posterior_likelihood is False  # wherever a run's config.json is read


def test_a_start_that_stopped_during_the_rounds_ends_the_job_where_its_single_run_ends(tiny_dropout, tmp_path,
                                                                                         forming):
    """Rounds of one step up to the cap's last: every start converges at 4 and stops at 7 within them, so the run
    goes on from a start with nothing left to train, and still ends as the single run from its seed."""
    job = train(with_starts(config(tiny_dropout, tmp_path / "run", "converges"), start_steps=1))
    assert job["start"]["compared_at"] == CONVERGED_END and job["stop"]["step"] == CONVERGED_END
    single = tmp_path / "single"
    single_result = train(alone(config(tiny_dropout, single, "converges"), job["start"]))
    for name in FILES:
        assert (tmp_path / "run" / "checkpoint" / name).read_bytes() == (single / "checkpoint" / name).read_bytes()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == (single / "metrics.jsonl").read_text()
    assert job["nll_token_mean"] == single_result["nll_token_mean"]


def test_a_finished_job_run_again_trains_nothing(tiny_dropout, started):
    out, result = started
    again = train(with_starts(config(tiny_dropout, out, "to the cap")), Hooks(after_step=never_step))
    assert again["start"] == result["start"] and again["nll_token_mean"] == result["nll_token_mean"]


# in the first start; in the second round; after the choice (three rounds of STARTS * START_STEPS steps)
@pytest.mark.parametrize("n", [1, STARTS * START_STEPS + CKPT_EVERY, 3 * STARTS * START_STEPS + CKPT_EVERY])
def test_a_killed_job_run_again_ends_bitwise_equal(tiny_dropout, started, tmp_path, n, forming):
    cfg = with_starts(config(tiny_dropout, tmp_path / "run", "to the cap"))
    steps = iter(range(1, 10 ** 6))  # the hook counts steps over the whole job, the starts included

    def kill_at_nth_step(_step: int) -> None:
        if next(steps) == n:
            raise Killed(n)

    with pytest.raises(Killed):
        train(cfg, Hooks(after_step=kill_at_nth_step))
    train(cfg)
    for name in FILES:
        assert (tmp_path / "run" / "checkpoint" / name).read_bytes() == (started[0] / "checkpoint" / name).read_bytes()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == (started[0] / "metrics.jsonl").read_text()


def test_a_run_directory_trained_without_starts_is_refused(tiny_dropout, tmp_path):
    cfg = config(tiny_dropout, tmp_path / "run", "to the cap")
    with pytest.raises(Killed):
        train(cfg, kill_after_step(CKPT_EVERY + 1))  # leaves a checkpoint at step CKPT_EVERY
    with pytest.raises(ValueError, match=r"holds a run trained without these starts .* use a new --out"):
        train(with_starts(cfg))
    assert json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())["step"] == CKPT_EVERY


def test_starts_must_be_positive(tiny_dropout, tmp_path):
    with pytest.raises(ValueError, match="starts and start_steps must be >= 1"):
        with_starts(config(tiny_dropout, tmp_path, "to the cap"), starts=0)
    with pytest.raises(ValueError, match=r"start_steps_max \(1\) must be >= start_steps \(2\)"):
        with_starts(config(tiny_dropout, tmp_path, "to the cap"), start_steps_max=1)



def test_a_run_capped_at_start_steps_has_one_start(tiny_dropout, tmp_path):
    cfg = with_starts(config(tiny_dropout, tmp_path / "run", "to the cap"), start_steps=STEPS)
    result = train(cfg)
    assert "start" not in result and not (tmp_path / "run" / "starts").exists()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["optim"]["seed"] == SEED
