"""R4 and R6 with Gaussian, Rademacher and uniform covariates on one isotropic task (docs/experiments.md#beyond_gaussian):
the task of each measure, the infinite-prompt flows of both models, and the outcome of the R6 runs.

Softmax's L = ∞ limit is the quadrature R∞ of :mod:`largeprompt.icl.bounded_risk` (the Gaussian closed form for
Gaussian covariates); linear attention's is the Gaussian closed form for every measure. The runs are judged by the
status rule of :mod:`largeprompt.icl.run_status`, as the §6 runs are.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from largeprompt.icl import models
from largeprompt.icl.bounded_risk import Quadrature, limit_risk
from largeprompt.icl.dynamics import full_model_flow
from largeprompt.icl.flow_class import classify_flow
from largeprompt.icl.run_status import StatusRule, final_loss, judge, readout
from largeprompt.icl.task import RegressionTask
from largeprompt.icl.training import initial_parameters
from largeprompt.maths.rates import t_interval

QUADRATURE_CHECKS = 5  # flow times at which the quadrature error is measured against the refined rule


def measure_task(section: dict, measure: str) -> RegressionTask:
    """The task of config section ``beyond_gaussian`` with covariates of ``measure``: Λ = I in ``dim`` dimensions."""
    d = int(section["dim"])
    return RegressionTask(torch.eye(d, dtype=torch.float64), section["task_variance"], section["noise_variance"], measure)


def flow_rows(task: RegressionTask, model: str, seed: int, base_seed: int, times, tol: dict,
              quadrature: Quadrature) -> pd.DataFrame:
    """The R∞ flow of ``model`` from seed's initial weights on ``times`` [G]: R∞, sharpness (on the coarse rule for
    bounded covariates, docs/theory.md#bounded-token-risk), det(u_y M_x), norms, the quadrature error at a few times
    (0 for a closed form), the class of the flow and θ."""
    risk = limit_risk(task, model, quadrature)
    thetas, risks = full_model_flow(task, initial_parameters(base_seed, seed, task.token_dim), times, **tol, risk=risk)
    sharp = risk.solver_risk().sharpness(thetas)
    frame = pd.DataFrame({"model": model, "seed": int(seed), "time": times, "infinite_prompt_risk": risks,
                          "sharpness": sharp, "readout_determinant": risk.readout_determinant(thetas)})
    summaries = [models.parameter_summaries(models.unflatten(torch.tensor(th), task.token_dim), task.token_dim)
                 for th in thetas]
    frame = pd.concat([frame, pd.DataFrame(summaries)], axis=1)
    frame["quadrature_error"] = np.nan
    checks = np.unique(np.linspace(0, len(times) - 1, QUADRATURE_CHECKS).round().astype(int))
    error = getattr(risk, "quadrature_error", lambda th: np.zeros(len(th)))
    frame.loc[checks, "quadrature_error"] = error(thetas[checks])
    frame["flow_class"], frame["flow_escape_time"] = classify_flow(times, risks, frame["readout_determinant"],
                                                                   task.noise_variance)
    frame["theta"] = list(thetas)
    return frame


def run_outcomes(trajectories: pd.DataFrame, rule: dict, linear_optimum: dict) -> pd.DataFrame:
    """One row per R6 run: final test loss and R∞ (mean over the last tenth of its time), the attention scale
    ‖U_xx‖ and value weight u_y at its end, and its status within its (token_measure, model, L) by the §6 status rule
    (``rule``: config ``train.trapped_*``; ``linear_optimum``: L → R(Γ*) on the test set, linear's floor)."""
    rows = []
    for (measure, model, L, seed, stream), g in trajectories.groupby(
            ["token_measure", "model", "prompt_length", "seed", "stream"]):
        g = g.sort_values("step")
        last = g.iloc[-1]
        diverged = bool((g["status"] == "diverged").any())
        rows.append({"token_measure": measure, "model": model, "prompt_length": int(L), "seed": int(seed),
                     "stream": int(stream), "time": float(last["time"]), "diverged": diverged,
                     "final_test_loss": float(last["test_loss"]) if diverged else final_loss(g["time"], g["test_loss"]),
                     "final_infinite_prompt_risk": final_loss(g["time"], g["infinite_prompt_risk"]),
                     "attention_scale": float(last["norm_U_xx"]), "u_y": float(last["u_y"]),
                     "readout": float(readout(last["u_y"], last["norm_U_xx"])),
                     "stability_margin": float(last["stability_margin"])})
    runs = pd.DataFrame(rows)
    parts = []
    for (measure, model, L), g in runs.groupby(["token_measure", "model", "prompt_length"]):
        status = StatusRule(float(rule["trapped_loss_ratio"][model]), float(rule["trapped_readout_fraction"]))
        parts.append(g.join(judge(g, status, linear_optimum[(measure, L)] if model == "linear" else np.inf)))
    return pd.concat(parts).sort_index()


def prompt_length_stats(runs: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """One row per (token_measure, model, L): counts per status and, over the ok runs of the shared batch stream,
    the mean final test loss and attention scale with their Student-t intervals."""
    rows = []
    for (measure, model, L), g in runs[runs["stream"] == 0].groupby(["token_measure", "model", "prompt_length"]):
        ok = g[g["status"] == "ok"]
        row = {"token_measure": measure, "model": model, "prompt_length": int(L), "n_seeds": len(g), "n_ok": len(ok),
               "n_trapped": int((g["status"] == "trapped").sum()), "n_diverged": int((g["status"] == "diverged").sum())}
        for col in ("final_test_loss", "attention_scale"):
            row[f"{col}_mean"], row[f"{col}_lo"], row[f"{col}_hi"] = t_interval(ok[col], level)
        rows.append(row)
    return pd.DataFrame(rows)
