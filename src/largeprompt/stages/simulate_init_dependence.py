"""Rule ``simulate_init_dependence`` (docs/experiments.md#init_dependence): the R∞ flow of every init seed
0 … n−1 to 2T, classified at T and at 2T (:mod:`largeprompt.icl.init_dependence`)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from largeprompt.icl import models
from largeprompt.icl.bounded_risk import icl_quadrature, limit_risk
from largeprompt.icl.engine.runs import initial_parameters
from largeprompt.icl.init_dependence import classification_times, seed_row
from largeprompt.icl.task import regression_task
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress


@dataclass(frozen=True)
class InitFlowSettings:
    """Config ``init_dependence``: the seeds 0 … n_seeds−1 and the classification horizon T."""

    n_seeds: int
    horizon: float


def simulate_init_dependence(inputs, outputs, params, rule="simulate_init_dependence"):
    """Write results/<run>/init_dependence/flows.parquet: one row per init seed (module docstring)."""
    cfg = settings_from(InitFlowSettings, params["init_dependence"], "init_dependence")
    task = regression_task(params["icl"])
    risk = limit_risk(task, "softmax", icl_quadrature(params["icl"]))
    times = classification_times(cfg.horizon)
    tol = {k: params["infinite"][k] for k in ("rtol", "atol")}
    rows = []
    for seed in progress(range(cfg.n_seeds), desc=f"flows of {cfg.n_seeds} inits to t = {times[-1]:g}"):
        theta0 = models.flatten(initial_parameters(params["seed"], seed, task.token_dim)).numpy()
        rows.append({"seed": seed, **seed_row(risk, theta0, times, tol, task.noise_variance)})
    frame = pd.DataFrame(rows)
    counts = frame["flow_class"].value_counts().to_dict()
    changed = int((frame["flow_class"] != frame["flow_class_doubled_horizon"]).sum())
    print(f"classes at T = {cfg.horizon:g}: {counts}; doubling T changes {changed} of {cfg.n_seeds}")
    write_parquet(frame, outputs["flows"], provenance(rule, params, base_seed=params["seed"],
                                                      run_seeds=list(range(cfg.n_seeds))))
