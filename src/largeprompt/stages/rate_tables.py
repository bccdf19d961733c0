"""The rows of rates.parquet: fitted exponents, local slopes, error statistics, the asymptotic constant
and the paper's bound form, each with a bootstrap CI over whole repetitions
(docs/experiments.md#output_concentration, docs/theory.md#random-query-rate).

Keys: ``quantity``, ``metric`` (output | grad_U | grad_V), ``measure``, ``c``, ``statistic`` (mean | median | q90),
``prompt_length`` (NaN where not per-L). Values: ``estimate``, ``ci_low``/``ci_high`` and the theory value ``predicted``.

* ``exponent``: p̂ with statistic ∝ L^{−p}, least squares on log–log over the upper half of the L grid;
  predicted min(1, 1/(2c)) for the Gaussian mean, 1 for medians and bounded tokens.
* ``local_exponent``: −d log(statistic)/d log L at each L.
* ``error_statistic``: the mean / median / 90% quantile of the squared error at each L (for figures).
* ``asymptotic_constant`` (Gaussian, output): L·E‖T_L − T_∞‖² at the largest L against E_q tr C
  (docs/theory.md#fixed-query-fluctuations), NaN where that average is infinite (c ≥ 1/2).
* ``paper_form_c1``, ``paper_form_c2``: c₁ ln L / L^{c₂/σ²} fitted jointly over the Gaussian cells with
  c ≥ paper_form_min_c (the row's ``c``); predicted c₂ = 1/2 (paper Prop. 3.1 form).

Curves drawn by the figures, computed here so that the plots only draw (docs/experiments.md#output_concentration,
docs/experiments.md#rate_exponent):

* ``predicted_rate_guide`` (mean and median, per L of the fitted range): the statistic at the first fitted L,
  L₀, carried along the predicted rate, estimate = statistic(L₀)·(L/L₀)^{−predicted}.
* ``predicted_exponent_curve`` (per measure, ``metric`` empty): min(1, 1/(2c)) (1 for bounded tokens) on a
  geometric grid of ``CURVE_POINTS`` values of ``c`` from 0.8× the smallest to 1.25× the largest c of the measure.
* ``paper_form_exponent_curve`` (Gaussian, per metric): the exponent ĉ₂/σ² = ĉ₂/c of the paper-form fit on that
  grid from 0.9× the fit's smallest c, with ``ci_low``/``ci_high`` from the CI of ĉ₂ and ``predicted`` = 1/(2c).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from largeprompt.core.seeding import stream_seed
from largeprompt.io.runlog import progress
from largeprompt.maths.fluctuations import random_query_mean_trace_c
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


def _row(**kw):
    base = dict(quantity="", metric="", measure="", c=np.nan, statistic="", prompt_length=np.nan,
                estimate=np.nan, ci_low=np.nan, ci_high=np.nan, predicted=np.nan,
                fit_min_prompt_length=np.nan, fit_max_prompt_length=np.nan, n_repetitions=0)
    base.update(kw)
    return base


def _error_matrix(cell: pd.DataFrame, column: str):
    """[R, P] errors and the sorted L grid of one (measure, c) cell."""
    wide = cell.pivot(index="repetition", columns="prompt_length", values=column).sort_index(axis=1)
    return wide.to_numpy(), wide.columns.to_numpy()


def statistic_rows(errors, lengths, boot, stat: str, level: float, common: dict) -> list[dict]:
    """Exponent, local exponents and the statistic itself at each L, for one statistic of one cell
    (``boot`` [B, P]: the statistic of each bootstrap resample)."""
    fit = upper_half(lengths)
    point = statistic(errors, stat)  # [P]
    predicted = float(predicted_exponent(common["c"], common["measure"])) if stat == "mean" else 1.0
    lo, hi = percentile_ci(loglog_exponent(lengths[fit], boot[:, fit]), level)
    rows = [_row(quantity="exponent", statistic=stat, estimate=loglog_exponent(lengths[fit], point[fit]), ci_low=lo,
                 ci_high=hi, predicted=predicted, fit_min_prompt_length=lengths[fit].min(),
                 fit_max_prompt_length=lengths[fit].max(), **common)]
    local = local_exponents(lengths, point)  # [P]
    llo, lhi = percentile_ci(local_exponents(lengths, boot), level)
    qlo, qhi = percentile_ci(boot, level)
    for j, L in enumerate(lengths):
        rows.append(_row(quantity="local_exponent", statistic=stat, prompt_length=float(L), estimate=local[j],
                         ci_low=llo[j], ci_high=lhi[j], predicted=predicted, **common))
        rows.append(_row(quantity="error_statistic", statistic=stat, prompt_length=float(L), estimate=point[j],
                         ci_low=qlo[j], ci_high=qhi[j], **common))
    return rows + guide_rows(lengths[fit], point[fit], predicted, stat, common)


def guide_rows(fitted_lengths, fitted_point, predicted: float, stat: str, common: dict) -> list[dict]:
    """The predicted rate through the statistic at the first fitted L₀: statistic(L₀)·(L/L₀)^{−p} on the fitted L."""
    guide = fitted_point[0] * (fitted_lengths / fitted_lengths[0]) ** (-predicted)  # [P']
    return [_row(quantity="predicted_rate_guide", statistic=stat, prompt_length=float(L), estimate=float(g),
                 predicted=predicted, fit_min_prompt_length=fitted_lengths.min(), fit_max_prompt_length=fitted_lengths.max(),
                 **common) for L, g in zip(fitted_lengths, guide)]


def exponent_grid(c_values) -> np.ndarray:
    """The c grid of the exponent curves: ``CURVE_POINTS`` geometric values over [0.8 min c, 1.25 max c]."""
    return np.geomspace(min(c_values) * 0.8, max(c_values) * 1.25, CURVE_POINTS)


def predicted_curve_rows(measure: str, grid) -> list[dict]:
    """The predicted exponent min(1, 1/(2c)) (1 for bounded tokens) at every c of ``grid``."""
    values = predicted_exponent(grid, measure)
    return [_row(quantity="predicted_exponent_curve", measure=measure, c=float(c), statistic="mean", estimate=float(p),
                 predicted=float(p)) for c, p in zip(grid, values)]


def quantile_rows(errors, lengths, boot, level: float, common: dict) -> list[dict]:
    """The 90% quantile of the squared error at each L with its bootstrap CI (``boot`` [B, P])."""
    q90 = statistic(errors, "q90")  # [P]
    lo, hi = percentile_ci(boot, level)
    return [_row(quantity="error_statistic", statistic="q90", prompt_length=float(L), estimate=q90[j],
                 ci_low=lo[j], ci_high=hi[j], **common) for j, L in enumerate(lengths)]


def constant_row(errors, lengths, idx, sigma_sq: float, dim: int, level: float, common: dict) -> dict:
    """L·E‖T_L − T_∞‖² at the largest L against its delta-method value E_q tr C."""
    scaled = lengths[-1] * errors[:, -1]
    lo, hi = percentile_ci(scaled[idx].mean(axis=1), level)
    return _row(quantity="asymptotic_constant", statistic="mean", prompt_length=float(lengths[-1]),
                estimate=scaled.mean(), ci_low=lo, ci_high=hi,
                predicted=float(random_query_mean_trace_c(common["c"], sigma_sq, dim)), **common)


def paper_form_rows(metric: str, group: list, level: float, grid) -> list[dict]:
    """Joint fit of c₁ ln L / L^{c₂/σ²} over the Gaussian cells of ``group`` with its bootstrap CI, and its
    exponent curve ĉ₂/c on ``grid`` from 0.9× the smallest fitted c.

    ``group`` holds (c, σ², fitted L [P'], errors [R, P'], bootstrap means [B, P']) per c; each c was
    resampled with its own indices (the cells are independent). The heuristic rate predicts c₂ = 1/2.
    """
    ls = np.concatenate([g[2] for g in group])  # [N]
    s2 = np.concatenate([np.full(len(g[2]), g[1]) for g in group])  # [N]
    point = np.concatenate([g[3].mean(0) for g in group])  # [N]
    boot = np.concatenate([g[4] for g in group], axis=1)  # [B, N]
    est, boot_fit = fit_paper_form(ls, s2, point), fit_paper_form(ls, s2, boot)  # [2], [B, 2]
    rows = []
    for k, pname in enumerate(("c1", "c2")):
        lo, hi = percentile_ci(boot_fit[:, k], level)
        rows.append(_row(quantity=f"paper_form_{pname}", metric=metric, measure="gaussian", statistic="mean",
                         estimate=est[k], ci_low=lo, ci_high=hi, predicted=0.5 if pname == "c2" else np.nan,
                         c=min(g[0] for g in group), fit_min_prompt_length=ls.min(), fit_max_prompt_length=ls.max(),
                         n_repetitions=int(group[0][3].shape[0])))
    c2, sub = rows[-1], grid[grid >= rows[-1]["c"] * 0.9]
    bounds = [paper_form_exponent(c2[key], sub) for key in ("estimate", "ci_low", "ci_high", "predicted")]
    rows += [_row(quantity="paper_form_exponent_curve", metric=metric, measure="gaussian", statistic="mean", c=float(c),
                  estimate=e, ci_low=lo, ci_high=hi, predicted=p, n_repetitions=c2["n_repetitions"])
             for c, e, lo, hi, p in zip(sub, *bounds)]
    return rows


def in_memory_cells(frame: pd.DataFrame):
    """(cells, load_cell) for :func:`rate_rows` from a merged error table already in memory."""
    groups = dict(list(frame.groupby(["measure", "c"], sort=True)))
    return sorted(groups), lambda name, c: groups[(name, c)]


def rate_rows(cells: list[tuple[str, float]], load_cell: Callable[[str, float], pd.DataFrame], cfg,
              seed: int) -> pd.DataFrame:
    """Every row of rates.parquet (module docstring) from the (measure, c) ``cells`` of the merged error
    table, sorted, each read by ``load_cell`` only when its turn comes."""
    rows, paper_cells, c_values = [], {}, {}
    for name, c in progress(cells, desc="rates"):
        cell = load_cell(name, c)
        c, sigma_sq = float(c), float(cell["sigma_sq"].iloc[0])
        c_values.setdefault(name, []).append(c)
        for metric, column in ERROR_METRICS.items():
            errors, lengths = _error_matrix(cell, column)  # [R, P], [P]
            rng = np.random.default_rng(stream_seed(seed, f"bounds/bootstrap/{name}/{metric}", int(round(c * 1e6))))
            idx = bootstrap_indices(errors.shape[0], cfg.n_bootstrap, rng)  # [B, R]
            common = dict(metric=metric, measure=name, c=c, n_repetitions=errors.shape[0])
            boots = bootstrap_statistics(errors, (*STATISTICS, "q90"), idx)  # {statistic: [B, P]}
            for stat in STATISTICS:
                rows += statistic_rows(errors, lengths, boots[stat], stat, cfg.ci_level, common)
            rows += quantile_rows(errors, lengths, boots["q90"], cfg.ci_level, common)
            if metric == "output" and name == "gaussian":
                rows.append(constant_row(errors, lengths, idx, sigma_sq, cfg.dim, cfg.ci_level, common))
            if name == "gaussian" and c >= cfg.paper_form_min_c:
                fit = upper_half(lengths)
                paper_cells.setdefault(metric, []).append((c, sigma_sq, lengths[fit], errors[:, fit], boots["mean"][:, fit]))
    for name, values in c_values.items():
        rows += predicted_curve_rows(name, exponent_grid(values))
    for metric, group in paper_cells.items():
        rows += paper_form_rows(metric, group, cfg.ci_level, exponent_grid(c_values["gaussian"]))
    return pd.DataFrame(rows)
