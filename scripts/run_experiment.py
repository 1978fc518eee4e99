"""Run `tokweight experiment` without the console script: python scripts/run_experiment.py --out DIR [--quick]."""

from tokweight.commands.experiment import experiment

if __name__ == "__main__":
    experiment(prog_name="run_experiment.py")
