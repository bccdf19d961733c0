"""Stage 3, infinite-prompt dynamics: gradient flows on closed-form risks
(docs/theory.md#full-model-infinite-prompt-risk, docs/theory.md#balanced-flow, docs/theory.md#trajectory-transfer).

* ``full_model_flow``: gradient flow on the closed-form R∞ of the §6 model from a seed's initial
  training weights, on a uniform time grid over the training horizon, with its sharpness (the largest
  Hessian eigenvalue) at every grid time: the training schedule and the trapped-run rule read it.
* ``balanced_flow``: the (A, b) flow of paper Thm 5.1 for several balanced starts α.
* ``reduced_model``: the reduced (v, A) model trained by SGD at several L against its infinite-prompt
  flow (isotropic start, closed form); the distance to the flow per (L, seed).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from largeprompt.icl import models
from largeprompt.icl.dynamics import balanced_flow as balanced_flow_path
from largeprompt.icl.dynamics import bayes_point, isotropic_flow, reduced_model_sgd
from largeprompt.icl.dynamics import full_model_flow as full_flow_path
from largeprompt.icl.flow_class import classify_flow
from largeprompt.icl.full_model_risk import full_model_risk
from largeprompt.icl.risks import reduced_infinite_prompt_risk
from largeprompt.icl.task import RegressionTask, regression_task
from largeprompt.icl.training import initial_parameters
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.maths.measures import toeplitz_covariance


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
    thetas, risks = full_flow_path(task, params0, times, **tol)
    print(f"seed {seed}: R_inf from {risks[0]:.4f} to {risks[-1]:.6f} on t in [0, {times[-1]:g}]")
    risk = full_model_risk(task)
    frame = pd.DataFrame({"seed": seed, "time": times, "infinite_prompt_risk": risks,
                          "sharpness": risk.sharpness(thetas), "readout_determinant": risk.readout_determinant(thetas)})
    summaries = [models.parameter_summaries(models.unflatten(torch.tensor(th), task.token_dim), task.token_dim)
                 for th in thetas]
    frame = pd.concat([frame, pd.DataFrame(summaries), pd.DataFrame(thetas).add_prefix("theta_").rename(
        columns=lambda c: f"theta_{int(c[6:]):03d}")], axis=1)
    kind, escape = classify_flow(times, risks, frame["readout_determinant"], task.noise_variance)
    print(f"seed {seed}: largest sharpness {frame['sharpness'].max():.3g} at t = {frame.loc[frame['sharpness'].idxmax(), 'time']:g};"
          f" the flow {kind} (escape at t = {escape:.4g}, det(u_y M_x) = {frame['readout_determinant'].iloc[-1]:.3g} at T)")
    write_parquet(frame, outputs["flow"], provenance(rule, params, base_seed=params["seed"], run_seeds=[seed]))


def balanced_flow(inputs, outputs, params, rule="balanced_flow"):
    """Write results/<run>/infinite/balanced_flow.parquet: R∞(t), b(t), ‖A(t)‖_F for each α, and the Bayes point."""
    icl, cfg = params["icl"], params["infinite"]["balanced_flow"]
    sigma = toeplitz_covariance(icl["dim"], icl["covariance_rho"], dtype=torch.float64).numpy()
    b_star, A_star = bayes_point(sigma)
    times = np.linspace(0.0, cfg["horizon"], cfg["n_times"])
    tol = {k: params["infinite"][k] for k in ("rtol", "atol")}
    frames = []
    for alpha in cfg["alphas"]:
        A, b, risk = balanced_flow_path(sigma, alpha, times, **tol)
        frames.append(pd.DataFrame({
            "alpha": float(alpha),
            "time": times,
            "risk": risk,
            "b": b,
            "norm_A": np.linalg.norm(A, axis=(1, 2)),
            "distance_to_bayes": np.sqrt((b - b_star) ** 2 + ((A - A_star) ** 2).sum(axis=(1, 2))),
            "b_star": b_star,
            "norm_A_star": float(np.linalg.norm(A_star)),
        }))
        print(f"alpha={alpha}: b(T)={b[-1]:.6f} (b*={b_star:.6f}), R(T)={risk[-1]:.3e}")
    write_parquet(pd.concat(frames, ignore_index=True), outputs["flow"], provenance(rule, params))


@dataclass(frozen=True)
class ReducedModelSettings:
    """Config section ``infinite.reduced_model``: the isotropic task and the SGD runs."""

    dim: int
    noise_variance: float
    v0: float
    a0: float
    lr: float
    steps: int
    batch_size: int
    log_every: int
    prompt_lengths: list
    seeds: list


def reduced_task(cfg: ReducedModelSettings) -> RegressionTask:
    """The reduced model's isotropic task: Λ = I_d, τ² = 1, σ² from config (docs/theory.md#reduced-infinite-prompt-risk)."""
    return RegressionTask(np.eye(cfg.dim), 1.0, cfg.noise_variance)


def training_steps(steps: int, log_every: int) -> np.ndarray:
    """The logged steps of a run of ``steps`` steps: multiples of log_every and the last."""
    return np.unique(np.r_[np.arange(0, steps + 1, log_every), steps])


def _reduced_frame(task, L, seed, steps, times, v, A, v_inf, A_inf) -> pd.DataFrame:
    with torch.no_grad():
        risk = [float(reduced_infinite_prompt_risk(task, torch.tensor(vi), torch.tensor(Ai))) for vi, Ai in zip(v, A)]
    dist = np.sqrt((v - v_inf) ** 2 + ((A - A_inf) ** 2).sum(axis=(1, 2)))
    return pd.DataFrame({"prompt_length": L, "seed": seed, "step": steps, "time": times, "v": v,
                         "norm_A": np.linalg.norm(A, axis=(1, 2)), "infinite_prompt_risk": risk,
                         "distance_to_flow": dist})


def reduced_model(inputs, outputs, params, rule="reduced_model"):
    """Write results/<run>/infinite/reduced_model.parquet: SGD at each L and seed, and the L = ∞ flow (prompt_length 0)."""
    cfg = settings_from(ReducedModelSettings, params["infinite"]["reduced_model"], "infinite.reduced_model")
    task = reduced_task(cfg)
    d = task.dim
    steps = training_steps(cfg.steps, cfg.log_every)
    times = cfg.lr * steps
    v_inf, a_inf = isotropic_flow(cfg.v0, cfg.a0, d, times)  # closed form (Λ = I)
    A_inf = a_inf[:, None, None] * np.eye(d)  # [T, d, d]
    frames = [_reduced_frame(task, 0, -1, steps, times, v_inf, A_inf, v_inf, A_inf)]
    for L, s in progress([(L, s) for L in cfg.prompt_lengths for s in cfg.seeds], desc="reduced model SGD"):
        logged, v, A = reduced_model_sgd(task, cfg.v0, cfg.a0 * np.eye(d), L, cfg.lr, cfg.steps, cfg.batch_size,
                                         params["seed"], s, cfg.log_every)
        frames.append(_reduced_frame(task, L, s, logged, cfg.lr * logged, v, A, v_inf, A_inf))
        print(f"L={L} seed={s}: sup distance to the L=inf flow {frames[-1]['distance_to_flow'].max():.4f}")
    write_parquet(pd.concat(frames, ignore_index=True), outputs["result"],
                  provenance(rule, params, base_seed=params["seed"], run_seeds=cfg.seeds))
