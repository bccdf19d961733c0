"""Stage 3, infinite-prompt dynamics (SPEC §3.1 stage 3; R4, R5, F6).

* ``full_model_flow``: gradient flow on the closed-form R∞ of the §6 model from a seed's initial
  training weights, logged at the training times.
* ``balanced_flow``: the R5 (A, b) flow for several balanced starts α, with the paper's Σ.
* ``reduced_model``: the reduced (v, A) model trained by SGD at several L against its infinite-prompt
  flow (isotropic start, closed form of THEORY §F(iii)); the sup-distance on the horizon per (L, seed).
* ``trajectory_gap``: sup_t ‖θ_L(t) − θ_∞(t)‖ for the §6 training runs and log-log slopes with CIs.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from .. import models
from ..dynamics import balanced_flow as balanced_flow_path
from ..dynamics import bayes_point, full_model_flow as full_flow_path, full_model_sharpness, isotropic_flow, reduced_model_sgd
from ..icl import RegressionTask, reduced_infinite_prompt_risk
from ..measures import toeplitz_covariance
from ..parquet_io import read_parquet, write_parquet
from ..provenance import provenance
from ..rates import loglog_slope
from ..runlog import progress
from ..training import initial_parameters
from .icl_data import regression_task


def training_steps(steps: int, log_every: int) -> np.ndarray:
    """The logged steps of a training run of ``steps`` steps (SPEC §3.1 stage 2): multiples of log_every and the last."""
    return np.unique(np.r_[np.arange(0, steps + 1, log_every), steps])


def full_model_flow(inputs, outputs, params, rule="full_model_flow"):
    """Write results/infinite/full_model_seed{seed}.parquet."""
    task = regression_task(params["icl"])
    train, seed = params["train"], int(params["run_seed"])
    steps = training_steps(train["steps"], train["log_every"])
    times = train["lr"] * steps
    params0 = initial_parameters(params["seed"], seed, task.token_dim)
    thetas, risks = full_flow_path(task, params0, times, **params["infinite"])
    print(f"seed {seed}: R_inf from {risks[0]:.4f} to {risks[-1]:.6f} on t in [0, {times[-1]:g}]")
    # sharpness (largest Hessian eigenvalue) on about 60 of the logged times: SGD follows the flow only below 2/lr
    every = max(1, len(steps) // 60)
    rows = []
    for i, (step, t, theta, risk) in enumerate(zip(steps, times, thetas, risks)):
        p = models.unflatten(torch.tensor(theta), task.token_dim)
        sharp = full_model_sharpness(task, theta) if i % every == 0 or i == len(steps) - 1 else float("nan")
        row = {"seed": seed, "step": int(step), "time": float(t), "infinite_prompt_risk": float(risk), "sharpness": sharp}
        row.update(models.parameter_summaries(p, task.token_dim))
        row.update({f"theta_{i:03d}": float(x) for i, x in enumerate(theta)})
        rows.append(row)
    write_parquet(pd.DataFrame(rows), outputs["flow"], provenance(rule, params, seed=seed))


def balanced_flow(inputs, outputs, params, rule="balanced_flow"):
    """Write results/infinite/balanced_flow.parquet: R∞(t), b(t), ‖A(t)‖_F for each α, and the Bayes point."""
    icl, cfg = params["icl"], params["balanced_flow"]
    sigma = toeplitz_covariance(icl["dim"], icl["covariance_rho"], dtype=torch.float64).numpy()
    b_star, A_star = bayes_point(sigma)
    times = np.linspace(0.0, cfg["horizon"], cfg["n_times"])
    frames = []
    for alpha in cfg["alphas"]:
        A, b, risk = balanced_flow_path(sigma, alpha, times, **params["infinite"])
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
    write_parquet(pd.concat(frames, ignore_index=True), outputs["flow"], provenance(rule, params, seed=None))


def reduced_task(cfg: dict) -> RegressionTask:
    """The reduced model's isotropic task: Λ = I_d, τ² = 1, σ² from config (THEORY §F)."""
    return RegressionTask(np.eye(cfg["dim"]), 1.0, cfg["noise_variance"])


def reduced_model(inputs, outputs, params, rule="reduced_model"):
    """Write results/infinite/reduced_model.parquet: SGD at each L and seed, and the L = ∞ flow (prompt_length 0)."""
    cfg = params["reduced_model"]
    task = reduced_task(cfg)
    d = task.dim
    A0 = cfg["a0"] * np.eye(d)
    steps = training_steps(cfg["steps"], cfg["log_every"])
    times = cfg["lr"] * steps
    v_inf, a_inf = isotropic_flow(cfg["v0"], cfg["a0"], d, times)  # closed form (Λ = I)
    A_inf = a_inf[:, None, None] * np.eye(d)  # [T, d, d]
    with torch.no_grad():
        risk_inf = [float(reduced_infinite_prompt_risk(task, torch.tensor(v), torch.tensor(A))) for v, A in zip(v_inf, A_inf)]
    frames = [pd.DataFrame({"prompt_length": 0, "seed": -1, "step": steps, "time": times, "v": v_inf,
                            "norm_A": np.linalg.norm(A_inf, axis=(1, 2)), "infinite_prompt_risk": risk_inf,
                            "distance_to_flow": 0.0})]
    jobs = [(L, s) for L in cfg["prompt_lengths"] for s in cfg["seeds"]]
    for L, s in progress(jobs, desc="reduced model SGD"):
        logged, v, A = reduced_model_sgd(task, cfg["v0"], A0, L, cfg["lr"], cfg["steps"], cfg["batch_size"],
                                         params["seed"], s, cfg["log_every"])
        dist = np.sqrt((v - v_inf) ** 2 + ((A - A_inf) ** 2).sum(axis=(1, 2)))
        with torch.no_grad():
            risk = [float(reduced_infinite_prompt_risk(task, torch.tensor(vi), torch.tensor(Ai))) for vi, Ai in zip(v, A)]
        frames.append(pd.DataFrame({"prompt_length": L, "seed": s, "step": logged, "time": cfg["lr"] * logged, "v": v,
                                    "norm_A": np.linalg.norm(A, axis=(1, 2)), "infinite_prompt_risk": risk,
                                    "distance_to_flow": dist}))
        print(f"L={L} seed={s}: sup distance to the L=inf flow {dist.max():.4f}")
    write_parquet(pd.concat(frames, ignore_index=True), outputs["result"], provenance(rule, params, seed=params["seed"]))


def trajectory_gap(inputs, outputs, params, rule="trajectory_gap"):
    """Write results/infinite/trajectory_gap.parquet: sup_{t ≤ horizon} ‖θ_L(t) − θ_∞(t)‖ per run, and slopes.

    Rows with ``kind`` = ``gap`` hold one run each (experiment ``full_model`` for the §6 training runs,
    ``reduced_model`` for the reduced SGD); rows with ``kind`` = ``fit`` hold the log-log slope over L.
    """
    horizon = params["horizon"]
    flows = {}
    for path in inputs["flows"]:
        f = read_parquet(path)
        flows[int(f["seed"].iloc[0])] = f.set_index("step")
    rows = []
    for path in inputs["runs"]:
        run = read_parquet(path)
        flow = flows[int(run["seed"].iloc[0])]
        theta_cols = [c for c in run.columns if c.startswith("theta_")]
        status = "diverged" if (run["status"] == "diverged").any() else "ok"  # anywhere in the run, not only before the horizon
        run = run[(run["time"] <= horizon) & run["step"].isin(flow.index)]
        diff = run[theta_cols].to_numpy() - flow.loc[run["step"], theta_cols].to_numpy()  # [T, P]
        rows.append({"kind": "gap", "experiment": "full_model", "model": run["model"].iloc[0],
                     "prompt_length": int(run["prompt_length"].iloc[0]), "seed": int(run["seed"].iloc[0]),
                     "sup_distance": float(np.linalg.norm(diff, axis=1).max()),
                     "status": status})
    reduced = read_parquet(inputs["reduced"])
    reduced = reduced[reduced["prompt_length"] > 0]  # its whole run is the horizon
    for (L, s), g in reduced.groupby(["prompt_length", "seed"]):
        rows.append({"kind": "gap", "experiment": "reduced_model", "model": "softmax", "prompt_length": int(L),
                     "seed": int(s), "sup_distance": float(g["distance_to_flow"].max()), "status": "ok"})
    gaps = pd.DataFrame(rows)
    fits = []
    for (exp, model), g in gaps[gaps["status"] == "ok"].groupby(["experiment", "model"]):
        if g["prompt_length"].nunique() >= 2:
            fit = loglog_slope(g["prompt_length"], g["sup_distance"])
            fits.append({"kind": "fit", "experiment": exp, "model": model, **fit})
            print(f"{exp} {model}: slope {fit['slope']:.3f} [{fit['slope_lo']:.3f}, {fit['slope_hi']:.3f}]")
    frame = pd.concat([gaps, pd.DataFrame(fits)], ignore_index=True)
    write_parquet(frame, outputs["result"], provenance(rule, params, seed=None))
