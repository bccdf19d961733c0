"""R4 and R6 with Gaussian, Rademacher and uniform covariates on one isotropic task (docs/experiments.md#beyond_gaussian):
the task of each measure, the infinite-prompt flows of both models, and the outcome of the R6 runs.

Softmax's L = ∞ limit is the quadrature R∞ of :mod:`largeprompt.icl.bounded_risk` (the Gaussian closed form for
Gaussian covariates); linear attention's is the Gaussian closed form for every measure. The runs are judged by the
status rule of :mod:`largeprompt.icl.engine.status`, as the §6 runs are.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from largeprompt.icl.bounded_risk import Quadrature, limit_risk
from largeprompt.icl.dynamics import flow_table, full_model_flow
from largeprompt.icl.engine.runs import initial_parameters
from largeprompt.icl.engine.status import change_window, judge, run_outcome, status_counts, status_rule
from largeprompt.icl.flow_class import classify_flow
from largeprompt.icl.sgd_excess import sgd_excess_columns
from largeprompt.icl.task import RegressionTask
from largeprompt.icl.test_set import test_set_frame
from largeprompt.maths.rates import t_interval

QUADRATURE_CHECKS = 5  # flow times at which the quadrature error is measured against the refined rule
TEST_STREAM = "beyond_gaussian/test"  # test prompts of measure m: stream (seed, "beyond_gaussian/test/<m>", 0)


def measure_task(section: dict, measure: str) -> RegressionTask:
    """The task of config section ``beyond_gaussian`` with covariates of ``measure``: Λ = I in ``dim`` dimensions."""
    d = int(section["dim"])
    return RegressionTask(torch.eye(d, dtype=torch.float64), section["task_variance"], section["noise_variance"], measure)


def measure_test_set(params, task, max_prompt_length: int):
    """The held-out prompts of this measure at ``max_prompt_length`` (shorter L read prefixes)."""
    section = params["beyond_gaussian"]
    return test_set_frame(task, int(section["n_test"]), max_prompt_length, int(params["seed"]),
                          stream=f"{TEST_STREAM}/{task.token_measure}")


def flow_rows(task: RegressionTask, model: str, seed: int, base_seed: int, times, tol: dict,
              quadrature: Quadrature) -> pd.DataFrame:
    """The R∞ flow of ``model`` from seed's initial weights on ``times`` [G]: R∞, sharpness (on the coarse rule for
    bounded covariates, docs/theory.md#bounded-token-risk), det(u_y M_x), norms, the quadrature error at a few times
    (0 for a closed form), the class of the flow and θ."""
    risk = limit_risk(task, model, quadrature)
    thetas, risks = full_model_flow(task, initial_parameters(base_seed, seed, task.token_dim), times, **tol, risk=risk)
    frame = flow_table(risk, seed, times, thetas, risks, task.token_dim)
    frame.insert(0, "model", model)
    frame["quadrature_error"] = np.nan
    checks = np.unique(np.linspace(0, len(times) - 1, QUADRATURE_CHECKS).round().astype(int))
    error = getattr(risk, "quadrature_error", lambda th: np.zeros(len(th)))
    frame.loc[checks, "quadrature_error"] = error(thetas[checks])
    frame["flow_class"], frame["flow_escape_time"] = classify_flow(times, risks, frame["readout_determinant"],
                                                                   task.noise_variance)
    return frame


def run_outcomes(trajectories: pd.DataFrame, rule: dict, linear_optimum: dict) -> pd.DataFrame:
    """One row per R6 run: final test loss and R∞ (mean over the last tenth of its time), the attention scale
    ‖U_xx‖ and value weight u_y at its end, and its status within its (token_measure, model, L) by the §6 status rule
    (``rule``: config ``train.trapped_*``, ``train.unconverged_change`` and ``train.convergence_window``;
    ``linear_optimum``: L → R(Γ*) on the test set, linear's floor)."""
    keys = ("token_measure", "model", "prompt_length", "seed", "stream", "time", "norm_U_xx", "u_y", "stability_margin")
    window = change_window(rule)
    runs = pd.DataFrame([run_outcome(g, keys, window) for _, g in trajectories.groupby(list(keys[:5]))])
    runs = runs.rename(columns={"norm_U_xx": "attention_scale"})
    parts = []
    for (measure, model, L), g in runs.groupby(["token_measure", "model", "prompt_length"]):
        parts.append(g.join(judge(g, status_rule(rule, model), linear_optimum[(measure, L)] if model == "linear" else np.inf)))
    return pd.concat(parts).sort_index()


def prompt_length_stats(runs: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """One row per (token_measure, model, L): counts per status and, over the ok runs of the shared batch stream,
    the mean final test loss and attention scale with their Student-t intervals, and SGD's predicted stationary
    excess where the runs carry it."""
    rows = []
    for (measure, model, L), g in runs[runs["stream"] == 0].groupby(["token_measure", "model", "prompt_length"]):
        ok = g[g["status"] == "ok"]
        row = {"token_measure": measure, "model": model, "prompt_length": int(L), "n_seeds": len(g), **status_counts(g)}
        for col in ("final_test_loss", "attention_scale"):
            row[f"{col}_mean"], row[f"{col}_lo"], row[f"{col}_hi"] = t_interval(ok[col], level)
        rows.append(row | sgd_excess_columns(ok))
    return pd.DataFrame(rows)


def flow_end_scales(flows: pd.DataFrame) -> pd.DataFrame:
    """One row per token_measure of ``flows`` (the ``flow_beyond_gaussian`` tables): the median attention scale
    ‖U_xx‖ at the horizon over its converging softmax flows, and how many there are (NaN, 0 without any)."""
    rows = []
    for measure, f in flows.groupby("token_measure", sort=False):
        ends = f[(f["model"] == "softmax") & (f["flow_class"] == "converges")]
        ends = ends[ends["time"] == ends["time"].max()]
        rows.append({"token_measure": measure, "n_converging_flows": len(ends),
                     "flow_end_attention_scale": float(ends["norm_U_xx"].median()) if len(ends) else np.nan})
    return pd.DataFrame(rows)
