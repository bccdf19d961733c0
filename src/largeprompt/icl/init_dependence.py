"""How often the R∞ flow from a torch-default init drifts, and what predicts it
(docs/experiments.md#init_dependence, docs/theory.md#drifting-flows): one seed's flow to 2T classified at T and 2T
with the quantities that might predict its class, and the tables the figure draws (class fractions with Wilson
intervals, cross-validated predictors against the majority baseline)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from largeprompt.icl.dynamics import integrate_flow
from largeprompt.icl.flow_class import FLOW_CLASSES, classify_flow
from largeprompt.icl.full_model_risk import FullModelRisk
from largeprompt.maths.classifiers import logistic_cv_accuracy, stump_cv_accuracy, wilson_interval

# What could predict a flow's class, computed from its initial weights (docs/experiments.md#init_dependence).
INIT_FEATURES = ("u_y", "readout_share", "readout_determinant", "full_rank_drive", "rank_one_drive", "route_ratio",
                 "qk_imbalance", "vo_imbalance", "qk_imbalance_min_eigenvalue", "vo_imbalance_yy")
# ... and what can be read off the flow itself before its class is settled.
FLOW_FEATURES = ("escape_time", "route_ratio_half_escape")


def init_features(risk: FullModelRisk, theta0: np.ndarray) -> dict[str, float]:
    """The candidate predictors at init (INIT_FEATURES): the readout u_y and its share of u, det(u_y M_x), the drive
    of each term of C₁ (the first-order decrease of R∞ along u_y M_xᵀΛ and along m_y u_xᵀΛ), their size ratio, and
    the conserved quantities QQᵀ − KKᵀ and VVᵀ − OᵀO of the flow (trace, smallest eigenvalue, y entry)."""
    Q, K, V, O = risk.weights(theta0)
    U, u = risk.attention(theta0)
    d, lam2 = risk.d, risk.lam @ risk.lam
    Mx, my, ux, uy = U[:d, :d], U[d, :d], u[:d], u[d]
    cq, cv = Q @ Q.T - K @ K.T, V @ V.T - O.T @ O
    return {"u_y": float(uy), "readout_share": float(abs(uy) / np.linalg.norm(u)),
            "readout_determinant": float(risk.readout_determinant(theta0)),
            "full_rank_drive": float(uy * (Mx * lam2).sum()), "rank_one_drive": float(ux @ lam2 @ my),
            "route_ratio": float(risk.route_ratio(theta0)), "qk_imbalance": float(np.trace(cq)),
            "vo_imbalance": float(np.trace(cv)), "qk_imbalance_min_eigenvalue": float(np.linalg.eigvalsh(cq)[0]),
            "vo_imbalance_yy": float(cv[d, d])}


def classification_times(horizon: float) -> np.ndarray:
    """A uniform grid over [0, 2T] with steps of at most one time unit, T on the grid."""
    half = max(1, math.ceil(horizon))
    return np.linspace(0.0, 2.0 * horizon, 2 * half + 1)


def decision_time(times, readout_determinant, end: int) -> float:
    """The first grid time from which sign det(u_y M_x) keeps the sign it has at grid index ``end``."""
    sign = np.sign(readout_determinant[: end + 1])
    differs = np.flatnonzero(sign != sign[-1])
    return float(times[differs[-1] + 1]) if len(differs) else float(times[0])


def seed_row(risk: FullModelRisk, theta0: np.ndarray, times: np.ndarray, tol: dict, noise_variance: float) -> dict:
    """One seed's flow to 2T: its class at T and at 2T, its escape, and the quantities that might predict it."""
    thetas = integrate_flow(risk.gradient, risk.solver_hessian, theta0, times, **tol)
    risks, det = risk.value(thetas), risk.readout_determinant(thetas)
    end = (len(times) - 1) // 2  # T
    kind, escape = classify_flow(times[: end + 1], risks[: end + 1], det[: end + 1], noise_variance)
    kind_doubled, _ = classify_flow(times, risks, det, noise_variance)
    row = {"flow_class": kind, "flow_class_doubled_horizon": kind_doubled, "escape_time": escape,
           "decision_time": decision_time(times, det, end) if kind != "plateau" else np.nan,
           "final_infinite_prompt_risk": float(risks[end]), "final_readout_determinant": float(det[end]),
           "weight_norm": float(np.linalg.norm(thetas[end])), "weight_norm_doubled_horizon": float(np.linalg.norm(thetas[-1])),
           "route_ratio_half_escape": np.nan}
    if not math.isnan(escape):
        half = int(np.searchsorted(times, 0.5 * escape))
        row["route_ratio_half_escape"] = float(risk.route_ratio(thetas[half]))
    sharp = risk.sharpness(thetas[[end, -1]])
    row.update(sharpness=float(sharp[0]), sharpness_doubled_horizon=float(sharp[1]))
    row.update({f"init_{k}": v for k, v in init_features(risk, theta0).items()})
    return row


def class_table(flows: pd.DataFrame, level: float) -> pd.DataFrame:
    """One row per flow class: count, fraction and its Wilson interval; how many seeds change class at 2T."""
    n = len(flows)
    rows = []
    for kind in FLOW_CLASSES:
        k = int((flows["flow_class"] == kind).sum())
        lo, hi = wilson_interval(k, n, level)
        rows.append({"flow_class": kind, "n_flows": k, "n_seeds": n, "fraction": k / n, "fraction_lo": lo,
                     "fraction_hi": hi, "n_changed_at_doubled_horizon":
                         int(((flows["flow_class"] == kind) & (flows["flow_class_doubled_horizon"] != kind)).sum())})
    return pd.DataFrame(rows)


def predictor_table(flows: pd.DataFrame, n_folds: int, level: float) -> pd.DataFrame:
    """One row per predictor of drift among the flows that escape: cross-validated accuracy, its Wilson interval and
    the majority baseline; each init quantity alone (one threshold), all of them (logistic), and the flow's own."""
    escaped = flows[flows["flow_class"] != "plateau"]
    y = (escaped["flow_class"] == "drifts").to_numpy()
    n = len(y)
    baseline = max(y.mean(), 1 - y.mean()) if n else np.nan
    scored = [(f, "init", stump_cv_accuracy(escaped[f"init_{f}"], y, n_folds)) for f in INIT_FEATURES]
    scored.append(("all init quantities (logistic)", "init",
                   logistic_cv_accuracy(escaped[[f"init_{f}" for f in INIT_FEATURES]].to_numpy(), y, n_folds)))
    scored += [(f, "flow", stump_cv_accuracy(escaped[f], y, n_folds))
               for f in FLOW_FEATURES]
    rows = []
    for name, kind, correct in scored:
        lo, hi = wilson_interval(correct, n, level)
        rows.append({"predictor": name, "computed": kind, "n_flows": n, "n_correct": correct, "accuracy": correct / n,
                     "accuracy_lo": lo, "accuracy_hi": hi, "majority_baseline": baseline})
    return pd.DataFrame(rows)
