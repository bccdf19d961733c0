"""The rate tables of the random-query sweep, each with a bootstrap CI over whole repetitions
(docs/experiments.md#output_concentration, docs/theory.md#random-query-rate). One kind of row per table,
keyed by ``measure``, ``metric`` (output | grad_U | grad_V), ``c`` and, where it applies, ``statistic``
(mean | median | q90) and ``prompt_length``:

* ``exponents``: p̂ with statistic ∝ L^{−p}, least squares on log–log over the upper half of the L grid;
  ``predicted`` the asymptotic exponent p(c) for the Gaussian mean, 1 for medians and bounded tokens, and
  ``predicted_finite_range`` (with ``_se``) the large-tilt model's exponent over the same L (Gaussian mean output,
  c > 1/2; docs/theory.md#random-query-rate).
* ``local_exponents``: −d log(statistic)/d log L at each L.
* ``error_statistics``: the mean / median / 90% quantile of the squared error at each L.
* ``rate_guides``: the statistic at the first fitted L, L₀, carried along the predicted rate,
  statistic(L₀)·(L/L₀)^{−predicted}, on the fitted L (the dashed guides of the figures).
* ``leading_coefficients``: L·E err² = A + B·L^{−q} fitted over the upper half of the L grid, Â with its bootstrap
  standard error against the closed form A(c) (docs/experiments.md#claims), only where A(c) is finite and the
  correction exponent q(c) ≥ 1/2 (the leading term is then resolved from its correction), and, for Gaussian
  tokens, c < 1/4 (a repetition's L·err² then has finite variance, so the bootstrap is sound).
* ``asymptotic_constants`` (Gaussian, output): L·E‖T_L − T_∞‖² at the largest L against E_q tr C
  (docs/theory.md#fixed-query-fluctuations), NaN where that average is infinite (c ≥ 1/2).
* ``paper_form_fits`` (one per metric): c₁ ln L / L^{c₂/σ²} fitted jointly over the Gaussian cells with
  c ≥ paper_form_min_c; predicted c₂ = 1/2 (paper Prop. 3.1 form).
* ``exponent_curves``: exponent against c on a geometric grid of ``CURVE_POINTS`` values: ``predicted``
  p(c) (1 for bounded tokens) per measure, and ``paper_form`` ĉ₂/c per metric with the CI of ĉ₂.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from largeprompt.core.seeding import stream_seed
from largeprompt.maths.fluctuations import random_query_mean_trace_c
from largeprompt.maths.large_tilt import correction_exponent, finite_range_exponent
from largeprompt.maths.leading_constants import leading_coefficient
from largeprompt.maths.leading_terms import coefficient_with_bootstrap
from largeprompt.maths.rates import (
    STATISTICS,
    bootstrap_indices,
    bootstrap_statistics,
    fit_paper_form,
    local_exponents,
    loglog_exponent,
    paper_form_exponent,
    percentile_ci,
    predicted_exponent,
    statistic,
    upper_half,
)

ERROR_METRICS = {"output": "output_sq_error", "grad_U": "grad_U_sq_error", "grad_V": "grad_V_sq_error"}
CURVE_POINTS = 200  # c values of the exponent curves
TABLES = ("exponents", "local_exponents", "error_statistics", "rate_guides", "leading_coefficients", "asymptotic_constants",
          "paper_form_fits", "exponent_curves")
MIN_CORRECTION_EXPONENT = 0.5  # below it the correction B·L^−q cannot be told from the constant A over the L grid
# Gaussian tokens: a repetition's L·err² has finite variance only while E e^{2c‖g‖²} < ∞, i.e. c < 1/4; from there on
# its mean over repetitions is carried by rare queries and a bootstrap interval of it is not to be trusted.
GAUSSIAN_MAX_C = 0.25


def _error_matrix(cell: pd.DataFrame, column: str):
    """[R, P] errors and the sorted L grid of one (measure, c) cell."""
    wide = cell.pivot(index="repetition", columns="prompt_length", values=column).sort_index(axis=1)
    return wide.to_numpy(), wide.columns.to_numpy()


def _per_length(lengths, estimate, low, high, key: dict, **extra) -> list[dict]:
    return [dict(key, prompt_length=int(L), estimate=float(estimate[j]), ci_low=float(low[j]), ci_high=float(high[j]),
                 **extra) for j, L in enumerate(lengths)]


def finite_range_prediction(key: dict, fitted_lengths, dim: int) -> dict:
    """The large-tilt model's exponent of the mean output error over the fitted L, with its Monte Carlo error
    (:func:`largeprompt.maths.large_tilt.finite_range_exponent`): Gaussian tokens, c > 1/2, statistic mean; NaN
    elsewhere."""
    if not (key["token_measure"] == "gaussian" and key["metric"] == "output" and key["statistic"] == "mean"
            and key["c"] > 0.5):
        return {"predicted_finite_range": np.nan, "predicted_finite_range_se": np.nan}
    exponent, se = finite_range_exponent(key["c"], dim, fitted_lengths, return_stderr=True)
    return {"predicted_finite_range": exponent, "predicted_finite_range_se": se}


def statistic_rows(tables: dict, errors, lengths, boot, stat: str, level: float, key: dict, dim: int) -> None:
    """Exponent, local exponents, the statistic at each L and its rate guide, for one statistic of one cell
    (``boot`` [B, P]: the statistic of each bootstrap resample)."""
    fit = upper_half(lengths)
    point = statistic(errors, stat)  # [P]
    predicted = float(predicted_exponent(key["c"], key["token_measure"])) if stat == "mean" else 1.0
    lo, hi = percentile_ci(loglog_exponent(lengths[fit], boot[:, fit]), level)
    key = dict(key, statistic=stat)
    tables["exponents"].append(dict(key, estimate=float(loglog_exponent(lengths[fit], point[fit])), ci_low=float(lo),
                                    ci_high=float(hi), predicted=predicted, fit_min_prompt_length=int(lengths[fit].min()),
                                    fit_max_prompt_length=int(lengths[fit].max()), n_repetitions=errors.shape[0],
                                    **finite_range_prediction(key, lengths[fit], dim)))
    llo, lhi = percentile_ci(local_exponents(lengths, boot), level)
    tables["local_exponents"] += _per_length(lengths, local_exponents(lengths, point), llo, lhi, key, predicted=predicted)
    qlo, qhi = percentile_ci(boot, level)
    tables["error_statistics"] += _per_length(lengths, point, qlo, qhi, key, n_repetitions=errors.shape[0])
    guide = point[fit][0] * (lengths[fit] / lengths[fit][0]) ** (-predicted)  # [P']
    tables["rate_guides"] += [dict(key, prompt_length=int(L), guide=float(g), predicted=predicted)
                              for L, g in zip(lengths[fit], guide)]


def quantile_rows(tables: dict, errors, lengths, boot, level: float, key: dict) -> None:
    """The 90% quantile of the squared error at each L with its bootstrap CI (``boot`` [B, P])."""
    lo, hi = percentile_ci(boot, level)
    tables["error_statistics"] += _per_length(lengths, statistic(errors, "q90"), lo, hi, dict(key, statistic="q90"),
                                              n_repetitions=errors.shape[0])


def constant_row(errors, lengths, idx, sigma_sq: float, dim: int, level: float, key: dict) -> dict:
    """L·E‖T_L − T_∞‖² at the largest L against its delta-method value E_q tr C."""
    scaled = lengths[-1] * errors[:, -1]
    lo, hi = percentile_ci(scaled[idx].mean(axis=1), level)
    return dict(key, prompt_length=int(lengths[-1]), estimate=float(scaled.mean()), ci_low=float(lo), ci_high=float(hi),
                predicted=float(random_query_mean_trace_c(key["c"], sigma_sq, dim)), n_repetitions=errors.shape[0])


def coefficient_row(errors, lengths, boot_means, dim: int, key: dict) -> dict | None:
    """Â of L·E err² = A + B·L^{−q} over the upper half of the L grid against the closed form A(c)
    (:func:`largeprompt.maths.leading_constants.leading_coefficient`); None outside the theory's regime."""
    predicted = leading_coefficient(key["token_measure"], key["metric"], key["c"], dim)
    q = float(correction_exponent(key["c"], key["token_measure"]))
    finite_variance = key["token_measure"] != "gaussian" or key["c"] < GAUSSIAN_MAX_C
    if not np.isfinite(predicted) or q < MIN_CORRECTION_EXPONENT or not finite_variance:
        return None
    fit = upper_half(lengths)
    result = coefficient_with_bootstrap(lengths[fit], errors[:, fit], boot_means[:, fit], q)
    return dict(key, **result, predicted=float(predicted), correction_exponent=q,
                fit_min_prompt_length=int(lengths[fit].min()), fit_max_prompt_length=int(lengths[fit].max()),
                n_repetitions=errors.shape[0])


def exponent_grid(c_values) -> np.ndarray:
    """The c grid of the exponent curves: ``CURVE_POINTS`` geometric values over [0.8 min c, 1.25 max c]."""
    return np.geomspace(min(c_values) * 0.8, max(c_values) * 1.25, CURVE_POINTS)


def predicted_curve_rows(measure: str, grid) -> list[dict]:
    """The predicted exponent p(c) (1 for bounded tokens) at every c of ``grid``."""
    return [dict(curve="predicted", token_measure=measure, metric=None, c=float(c), exponent=float(p), ci_low=np.nan,
                 ci_high=np.nan, predicted=float(p)) for c, p in zip(grid, predicted_exponent(grid, measure))]


def paper_form_rows(metric: str, group: list, level: float, grid) -> tuple[dict, list[dict]]:
    """Joint fit of c₁ ln L / L^{c₂/σ²} over the Gaussian cells of ``group`` with its bootstrap CI, and its
    exponent curve ĉ₂/c on ``grid`` from 0.9× the smallest fitted c.

    ``group`` holds (c, σ², fitted L [P'], errors [R, P'], bootstrap means [B, P']) per c; every c was
    resampled with the same indices, since the cells of a measure share their repetitions' draws (common random
    numbers): the CI accounts for their correlation. The heuristic rate predicts c₂ = 1/2.
    """
    ls = np.concatenate([g[2] for g in group])  # [N]
    s2 = np.concatenate([np.full(len(g[2]), g[1]) for g in group])  # [N]
    point = np.concatenate([g[3].mean(0) for g in group])  # [N]
    boot = np.concatenate([g[4] for g in group], axis=1)  # [B, N]
    est, boot_fit = fit_paper_form(ls, s2, point), fit_paper_form(ls, s2, boot)  # [2], [B, 2]
    fit = dict(metric=metric, token_measure="gaussian", min_c=min(g[0] for g in group), fit_min_prompt_length=int(ls.min()),
               fit_max_prompt_length=int(ls.max()), n_repetitions=int(group[0][3].shape[0]), c2_predicted=0.5)
    for k, name in enumerate(("c1", "c2")):
        lo, hi = percentile_ci(boot_fit[:, k], level)
        fit.update({name: float(est[k]), f"{name}_ci_low": float(lo), f"{name}_ci_high": float(hi)})
    sub = grid[grid >= fit["min_c"] * 0.9]
    curves = [paper_form_exponent(fit[key], sub) for key in ("c2", "c2_ci_low", "c2_ci_high", "c2_predicted")]
    rows = [dict(curve="paper_form", token_measure="gaussian", metric=metric, c=float(c), exponent=float(e), ci_low=float(lo),
                 ci_high=float(hi), predicted=float(p)) for c, e, lo, hi, p in zip(sub, *curves)]
    return fit, rows


def in_memory_cells(frame: pd.DataFrame):
    """(cells, load_cell) for :func:`rate_tables` from a merged error table already in memory."""
    groups = dict(list(frame.groupby(["token_measure", "c"], sort=True)))
    return sorted(groups), lambda name, c: groups[(name, c)]


def rate_tables(cells: Iterable[tuple[str, float]], load_cell: Callable[[str, float], pd.DataFrame], cfg,
                seed: int) -> dict[str, pd.DataFrame]:
    """Every table of the module docstring from the (measure, c) ``cells`` of the merged error table, each cell
    read by ``load_cell`` only when its turn comes."""
    tables = {name: [] for name in TABLES}
    paper_cells, c_values = {}, {}
    for name, c in cells:
        cell = load_cell(name, c)
        c, sigma_sq = float(c), float(cell["sigma_sq"].iloc[0])
        c_values.setdefault(name, []).append(c)
        for metric, column in ERROR_METRICS.items():
            errors, lengths = _error_matrix(cell, column)  # [R, P], [P]
            # The same resampled repetitions at every c of a measure: its cells share their draws (common random
            # numbers, docs/theory.md#token-sampler), so the joint paper-form fit must resample them jointly.
            rng = np.random.default_rng(stream_seed(seed, f"concentration/bootstrap/{name}/{metric}"))
            idx = bootstrap_indices(errors.shape[0], cfg.n_bootstrap, rng)  # [B, R]
            key = dict(token_measure=name, metric=metric, c=c)
            boots = bootstrap_statistics(errors, (*STATISTICS, "q90"), idx)  # {statistic: [B, P]}
            for stat in STATISTICS:
                statistic_rows(tables, errors, lengths, boots[stat], stat, cfg.ci_level, key, cfg.dim)
            quantile_rows(tables, errors, lengths, boots["q90"], cfg.ci_level, key)
            coefficient = coefficient_row(errors, lengths, boots["mean"], cfg.dim, key)
            if coefficient is not None:
                tables["leading_coefficients"].append(coefficient)
            if metric == "output" and name == "gaussian":
                tables["asymptotic_constants"].append(constant_row(errors, lengths, idx, sigma_sq, cfg.dim, cfg.ci_level, key))
            if name == "gaussian" and c >= cfg.paper_form_min_c:
                fit = upper_half(lengths)
                paper_cells.setdefault(metric, []).append((c, sigma_sq, lengths[fit], errors[:, fit], boots["mean"][:, fit]))
    for name, values in c_values.items():
        tables["exponent_curves"] += predicted_curve_rows(name, exponent_grid(values))
    for metric, group in paper_cells.items():
        fit, curve = paper_form_rows(metric, group, cfg.ci_level, exponent_grid(c_values["gaussian"]))
        tables["paper_form_fits"].append(fit)
        tables["exponent_curves"] += curve
    return {name: pd.DataFrame(rows) for name, rows in tables.items()}
