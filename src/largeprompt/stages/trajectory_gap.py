"""R4: how far finite-L training strays from the infinite-prompt flow (docs/experiments.md#trajectory_transfer,
docs/theory.md#trajectory-transfer).

For the §6 transfer runs the flow from each seed's initial weights is integrated at the runs' own logged
times. Per run, ``sup_distance`` = sup_t ‖θ_L(t) − θ_∞(t)‖. Two parts of it do not fall with L:

* the SGD noise: ``noise_floor`` at (model, L) is sup_t ‖θ_L(t) − θ'_L(t)‖ between the two batch streams of a
  replicate seed (the same L and init); seeds without a replicate use the mean floor of the replicate seeds at
  that (model, L);
* the Euler error of the step lr: ``euler_floor`` per seed is sup_t ‖θ^GD_∞(t) − θ_∞(t)‖, plain gradient descent
  with the runs' lr on R∞ against the flow (docs/theory.md#euler-floor).

``floor`` is the larger of the two. The slope over L is a least-squares fit of log sup_distance on log L with one
intercept per seed, over the points whose gap exceeds ``floor_factor`` × their floor. The reduced model's runs
(their own stage) enter the same tables, with no floor measured.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from largeprompt.icl.dynamics import full_model_flow, full_model_gradient_descent
from largeprompt.icl.task import regression_task
from largeprompt.icl.training import initial_parameters
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.provenance import provenance
from largeprompt.maths.rates import loglog_slope_by_group

KEYS = ["model", "prompt_length", "seed"]


def weights(rows: pd.DataFrame) -> np.ndarray:
    """The weights θ [T, P] of trajectory rows (column ``theta``: one list per row, largeprompt.icl.models.flatten order)."""
    return np.stack(rows["theta"].to_list())


def flow_at(task, base_seed: int, seed: int, times: np.ndarray, tol: dict) -> np.ndarray:
    """θ_∞ of ``seed``'s flow at ``times`` [T]: [T, P]."""
    thetas, _ = full_model_flow(task, initial_parameters(base_seed, seed, task.token_dim), times, **tol)
    return thetas


def flow_and_euler_floor(task, base_seed: int, seed: int, shared: pd.DataFrame, lr: float, tol: dict):
    """(θ_∞ at the run's logged times [T, P], the Euler floor sup_t ‖θ^GD_∞(t) − θ_∞(t)‖ of the step lr)."""
    steps, times = shared["step"].to_numpy(), shared["time"].to_numpy()
    if not np.allclose(times, lr * steps, rtol=1e-9, atol=0.0):
        raise ValueError(f"trajectory_gap: seed {seed}'s run is not constant-step SGD at transfer.lr = {lr} "
                         "(its time is not lr·step), so its Euler floor is not the one of plain gradient descent")
    flow = flow_at(task, base_seed, seed, times, tol)
    descent = full_model_gradient_descent(task, initial_parameters(base_seed, seed, task.token_dim), lr, steps)
    return flow, float(np.linalg.norm(descent - flow, axis=1).max())


def full_model_gaps(runs: pd.DataFrame, task, base_seed: int, tol: dict, lr: float) -> pd.DataFrame:
    """One row per (model, L, seed): the sup-distance of the shared-stream run to its flow, and the floors."""
    rows, flows = [], {}
    for (model, L, seed), g in runs.groupby(KEYS):
        shared = g[g["stream"] == 0].sort_values("step")
        key = (seed, tuple(shared["step"]))
        if key not in flows:
            flows[key] = flow_and_euler_floor(task, base_seed, int(seed), shared, lr, tol)
        flow, euler = flows[key]
        gap = np.linalg.norm(weights(shared) - flow, axis=1).max()
        other = g[g["stream"] > 0].sort_values("step")
        floor = np.nan
        if len(other) == len(shared):
            floor = np.linalg.norm(weights(shared) - weights(other), axis=1).max()
        rows.append({"experiment": "full_model", "model": model, "prompt_length": int(L), "seed": int(seed),
                     "sup_distance": float(gap), "own_noise_floor": float(floor), "euler_floor": euler,
                     "status": "diverged" if (g["status"] == "diverged").any() else "ok"})
    gaps = pd.DataFrame(rows)
    if gaps.empty:
        return gaps.assign(noise_floor=[], floor=[])
    shared_floor = gaps.groupby(["model", "prompt_length"])["own_noise_floor"].transform("mean")
    gaps["noise_floor"] = gaps["own_noise_floor"].fillna(shared_floor)
    gaps["floor"] = gaps[["noise_floor", "euler_floor"]].max(axis=1, skipna=False)
    return gaps


def reduced_gaps(reduced: pd.DataFrame) -> pd.DataFrame:
    """The reduced model's sup-distance per (L, seed) (its whole run is the horizon); floor not measured."""
    reduced = reduced[reduced["prompt_length"] > 0]
    rows = [{"experiment": "reduced_model", "model": "softmax", "prompt_length": int(L), "seed": int(s),
             "sup_distance": float(g["distance_to_flow"].max()), "own_noise_floor": np.nan, "euler_floor": np.nan,
             "noise_floor": np.nan, "floor": np.nan, "status": "ok"}
            for (L, s), g in reduced.groupby(["prompt_length", "seed"])]
    return pd.DataFrame(rows)


def slopes(gaps: pd.DataFrame, floor_factor: float) -> pd.DataFrame:
    """log-log slope of sup_distance against L per (experiment, model), over points above floor_factor × floor
    (the larger of the SGD-noise and Euler floors)."""
    rows = []
    for (experiment, model), g in gaps[gaps["status"] == "ok"].groupby(["experiment", "model"]):
        above = g[~(g["sup_distance"] <= floor_factor * g["floor"])]  # NaN floor: not measured, kept
        row = {"experiment": experiment, "model": model, "n_points_above_floor": len(above),
               "n_points": len(g), "floor_factor": floor_factor,
               "fit_min_prompt_length": above["prompt_length"].min() if len(above) else np.nan,
               "fit_max_prompt_length": above["prompt_length"].max() if len(above) else np.nan}
        if above["prompt_length"].nunique() >= 2:
            row.update(loglog_slope_by_group(above["prompt_length"], above["sup_distance"], above["seed"]))
            row.update(fit_line_ends(row))
        rows.append(row)
        print(f"{experiment} {model}: {row.get('slope', np.nan):.3f} [{row.get('slope_lo', np.nan):.3f}, "
              f"{row.get('slope_hi', np.nan):.3f}] over {len(above)}/{len(g)} points above {floor_factor}× floor")
    return pd.DataFrame(rows)


def fit_line_ends(fit: dict) -> dict:
    """Ends of the fitted line (mean intercept over seeds) and of a slope −1 reference line through the fit's
    geometric midpoint, at half its height, over the fitted L range: what the figure draws."""
    lo, hi = float(fit["fit_min_prompt_length"]), float(fit["fit_max_prompt_length"])
    line = lambda L: float(np.exp(fit["intercept"]) * L ** fit["slope"])  # noqa: E731
    mid = np.sqrt(lo * hi)
    return {"fit_gap_at_min": line(lo), "fit_gap_at_max": line(hi),
            "reference_gap_at_min": 0.5 * line(mid) * mid / lo, "reference_gap_at_max": 0.5 * line(mid) * mid / hi}


def trajectory_gap(inputs, outputs, params, rule="trajectory_gap"):
    """Write results/<run>/infinite/trajectory_gaps.parquet (one row per run) and trajectory_slopes.parquet."""
    task = regression_task(params["icl"])
    tol = {k: params["infinite"][k] for k in ("rtol", "atol")}
    runs = pd.concat([read_parquet(p) for p in inputs["trajectories"]], ignore_index=True)
    lr = float(params["transfer"]["lr"])
    gaps = pd.concat([full_model_gaps(runs, task, int(params["seed"]), tol, lr), reduced_gaps(read_parquet(inputs["reduced"]))],
                     ignore_index=True)
    gaps["transfer_lr"] = lr
    gaps["stability_limit"] = 2.0 / gaps["transfer_lr"]  # the sharpness above which the transfer runs' SGD is unstable
    prov = provenance(rule, params, base_seed=params["seed"], run_seeds=sorted(gaps["seed"].unique()))
    write_parquet(gaps, outputs["gaps"], prov)
    write_parquet(slopes(gaps, float(params["transfer"]["floor_factor"])), outputs["slopes"], prov)
