"""`tokweight experiment`: the end-to-end grid, the beta sweep and the user's own task, built on the library's
own `run`s. One module per job, each holding its config, its cells, its run and the rendering of its results
from plain data; the shared pieces below them. Each module imports only those above it in this list:

- recipes: the remedy presets the experiments compare against `tokweight train`'s default
- artefacts: the synthetic T/(t0+1) settings (TaskConfig) and the content-addressed cache of each setting's
  data, base model and store
- cells: one CVAE cell (TrainConfig through the recipe, key, train + evaluate -> record) and the process pool;
  the one cell cache of every job
- results: mean ± std over seeds, when z counts as kept and beta_c, the CSV and config files, the Markdown header
- grid: the experiment grid (results.md, MI against T/(t0+1), gradient amplification)
- sweep: the collapse threshold beta_c per weighting and setting (--sweep beta)
- own_task: your own task (--checkpoint, --data); own_task.inputs checks the checkpoint, data and store and
  extracts the store once, own_task.render writes results.md with its generated verdict, and the figure
"""
