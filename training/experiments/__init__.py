"""`tokweight experiment`: the end-to-end grid, the beta sweep and the recipe ablation, built on the library's
own `run`s. One idea per module, each importing only those above it in this list:

- task: the T/(t0+1) settings; TaskConfig holds the generator's and the base trainer's configs
- artefacts: the content-addressed cache of each setting's data, base model and store
- cells: one CVAE cell (TrainConfig through the recipe check, key, train + evaluate -> record), the process pool
- aggregate: mean ± std over seeds
- report: what every results file shares (config JSON, CSV, Markdown header)
- grid_report, grid: the experiment grid's results.md and figures; its configs, cells and job
- collapse, sweep_report, sweep: beta_c as defined; the sweep's beta_threshold.md and figures; its job
- ablation: remedy x weighting runs of scripts/ablate_recipe.py
"""
