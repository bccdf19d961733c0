"""Rule ``bayes_risk``: per L, the Bayes (ridge) risk and the best linear-attention risk R(Γ*) on the test
set, and R(Γ*) in closed form (docs/theory.md#bayes-risk, docs/theory.md#linear-attention-optimum)."""
from __future__ import annotations

import pandas as pd

from largeprompt.icl.task import regression_task
from largeprompt.icl.test_set import bayes_prompt_lengths, load_test_set, reference_risks
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.provenance import provenance


def bayes_risk(inputs, outputs, params, rule="bayes_risk"):
    """Write results/<run>/icl/bayes_risk.parquet: per L, the reference risks of :func:`reference_risks`."""
    icl, lengths = params["icl"], params["train"]["prompt_lengths"]
    task = regression_task(icl)
    test_set = load_test_set(read_parquet(inputs["test_set"]))
    ridge = icl["noise_variance"] / icl["task_variance"]
    rows = [reference_risks(task, test_set, L, ridge) for L in bayes_prompt_lengths(lengths)]
    frame = pd.DataFrame(rows)
    frame["in_training_grid"] = frame["prompt_length"].isin(set(lengths))
    write_parquet(frame, outputs["bayes_risk"], provenance(rule, params))
