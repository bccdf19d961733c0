"""Rule ``summarize_training``: the R6 results tables of :mod:`largeprompt.icl.training_summary`, one row per run and
one per (model, L) (docs/experiments.md#training_vs_prompt_length, docs/experiments.md#run-status)."""
from __future__ import annotations

import pandas as pd

from largeprompt.icl.sgd_excess import run_excesses
from largeprompt.icl.task import regression_task
from largeprompt.icl.training_summary import SummarySettings, flow_row, prompt_length_table, run_table, summary_line, theory_of
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.pipeline import settings_from
from largeprompt.io.provenance import provenance


def summarize_training(inputs, outputs, params, rule="summarize_training"):
    """Write results/<run>/train/training_runs.parquet (one row per run) and training_prompt_lengths.parquet."""
    cfg = settings_from(SummarySettings, params["train"], "train")
    task = regression_task(params["icl"])
    bayes = read_parquet(inputs["bayes_risk"]).set_index("prompt_length")
    flows = pd.DataFrame([flow_row(read_parquet(p), task.noise_variance) for p in inputs["flows"]])
    trajectories = pd.concat([read_parquet(p) for p in inputs["trajectories"]], ignore_index=True)
    runs = run_table(trajectories, flows, bayes, cfg, task.noise_variance)
    excess = run_excesses(runs, trajectories, task, int(params["train"]["batch_size"]), int(params["seed"]))
    runs = runs.merge(excess, on=["model", "prompt_length", "seed", "stream"], how="left")
    table = prompt_length_table(runs, trajectories, bayes, theory_of(task), cfg)
    for r in table.itertuples():
        print(summary_line(r))
    prov = provenance(rule, params, run_seeds=sorted(runs["seed"].unique()))
    write_parquet(runs, outputs["runs"], prov)
    write_parquet(table, outputs["prompt_lengths"], prov)
