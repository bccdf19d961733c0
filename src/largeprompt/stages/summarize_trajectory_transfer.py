"""Rule ``summarize_trajectory_transfer`` (R4; docs/experiments.md#trajectory_transfer): the sup-distance of every transfer run to the
infinite-prompt flow from its own initial weights, the SGD-noise and Euler floors, the distance to its coupled L = ∞
run (docs/theory.md#coupled-limit) with its noise floor, and the slopes over L; the
analysis is :mod:`largeprompt.icl.trajectory_transfer`. The reduced model's runs (their own stage) enter the same tables,
with the floors its seeds measure."""
from __future__ import annotations

import pandas as pd

from largeprompt.icl.bounded_risk import icl_quadrature, task_limits
from largeprompt.icl.task import regression_task
from largeprompt.icl.trajectory_transfer import full_model_gaps, reduced_gaps, slopes, with_floor_threshold
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.provenance import provenance


def summarize_trajectory_transfer(inputs, outputs, params, rule="summarize_trajectory_transfer"):
    """Write results/<run>/trajectory_transfer/gaps.parquet (one row per run) and slopes.parquet."""
    task = regression_task(params["icl"])
    tol = {k: params["infinite"][k] for k in ("rtol", "atol")}
    runs = pd.concat([read_parquet(p) for p in inputs["trajectories"]], ignore_index=True)
    lr = float(params["trajectory_transfer"]["lr"])
    risks = task_limits(task, icl_quadrature(params["icl"]))  # None for Gaussian covariates: one closed form
    gaps = pd.concat([full_model_gaps(runs, task, int(params["seed"]), tol, lr, risks),
                      reduced_gaps(read_parquet(inputs["reduced"]))], ignore_index=True)
    gaps["transfer_lr"] = lr
    gaps["stability_limit"] = 2.0 / gaps["transfer_lr"]  # the sharpness above which the transfer runs' SGD is unstable
    factor = float(params["trajectory_transfer"]["floor_factor"])
    gaps = with_floor_threshold(gaps, factor)
    prov = provenance(rule, params, base_seed=params["seed"], run_seeds=sorted(gaps["seed"].unique()))
    write_parquet(gaps, outputs["gaps"], prov)
    write_parquet(slopes(gaps, factor), outputs["slopes"], prov)
