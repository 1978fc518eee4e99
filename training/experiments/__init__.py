"""`tokweight experiment`: the end-to-end grid, the beta sweep, and the user's own task,
built on the library's own `run`s. One idea per module, each importing only those above it in this list:

- task: the T/(t0+1) settings; TaskConfig holds the generator's and the base trainer's configs
- artefacts: the content-addressed cache of each setting's data, base model and store
- cells: one CVAE cell (TrainConfig through the recipe check, key, train + evaluate -> record), the process pool
- aggregate: mean ± std over seeds
- report: what every results file shares (config JSON, CSV, Markdown header)
- grid_report, grid: the experiment grid's results.md and figures; its configs, cells and job
- collapse, sweep_report, sweep: beta_c as defined; the sweep's beta_threshold.md and figures; its job
- own_inputs, own_cells, own_report, own_task: your own task (--checkpoint, --data): the checks on checkpoint, data
  and store, the store extracted once and what it predicts; arm x beta x seed cells with the control against each
  example's reference; results.md with its generated verdict, and the figure; its config and job
"""
