"""The reporting layer: markdown, tables and plots over the plain data the layers below return.

Above training (it reads what ``store``, ``pipeline`` and ``training`` compute) and below the CLI
root and the experiments, which render through it. The store's inspection numbers
(``store.inspection``) become `tokweight inspect`'s report here (``inspect``); eval.json
(``training.evaluation.evaluate.run_eval``) becomes eval.md (``eval_md``).
"""
