"""Leading-term fits of a mean squared error, L·E err² = A + B·L^{−q} (docs/experiments.md#claims,
docs/theory.md#fixed-query-fluctuations): the theory predicts the leading coefficient A in closed form, and the
correction B·L^{−q} (q = 1 for the delta method's O(1/L²) terms; smaller where a heavy query tail carries it,
docs/theory.md#random-query-rate) is part of the fitted model, so that A is tested, not a slope over a finite range.

Errors arrive per repetition at nested prompt lengths (errors [R, P]); the uncertainty of Â is a bootstrap over
whole repetitions, so the correlation across L of one nested prompt is kept.
"""
from __future__ import annotations

import numpy as np

RAY_REGIME_FACTOR = 10.0  # R1: a ray point is fitted only at L ≥ 10·e^{2 log ρ(a)} (docs/experiments.md#claims)


def coefficient_fit(prompt_lengths, means: np.ndarray, correction_exponent: float = 1.0) -> np.ndarray:
    """Least squares of L·means [..., P] on (1, L^{−q}) → [..., 2] = (A, B)."""
    lengths = np.asarray(prompt_lengths, dtype=np.float64)
    design = np.stack([np.ones_like(lengths), lengths ** (-float(correction_exponent))], axis=-1)  # [P, 2]
    y = lengths * np.asarray(means, dtype=np.float64)  # [..., P]
    flat = y.reshape(-1, y.shape[-1]).T  # [P, M]
    coef = np.linalg.lstsq(design, flat, rcond=None)[0].T  # [M, 2]
    return coef.reshape(*y.shape[:-1], 2)


def coefficient_with_bootstrap(prompt_lengths, errors: np.ndarray, boot_means: np.ndarray,
                               correction_exponent: float = 1.0) -> dict:
    """Â and B̂ from the mean over repetitions of errors [R, P], and Â's bootstrap standard error (also of log Â,
    NaN where a resample's Â is not positive) and 95% percentile interval from boot_means [B, P] (the means of
    resampled repetitions)."""
    point = coefficient_fit(prompt_lengths, errors.mean(axis=0), correction_exponent)
    boot = coefficient_fit(prompt_lengths, boot_means, correction_exponent)[:, 0]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    log_se = float(np.log(boot).std(ddof=1)) if np.all(boot > 0) else float("nan")
    return {"estimate": float(point[0]), "correction": float(point[1]), "se": float(boot.std(ddof=1)),
            "log_se": log_se, "ci_low": float(lo), "ci_high": float(hi)}


def in_ray_regime(log_rho: np.ndarray, prompt_length: float) -> np.ndarray:
    """Ray points whose delta-method limit applies from ``prompt_length`` on: L ≥ 10·e^{2 log ρ(a)}. The CLT needs
    the tokens that carry E w² (those tilted by 2a) to be present in the prompt, L ≫ ρ(a)² (docs/theory.md#random-query-rate)."""
    return np.asarray(prompt_length, dtype=np.float64) >= RAY_REGIME_FACTOR * np.exp(2.0 * np.asarray(log_rho))


def ray_coefficient(sq_errors: np.ndarray, prompt_lengths, asymptotic_variance: np.ndarray, log_rho: np.ndarray,
                    min_prompt_length: int, rng: np.random.Generator, n_boot: int = 400) -> dict:
    """R1's leading coefficient along the ray, as a ratio to its closed form: sq_errors [n_prompts, P_L, n_points]
    (nested prompts), the delta-method variance C(t) [n_points] and log ρ(t) [n_points]. The points in the regime at
    the smallest fitted L are pooled, r(L) = mean_t L·E sq(t, L)/C(t), and r(L) = A + B/L is fitted over
    L ≥ ``min_prompt_length``; the theory predicts A = 1."""
    lengths = np.asarray(prompt_lengths)
    fit = lengths >= min_prompt_length
    points = in_ray_regime(log_rho, lengths[fit].min()) & (asymptotic_variance > 0) if fit.sum() >= 2 else []
    if fit.sum() < 2 or not np.any(points):
        return {}
    scaled = sq_errors[:, fit][:, :, points] / asymptotic_variance[points]  # [n_prompts, P', n_points']
    per_prompt = scaled.mean(axis=2)  # [n_prompts, P']
    idx = rng.integers(0, per_prompt.shape[0], size=(n_boot, per_prompt.shape[0]))
    boot = np.stack([per_prompt[i].mean(axis=0) for i in idx])  # [B, P']
    out = coefficient_with_bootstrap(lengths[fit], per_prompt, boot, 1.0)
    return out | {"n_points": int(points.sum()), "n_points_total": int(len(points)),
                  "fit_min_prompt_length": int(lengths[fit].min()), "fit_max_prompt_length": int(lengths[fit].max()),
                  "max_log_rho": float(np.max(np.asarray(log_rho)[points])), "n_prompts": int(per_prompt.shape[0])}


# --- R4: the exponent of a gap that falls like A·L^{−p}(1 + b/L) (+ a floor), one amplitude per seed ---------------

CORRECTION_BOUND = 1.0  # |b| ≤ L_min: the correction changes the gap at most twofold over the fitted range


def _log_model(params, log_l, inv_l, index, n_groups, floor: bool):
    """log(A_g·L^{−p}(1 + b/L) + f) with params (p, b, [f,] log A_1, …, log A_G)."""
    p, b = params[0], params[1]
    f = params[2] if floor else 0.0
    log_a = params[2 + floor:][index]
    return np.log(np.exp(log_a - p * log_l) * (1.0 + b * inv_l) + f)


def exponent_fit(lengths, gaps, groups, correction: bool = True, floor: bool = False) -> dict:
    """log gap = log(A_g·L^{−p}(1 + b/L) + f): one amplitude A_g per group (seed), a common exponent p, a common
    correction b (|b| ≤ L_min; ``correction=False`` fixes b = 0) and, with ``floor``, a common floor f ≥ 0 fitted
    beside them (for gaps whose floors were not measured). Least squares on log gaps."""
    from scipy.optimize import least_squares

    lengths = np.asarray(lengths, dtype=np.float64)
    y = np.log(np.asarray(gaps, dtype=np.float64))
    labels, index = np.unique(np.asarray(groups), return_inverse=True)
    log_l, inv_l, g = np.log(lengths), 1.0 / lengths, len(labels)
    design = np.column_stack([-log_l, np.eye(g)[index]])
    start = np.linalg.lstsq(design, y, rcond=None)[0]  # the pure power law: (p, log A_g)
    bound_b = CORRECTION_BOUND * lengths.min() if correction and len(np.unique(lengths)) >= 3 else 0.0
    x0 = np.concatenate([[start[0], 0.0], [0.05 * np.exp(y.min())] if floor else [], start[1:]])
    lower = np.concatenate([[-np.inf, -0.5 * bound_b], [0.0] if floor else [], np.full(g, -np.inf)])
    upper = np.concatenate([[np.inf, bound_b + 1e-300], [np.inf] if floor else [], np.full(g, np.inf)])
    fit = least_squares(lambda q: _log_model(q, log_l, inv_l, index, g, floor) - y, x0, bounds=(lower, upper),
                        x_scale="jac")
    return {"exponent": float(fit.x[0]), "correction": float(fit.x[1]),
            "floor": float(fit.x[2]) if floor else 0.0, "rss": float(2 * fit.cost)}


def exponent_with_seed_bootstrap(frame, value: str, rng: np.random.Generator, n_boot: int = 400,
                                 correction: bool = True, floor: bool = False) -> dict:
    """:func:`exponent_fit` of ``frame[value]`` over (prompt_length, seed) rows, with a bootstrap over whole seeds
    (a resampled seed keeps all its points, under a new group label) for the exponent's standard error."""
    seeds = np.unique(frame["seed"].to_numpy())
    point = exponent_fit(frame["prompt_length"], frame[value], frame["seed"], correction, floor)
    by_seed = {s: frame[frame["seed"] == s] for s in seeds}
    boot = []
    for _ in range(n_boot if len(seeds) >= 3 else 0):
        draw = rng.choice(seeds, size=len(seeds))
        parts = [by_seed[s].assign(seed=k) for k, s in enumerate(draw)]
        lengths = np.concatenate([p["prompt_length"].to_numpy() for p in parts])
        if len(np.unique(lengths)) < 2:
            continue
        boot.append(exponent_fit(lengths, np.concatenate([p[value].to_numpy() for p in parts]),
                                 np.concatenate([p["seed"].to_numpy() for p in parts]), correction, floor)["exponent"])
    se = float(np.std(boot, ddof=1)) if len(boot) > 1 else float("nan")
    return point | {"se": se, "n_points": int(len(frame)), "n_seeds": int(len(seeds))}
