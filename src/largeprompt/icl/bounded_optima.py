"""What the infinite-prompt limit predicts for bounded covariates: the best risk softmax attention can reach at
L = ∞, along the attention scale, per token measure (docs/theory.md#bounded-softmax-optimum).

On the family A = cI, m_y = 0, u = v e_D (the attention reads x only, the value reads y only), the limit output is
ŷ∞ = v Σⱼ βⱼ κ'(c x_{q,j}), so R∞ = dτ² E(vκ'(cx) − x)² + σ² over one coordinate x, and its minimum over v is

    R*(c) = dτ²(1 − ρ(c)²) + σ²,   ρ(c)² = E[xκ'(cx)]² / E[κ'(cx)²],   v*(c) = E[xκ'(cx)] / E[κ'(cx)²].

Gaussian: κ' = id, ρ ≡ 1. Rademacher: κ'(cx) = tanh(c)x on {±1}, ρ ≡ 1, so R*(c) = σ² at every c > 0 with
v* = 1/tanh c: a valley of optima at finite weights, as for Gaussian tokens. Uniform: ρ(c) < 1 for c > 0 and
ρ → 1 only as c → 0 (with v* → ∞), so σ² is an infimum that no finite weight attains.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from largeprompt.icl.bounded_risk import coordinate_cgf_derivatives, coordinate_rule

PROFILE_NODES = 200  # 1-D Gauss-Legendre / Gauss-Hermite nodes of the profile: exact to round-off for c ≤ 10
INFIMUM_ATTAINED = {"gaussian": True, "rademacher": True, "uniform": False}


def scale_profile(measure: str, dim: int, task_variance: float, noise_variance: float, scales) -> pd.DataFrame:
    """One row per attention scale c: ρ(c), the best value scale v*(c) and R*(c) = min_v R∞ (module docstring)."""
    x, w = coordinate_rule(measure, PROFILE_NODES)
    c = np.asarray(scales, dtype=np.float64)[:, None]  # [S, 1]
    g, _ = coordinate_cgf_derivatives(measure, c * x)  # κ'(c x) [S, n]
    cross, power = (w * x * g).sum(-1), (w * g * g).sum(-1)
    rho2 = np.minimum(cross * cross / power, 1.0)
    return pd.DataFrame({"token_measure": measure, "attention_scale": c[:, 0], "value_scale": cross / power,
                         "correlation": np.sqrt(rho2),
                         "profile_risk": dim * task_variance * (1.0 - rho2) + noise_variance})


def valley_point(dim: int, attention_scale: float, value_scale: float) -> np.ndarray:
    """θ (order of :func:`largeprompt.icl.models.flatten`) with U = diag(cI_d, 0) and u = v e_D: Q = √D·U, K = I, V = I,
    O = v e_Dᵀ, so that U = KᵀQ/√D and u = VᵀOᵀ."""
    D = dim + 1
    Q = np.zeros((D, D))
    Q[:dim, :dim] = np.sqrt(D) * attention_scale * np.eye(dim)
    O = np.zeros((1, D))
    O[0, dim] = value_scale
    return np.concatenate([Q.ravel(), np.eye(D).ravel(), np.eye(D).ravel(), O.ravel()])


def softmax_optimum(measure: str, dim: int, task_variance: float, noise_variance: float, scales) -> dict:
    """The L = ∞ softmax optimum or infimum of one measure: σ², whether finite weights attain it, and the profile's
    smallest risk and its scale on the grid ``scales`` (the check: σ² on the whole grid, or only as c → 0)."""
    profile = scale_profile(measure, dim, task_variance, noise_variance, scales)
    best = profile.loc[profile["profile_risk"].idxmin()]
    return {"token_measure": measure, "infimum": float(noise_variance), "attained": INFIMUM_ATTAINED[measure],
            "profile_min_risk": float(best["profile_risk"]), "profile_min_scale": float(best["attention_scale"]),
            "profile_max_risk": float(profile["profile_risk"].max()),
            "profile_max_scale": float(profile["attention_scale"].max())}
