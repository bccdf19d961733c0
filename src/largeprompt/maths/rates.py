"""Convergence rates of Monte Carlo errors in L, with bootstrap uncertainty (docs/theory.md#random-query-rate,
docs/experiments.md#output_concentration).

Errors arrive as a matrix ``errors [R, P]``: R independent repetitions (query + prompt), each seen
at P nested prompt lengths. A *statistic* (mean or median over repetitions) is taken at every L and
its decay exponent p (statistic ∝ L^{−p}) is fitted by least squares on log–log. Uncertainty comes
from a bootstrap that resamples whole repetitions, so the correlation across L of one nested
prompt is kept.
"""
from __future__ import annotations

import numpy as np
from scipy import stats

from largeprompt.maths.large_tilt import asymptotic_mean_exponent

STATISTICS = ("mean", "median")
QUANTILES = {"median": 0.5, "q90": 0.9}  # the order statistics among the statistics (q90: display only)


def predicted_exponent(c, measure: str = "gaussian") -> np.ndarray:
    """p(c): the decay exponent of E‖T_L − T_∞‖² over random queries, 1 for c ≤ 1/2 and (√(1 + 4/c) − 1)/2 above
    for Gaussian tokens, 1 for bounded ones (:func:`largeprompt.maths.large_tilt.asymptotic_mean_exponent`,
    docs/theory.md#random-query-rate)."""
    return asymptotic_mean_exponent(c, measure)


def paper_form_exponent(c2: float, sigma_sq) -> np.ndarray:
    """The L-exponent c₂/σ² of the paper's bound form c₁ ln L / L^{c₂/σ²} (paper Prop. 3.1, docs/theory.md#random-query-rate)."""
    return c2 / np.asarray(sigma_sq, dtype=np.float64)


def upper_half(prompt_lengths) -> np.ndarray:
    """Boolean mask of the upper half of the L grid (index ≥ P // 2), where exponents are fitted."""
    n = len(prompt_lengths)
    return np.arange(n) >= n // 2


def statistic(errors: np.ndarray, name: str) -> np.ndarray:
    """Mean, median or 90% quantile (q90, display only) over the repetition axis −2: errors [..., R, P] → [..., P]."""
    if name == "mean":
        return errors.mean(axis=-2)
    if name == "median":
        return np.median(errors, axis=-2)
    if name in QUANTILES:
        return np.quantile(errors, QUANTILES[name], axis=-2)
    raise ValueError(f"unknown statistic {name!r}; allowed {STATISTICS}")


def loglog_exponent(prompt_lengths, values: np.ndarray) -> np.ndarray:
    """−slope of the least-squares line of log values [..., P] against log L [P] → [...]."""
    x = np.log(np.asarray(prompt_lengths, dtype=np.float64))
    x = x - x.mean()
    y = np.log(values)
    return -((y - y.mean(axis=-1, keepdims=True)) @ x) / (x @ x)


def local_exponents(prompt_lengths, values: np.ndarray) -> np.ndarray:
    """−d log(values)/d log L at every L [..., P] (central differences, one-sided at the ends)."""
    x = np.log(np.asarray(prompt_lengths, dtype=np.float64))
    return -np.gradient(np.log(values), x, axis=-1)


def bootstrap_indices(n_reps: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """[n_boot, n_reps] repetition indices drawn with replacement."""
    return rng.integers(0, n_reps, size=(n_boot, n_reps))


def bootstrap_statistics(errors: np.ndarray, names, indices: np.ndarray, block: int = 64) -> dict[str, np.ndarray]:
    """Every statistic in ``names`` of every bootstrap resample: errors [R, P], indices [B, R] → {name: [B, P]}.

    A resample is held as its counts of each repetition, never materialised: its mean is counts @ errors / R,
    and its k-th smallest value in column j is the sorted value at which the running sum of the counts, in
    that column's sorted order, first exceeds k (found block by block: sums of blocks of counts first). The
    median and the 90% quantile combine the two order statistics around rank q(R − 1) linearly, numpy's
    default definition ((a + b)/2 for an even median).
    """
    unknown = set(names) - set(QUANTILES) - {"mean"}
    if unknown:
        raise ValueError(f"unknown statistic(s) {sorted(unknown)}; allowed mean, {', '.join(QUANTILES)}")
    n_reps, n_cols = errors.shape
    out = {name: np.empty((indices.shape[0], n_cols)) for name in names}
    order = np.argsort(errors, axis=0, kind="stable")  # [R, P]
    ordered = np.take_along_axis(errors, order, axis=0)  # [R, P]
    ranks = sorted({r for name in names if name in QUANTILES for r in _ranks(QUANTILES[name], n_reps)[:2]})
    width = _COUNT_BLOCK * -(-n_reps // _COUNT_BLOCK)  # R padded with empty repetitions
    order = np.concatenate([order, np.full((width - n_reps, n_cols), n_reps)])  # padding points at a zero count
    for start in range(0, indices.shape[0], block):
        rows = indices[start : start + block]  # [b, R]
        offsets = (rows + (n_reps + 1) * np.arange(rows.shape[0])[:, None]).ravel()
        counts = np.bincount(offsets, minlength=rows.shape[0] * (n_reps + 1)).reshape(len(rows), n_reps + 1)
        if "mean" in names:
            out["mean"][start : start + len(rows)] = counts[:, :n_reps].astype(np.float64) @ errors / n_reps
        values = {r: np.empty((len(rows), n_cols)) for r in ranks}
        for j in range(n_cols if ranks else 0):
            positions = _order_positions(np.take(counts, order[:, j], axis=1), ranks)
            for r in ranks:
                values[r][:, j] = ordered[positions[r], j]
        for name in set(names) & set(QUANTILES):
            lo, hi, t = _ranks(QUANTILES[name], n_reps)
            out[name][start : start + len(rows)] = _combine(values[lo], values[hi], t, name)
    return out


_COUNT_BLOCK = 128


def _order_positions(sorted_counts: np.ndarray, ranks) -> dict[int, np.ndarray]:
    """For counts [b, W] in sorted order (W a multiple of the block), the position holding each 0-based rank."""
    b, width = sorted_counts.shape
    blocks = sorted_counts.reshape(b, width // _COUNT_BLOCK, _COUNT_BLOCK)
    ends = np.cumsum(blocks.sum(axis=-1), axis=1)  # running count at each block's end [b, nB]
    rows, out = np.arange(b), {}
    for r in ranks:
        k = (ends <= r).sum(axis=1)  # the block holding rank r
        before = np.where(k > 0, ends[rows, np.maximum(k - 1, 0)], 0)
        inside = np.cumsum(blocks[rows, k], axis=1) + before[:, None]  # [b, block]
        out[r] = k * _COUNT_BLOCK + (inside <= r).sum(axis=1)
    return out


def _ranks(q: float, n: int) -> tuple[int, int, float]:
    """The 0-based ranks around the q-quantile's virtual index q(n − 1) and the weight of the upper one."""
    h = q * (n - 1)
    lo = int(np.floor(h))
    return lo, min(lo + 1, n - 1), h - lo


def _combine(low: np.ndarray, high: np.ndarray, t: float, name: str) -> np.ndarray:
    """numpy's arithmetic: the median's mean of the middle pair, else its lerp (from the nearer end)."""
    if name == "median" and t == 0.5:
        return (low + high) / 2
    return high - (high - low) * (1 - t) if t >= 0.5 else low + (high - low) * t


def percentile_ci(samples: np.ndarray, level: float = 0.95, axis: int = 0):
    """(low, high) percentile interval of bootstrap samples."""
    tail = 50.0 * (1.0 - level)
    return np.percentile(samples, tail, axis=axis), np.percentile(samples, 100.0 - tail, axis=axis)


def paper_form_design(prompt_lengths, sigma_sq):
    """Design for log E = log c₁ + log ln L − (c₂/σ²) log L, linear in (log c₁, c₂) (paper Prop. 3.1 form).

    prompt_lengths [N], sigma_sq [N] (one entry per fitted (σ², L) cell) → (X [N, 2], offset [N]).
    """
    log_l = np.log(np.asarray(prompt_lengths, dtype=np.float64))
    x = np.stack([np.ones_like(log_l), -log_l / np.asarray(sigma_sq, dtype=np.float64)], axis=-1)
    return x, np.log(log_l)


def fit_paper_form(prompt_lengths, sigma_sq, values: np.ndarray) -> np.ndarray:
    """Least squares of log values [..., N] on the paper's bound form c₁ ln L / L^{c₂/σ²} → [..., 2] = (c₁, c₂).

    Fitted jointly across σ²: one c₁ and one c₂ for all cells.
    """
    x, offset = paper_form_design(prompt_lengths, sigma_sq)
    y = np.log(values) - offset  # [..., N]
    coef = np.linalg.lstsq(x, y.reshape(-1, y.shape[-1]).T, rcond=None)[0].T  # [M, 2]
    coef = coef.reshape(*y.shape[:-1], 2)
    return np.stack([np.exp(coef[..., 0]), coef[..., 1]], axis=-1)


def t_interval(values, level: float = 0.95):
    """Mean and Student-t interval over independent seeds (NaN bounds for a single seed)."""
    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean()) if len(values) else float("nan")
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return mean, mean - half, mean + half


def loglog_slope(lengths, gaps, level: float = 0.95) -> dict:
    """OLS fit log gap = a + slope·log L with a t-interval on the slope (points are independent runs)."""
    x, y = np.log(np.asarray(lengths, float)), np.log(np.asarray(gaps, float))
    fit = stats.linregress(x, y)
    q = stats.t.ppf(0.5 + level / 2, len(x) - 2) if len(x) > 2 else np.nan
    return {"slope": fit.slope, "slope_lo": fit.slope - q * fit.stderr, "slope_hi": fit.slope + q * fit.stderr,
            "intercept": fit.intercept, "n_points": len(x)}


def order_statistic_ci(sorted_values: np.ndarray, prob: float, level: float):
    """Distribution-free CI of the prob-quantile from order statistics (binomial ranks)."""
    n = len(sorted_values)
    lo_rank = int(stats.binom.ppf(0.5 * (1 - level), n, prob))
    hi_rank = int(stats.binom.ppf(1 - 0.5 * (1 - level), n, prob))
    return sorted_values[max(lo_rank - 1, 0)], sorted_values[min(hi_rank, n - 1)]


def loglog_slope_by_group(lengths, gaps, groups, level: float = 0.95) -> dict:
    """OLS fit log gap = a_g + slope·log L with one intercept per group (seed) and a common slope, with a
    t-interval on the slope (n − #groups − 1 degrees of freedom); NaN bounds without spare degrees of freedom."""
    x = np.log(np.asarray(lengths, float))
    y = np.log(np.asarray(gaps, float))
    labels, index = np.unique(np.asarray(groups), return_inverse=True)
    design = np.column_stack([x, np.eye(len(labels))[index]])  # [n, 1 + G]
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    dof = len(x) - design.shape[1]
    if dof <= 0 or np.linalg.matrix_rank(design) < design.shape[1]:
        return {"slope": float(coef[0]), "slope_lo": np.nan, "slope_hi": np.nan, "intercept": float(coef[1:].mean()),
                "n_fitted": len(x), "n_groups": len(labels)}
    resid = y - design @ coef
    cov = resid @ resid / dof * np.linalg.inv(design.T @ design)
    half = stats.t.ppf(0.5 + level / 2, dof) * np.sqrt(cov[0, 0])
    return {"slope": float(coef[0]), "slope_lo": float(coef[0] - half), "slope_hi": float(coef[0] + half),
            "intercept": float(coef[1:].mean()), "n_fitted": len(x), "n_groups": len(labels)}
