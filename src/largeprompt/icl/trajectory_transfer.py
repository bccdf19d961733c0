"""R4: how far finite-L training strays from the infinite-prompt flow, with the floors below which no prompt
length can push it (docs/experiments.md#trajectory_transfer, docs/theory.md#trajectory-transfer,
docs/theory.md#euler-floor).

For the §6 transfer runs, the flow from each seed's initial weights is integrated at the runs' own logged times,
on the R∞ of the run's model (:func:`largeprompt.icl.bounded_risk.limit_risk`: one closed form for Gaussian
covariates, softmax's quadrature R∞ for bounded ones). Per run, ``sup_distance`` = sup_t ‖θ_L(t) − θ_∞(t)‖. Two parts
of it do not fall with L:

* the SGD noise: ``noise_floor`` at (model, L) is sup_t ‖θ_L(t) − θ'_L(t)‖ between the two batch streams of a
  replicate seed (the same L and init); seeds without a replicate use the mean floor of the replicate seeds at
  that (model, L);
* the Euler error of the step lr: ``euler_floor`` per seed is sup_t ‖θ^GD_∞(t) − θ_∞(t)‖, plain gradient descent
  with the runs' lr on R∞ against the flow.

``floor`` is the larger of the two. The slope over L is a least-squares fit of log sup_distance on log L with one
intercept per seed, over the points whose gap exceeds ``floor_factor`` × their floor. The floors add to the gap
rather than vanish above the cut, so ``corrected_distance`` = sup_distance − noise_floor − euler_floor (a lower
bound of the part that falls with L, docs/theory.md#floor-corrected-gap) is fitted too: ``corrected_slope``.

The verdict reads the coupled design instead (docs/theory.md#coupled-limit, :mod:`largeprompt.icl.coupled_limit`):
``coupled_distance`` = sup_t ‖θ_L(t) − θ^c_∞(t)‖ against SGD on the L = ∞ readout over the same batches, whose only
floor, ``coupled_noise_floor`` (sup_t ‖Δ − Δ'‖/√2 of the two streams' differences Δ of a replicate seed), falls like
L^{−1/2}; ``coupled_corrected_distance`` = coupled_distance − coupled_noise_floor.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from largeprompt.icl.coupled_limit import coupled_differences
from largeprompt.icl.dynamics import full_model_flow, full_model_gradient_descent
from largeprompt.icl.engine.runs import initial_parameters
from largeprompt.maths.rates import loglog_slope_by_group

KEYS = ["model", "prompt_length", "seed"]


def weights(rows: pd.DataFrame) -> np.ndarray:
    """The weights θ [T, P] of trajectory rows (column ``theta``: one list per row, largeprompt.icl.models.flatten order)."""
    return np.stack(rows["theta"].to_list())


def flow_and_euler_floor(task, base_seed: int, seed: int, shared: pd.DataFrame, lr: float, tol: dict, risk=None):
    """(θ_∞ at the run's logged times [T, P], the Euler floor sup_t ‖θ^GD_∞(t) − θ_∞(t)‖ of the step lr) on ``risk``
    (default: the Gaussian closed form)."""
    steps, times = shared["step"].to_numpy(), shared["time"].to_numpy()
    if not np.allclose(times, lr * steps, rtol=1e-9, atol=0.0):
        raise ValueError(f"trajectory gap: seed {seed}'s run is not constant-step SGD at trajectory_transfer.lr = {lr} "
                         "(its time is not lr·step), so its Euler floor is not the one of plain gradient descent")
    init = initial_parameters(base_seed, seed, task.token_dim)
    flow, _ = full_model_flow(task, init, times, **tol, risk=risk)
    descent = full_model_gradient_descent(task, init, lr, steps, risk=risk)
    return flow, float(np.linalg.norm(descent - flow, axis=1).max())


def full_model_gaps(runs: pd.DataFrame, task, base_seed: int, tol: dict, lr: float, risks: dict | None = None) -> pd.DataFrame:
    """One row per (model, L, seed): the sup-distance of the shared-stream run to its flow, and the floors; where the
    runs carry their coupled weights (``coupled_theta``, written by the training job) also the coupled columns
    (module doc).
    ``risks``: model → its R∞ (default: the Gaussian closed form for both)."""
    rows, flows = [], {}
    for (model, L, seed), g in runs.groupby(KEYS):
        shared = g[g["stream"] == 0].sort_values("step")
        risk = (risks or {}).get(model)
        key = (id(risk), seed, tuple(shared["step"]))
        if key not in flows:
            flows[key] = flow_and_euler_floor(task, base_seed, int(seed), shared, lr, tol, risk)
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
        return gaps.assign(noise_floor=[], floor=[], corrected_distance=[])
    shared_floor = gaps.groupby(["model", "prompt_length"])["own_noise_floor"].transform("mean")
    gaps["noise_floor"] = gaps["own_noise_floor"].fillna(shared_floor)
    gaps["floor"] = gaps[["noise_floor", "euler_floor"]].max(axis=1, skipna=False)
    gaps["corrected_distance"] = gaps["sup_distance"] - gaps["noise_floor"] - gaps["euler_floor"]
    if "coupled_theta" not in runs:
        return gaps
    coupled = pd.concat([coupled_gaps(g, int(L)) for L, g in runs.groupby("prompt_length")], ignore_index=True)
    return with_coupled_floor(gaps.merge(coupled, on=KEYS, how="left"))


def coupled_gaps(runs: pd.DataFrame, L: int) -> pd.DataFrame:
    """One row per (model, seed) of the runs at L: ``coupled_distance`` of the shared-stream run and, for a seed with a
    replicate stream, ``own_coupled_noise`` = sup_t ‖Δ₀ − Δ₁‖/√2 (module doc)."""
    diffs = coupled_differences(runs)
    rows = []
    for (model, seed), g in diffs.groupby(["model", "seed"]):
        streams = {j: np.stack(s.sort_values("step")["difference"].to_list()) for j, s in g.groupby("stream")}
        shared = streams.get(0)
        if shared is None:
            continue
        noise = [np.linalg.norm(shared - other, axis=1).max() / np.sqrt(2) for j, other in streams.items()
                 if j > 0 and other.shape == shared.shape]
        rows.append({"model": model, "prompt_length": L, "seed": int(seed),
                     "coupled_distance": float(np.linalg.norm(shared, axis=1).max()),
                     "own_coupled_noise": float(np.mean(noise)) if noise else np.nan})
    return pd.DataFrame(rows, columns=[*KEYS, "coupled_distance", "own_coupled_noise"])


def with_coupled_floor(gaps: pd.DataFrame, by=("experiment", "model")) -> pd.DataFrame:
    """``coupled_noise_floor``: the run's own where it has a replicate, else the mean of the replicates at its (``by``…,
    L); and ``coupled_corrected_distance`` = coupled_distance − coupled_noise_floor."""
    shared = gaps.groupby([gaps[k] for k in (*by, "prompt_length")])["own_coupled_noise"].transform("mean")
    gaps["coupled_noise_floor"] = gaps["own_coupled_noise"].fillna(shared)
    gaps["coupled_corrected_distance"] = gaps["coupled_distance"] - gaps["coupled_noise_floor"]
    return gaps


def with_floor_threshold(gaps: pd.DataFrame, floor_factor: float, by=("experiment", "model")) -> pd.DataFrame:
    """``gaps`` with ``floor_threshold``: floor_factor × the median floor of the ok runs at its (``by``…, L), the level
    the figures draw beside the points (the fit's cut, :func:`slopes`, is per point)."""
    groups = [gaps[k] for k in (*by, "prompt_length")]
    median = gaps["floor"].where(gaps["status"] == "ok").groupby(groups).transform("median")
    gaps = gaps.assign(floor_threshold=floor_factor * median)
    if "coupled_noise_floor" in gaps:
        coupled = gaps["coupled_noise_floor"].where(gaps["status"] == "ok").groupby(groups).transform("median")
        gaps["coupled_floor_threshold"] = floor_factor * coupled
    return gaps


def reduced_gaps(reduced: pd.DataFrame) -> pd.DataFrame:
    """The reduced model's sup-distance per (L, seed) to its flow and, where the table has ``coupled_difference``, to its
    coupled L = ∞ run. Its seeds differ only by their batch stream (one start), so at each L the spread of their
    trajectories about the seeds' mean, sup_t ‖θ_s − θ̄‖·√(S/(S − 1)) averaged over s, is the SGD-noise floor, and
    the same of their coupled differences the coupled one; no Euler floor is measured (it cancels in the coupled
    difference)."""
    reduced = reduced[reduced["prompt_length"] > 0]
    rows = []
    for L, at_L in reduced.groupby("prompt_length"):
        runs = {int(s): g.sort_values("step") for s, g in at_L.groupby("seed")}
        noise = _spread({s: np.stack(g["theta"].to_list()) for s, g in runs.items()})
        coupled = "coupled_difference" in at_L and at_L["coupled_difference"].notna().all()
        diffs = {s: np.stack(g["coupled_difference"].to_list()) for s, g in runs.items()} if coupled else {}
        coupled_noise = _spread(diffs)
        for s, g in runs.items():
            rows.append({"experiment": "reduced_model", "model": "softmax", "prompt_length": int(L), "seed": s,
                         "sup_distance": float(g["distance_to_flow"].max()), "own_noise_floor": noise,
                         "euler_floor": np.nan, "noise_floor": noise, "floor": noise,
                         "corrected_distance": float(g["distance_to_flow"].max()) - noise, "status": "ok",
                         "coupled_distance": float(np.linalg.norm(diffs[s], axis=1).max()) if coupled else np.nan,
                         "own_coupled_noise": coupled_noise})
    return with_coupled_floor(pd.DataFrame(rows)) if rows else pd.DataFrame(rows)


def _spread(trajectories: dict) -> float:
    """The mean over runs s of sup_t ‖x_s(t) − x̄(t)‖·√(S/(S − 1)), x̄ the runs' mean (NaN for fewer than two runs):
    one run's distance to its own expectation, for runs that differ only by their noise."""
    if len(trajectories) < 2:
        return np.nan
    stack = np.stack(list(trajectories.values()))  # [S, T, P]
    n = len(stack)
    spread = np.linalg.norm(stack - stack.mean(axis=0), axis=-1).max(axis=1) * np.sqrt(n / (n - 1))
    return float(spread.mean())


def slopes(gaps: pd.DataFrame, floor_factor: float, by=("experiment", "model")) -> pd.DataFrame:
    """log-log slope of sup_distance against L per group ``by``, over points above floor_factor × floor
    (the larger of the SGD-noise and Euler floors)."""
    rows = []
    for names, g in gaps[gaps["status"] == "ok"].groupby(list(by)):
        above = g[~(g["sup_distance"] <= floor_factor * g["floor"])]  # NaN floor: not measured, kept
        row = dict(zip(by, names if isinstance(names, tuple) else (names,)))
        row.update({"n_points_above_floor": len(above), "n_points": len(g), "floor_factor": floor_factor,
                    "fit_min_prompt_length": above["prompt_length"].min() if len(above) else np.nan,
                    "fit_max_prompt_length": above["prompt_length"].max() if len(above) else np.nan})
        if above["prompt_length"].nunique() >= 2:
            row.update(loglog_slope_by_group(above["prompt_length"], above["sup_distance"], above["seed"]))
            row.update(fit_line_ends(row))
        row.update(corrected_fit(above))
        rows.append(row)
        print(f"{' '.join(str(row[k]) for k in by)}: "
              f"{row.get('slope', np.nan):.3f} [{row.get('slope_lo', np.nan):.3f}, {row.get('slope_hi', np.nan):.3f}] "
              f"over {len(above)}/{len(g)} points above {floor_factor}× floor; floor-corrected "
              f"{row['corrected_slope']:.3f} [{row['corrected_slope_lo']:.3f}, {row['corrected_slope_hi']:.3f}]")
    return pd.DataFrame(rows)


def corrected_fit(above: pd.DataFrame) -> dict:
    """The slope of ``corrected_distance`` over the points above the cut where it is positive (module doc):
    ``corrected_slope`` with its interval and ``n_corrected_points``; NaN where fewer than 2 lengths remain."""
    keep = above[above["corrected_distance"] > 0] if "corrected_distance" in above else above.iloc[:0]
    out = {"corrected_slope": np.nan, "corrected_slope_lo": np.nan, "corrected_slope_hi": np.nan,
           "n_corrected_points": len(keep)}
    if keep["prompt_length"].nunique() >= 2:
        fit = loglog_slope_by_group(keep["prompt_length"], keep["corrected_distance"], keep["seed"])
        out.update(corrected_slope=fit["slope"], corrected_slope_lo=fit["slope_lo"], corrected_slope_hi=fit["slope_hi"])
    return out


def fit_line_ends(fit: dict) -> dict:
    """Ends of the fitted line (mean intercept over seeds) and of a slope −1 reference line through the fit's
    geometric midpoint, at half its height, over the fitted L range: what the figure draws."""
    lo, hi = float(fit["fit_min_prompt_length"]), float(fit["fit_max_prompt_length"])
    line = lambda L: float(np.exp(fit["intercept"]) * L ** fit["slope"])  # noqa: E731
    mid = np.sqrt(lo * hi)
    return {"fit_gap_at_min": line(lo), "fit_gap_at_max": line(hi),
            "reference_gap_at_min": 0.5 * line(mid) * mid / lo, "reference_gap_at_max": 0.5 * line(mid) * mid / hi}
