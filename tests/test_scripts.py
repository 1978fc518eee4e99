"""Every script in scripts/ loads and answers --help: its imports and module-level code still match the
package (a renamed recipe or config field breaks a driver nobody runs until a session needs it)."""

import runpy
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_script_answers_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out.lower()  # argparse: "usage:", click: "Usage:"


def test_defaults_table_reads_a_remedy_over_the_default_and_refuses_a_bad_one():
    remedy_fields = runpy.run_path(str(SCRIPTS[0].parent / "defaults_table.py"))["remedy_fields"]
    fields = dict(remedy_fields(["estep.prior=uniform", "latent_embedding_norm=1"], "discrete"))
    assert fields["latent_embedding_norm"] == 1.0 and isinstance(fields["latent_embedding_norm"], float)
    assert fields["estep"].prior == "uniform" and fields["estep"].balance_iters == 3  # the rest: the default's
    for bad, message in ((["estep.prior=bogus"], "estep prior must be one of"), (["prior"], "expected FIELD=VALUE"),
                         (["estep.nope=1"], "nope")):
        with pytest.raises(SystemExit, match=message):
            remedy_fields(bad, "discrete")
