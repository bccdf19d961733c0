"""Rule ``full_model_flow`` (docs/theory.md#full-model-infinite-prompt-risk): gradient flow on the closed-form R∞
of the §6 model from a seed's initial training weights, on a uniform time grid over the training horizon, with its
sharpness (the largest Hessian eigenvalue) and det(u_y M_x) at every grid time: the training schedule, the
drifting-run cut and the summary read it."""
from __future__ import annotations

import numpy as np

from largeprompt.icl.bounded_risk import icl_quadrature, limit_risk
from largeprompt.icl.dynamics import flow_table
from largeprompt.icl.dynamics import full_model_flow as full_flow_path
from largeprompt.icl.engine.runs import initial_parameters
from largeprompt.icl.flow_class import classify_flow
from largeprompt.icl.task import regression_task
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.provenance import provenance


def flow_times(horizon: float, n_points: int) -> np.ndarray:
    """The uniform grid 0 = t_0 < … < t_{n−1} = horizon on which each full-model flow is logged."""
    return np.linspace(0.0, float(horizon), int(n_points))


def full_model_flow(inputs, outputs, params, rule="full_model_flow"):
    """Write results/<run>/infinite/full_model_seed{seed}.parquet: θ(t), R∞(θ(t)), the sharpness and det(u_y M_x)."""
    task = regression_task(params["icl"])
    seed = int(params["run_seed"])
    times = flow_times(params["train"]["horizon"], params["infinite"]["flow_points"])
    params0 = initial_parameters(params["seed"], seed, task.token_dim)
    tol = {k: params["infinite"][k] for k in ("rtol", "atol")}
    risk = limit_risk(task, "softmax", icl_quadrature(params["icl"]))  # the closed form for Gaussian covariates
    thetas, risks = full_flow_path(task, params0, times, **tol, risk=risk)
    print(f"seed {seed}: R_inf from {risks[0]:.4f} to {risks[-1]:.6f} on t in [0, {times[-1]:g}]")
    frame = flow_table(risk, seed, times, thetas, risks, task.token_dim)
    kind, escape = classify_flow(times, risks, frame["readout_determinant"], task.noise_variance)
    print(f"seed {seed}: largest sharpness {frame['sharpness'].max():.3g} at t = {frame.loc[frame['sharpness'].idxmax(), 'time']:g};"
          f" the flow {kind} (escape at t = {escape:.4g}, det(u_y M_x) = {frame['readout_determinant'].iloc[-1]:.3g} at T)")
    write_parquet(frame, outputs["flow"], provenance(rule, params, base_seed=params["seed"], run_seeds=[seed]))


