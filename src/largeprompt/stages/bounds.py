"""Stage 4, error-bound estimation: R2/R3 Monte Carlo, rates and fixed-query bounds (SPEC §3.1 stage 4, F2–F5).

* :func:`simulate_errors` (one job per token measure and tilt strength c): each repetition draws a
  query z_q ~ N(0, I_D) and one prompt of length L_max, streamed in chunks; every L of the grid is a
  prefix of that prompt. It records ‖T_L − T_∞‖² and the squared Jacobian errors of ∇_U, ∇_V
  (metric in :mod:`largeprompt.gradients`).
* :func:`collect_errors` gathers the jobs into output_errors.parquet and gradient_errors.parquet.
* :func:`estimate_rates` fits exponents, local slopes, the F2 constant and the paper's bound form.
* :func:`simulate_fixed_query_bounds` compares empirical quantiles with F2 and the THEORY §D bound.

Scales (SPEC F4): Gaussian tokens N(0, σ² I) with σ² = c and U = I (the paper varies the token
scale σ at fixed U); Rademacher / uniform tokens have unit variance, so U = √c I. V = I_D throughout.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from scipy import stats

from ..attention import streaming_tilted_moments
from ..fluctuations import (
    gaussian_asymptotic_covariance,
    gaussian_bound_terms,
    gaussian_norm_quantiles,
    random_query_mean_trace_c,
    sharp_bound,
    simple_bound,
)
from ..gradients import jacobian_sq_errors
from ..measures import make_measure, toeplitz_covariance
from ..parquet_io import read_parquet, write_parquet
from ..provenance import provenance
from ..rates import (
    STATISTICS,
    bootstrap_indices,
    bootstrap_statistic,
    fit_paper_form,
    local_exponents,
    loglog_exponent,
    percentile_ci,
    predicted_exponent,
    statistic,
    upper_half,
)
from ..runlog import progress, resolve_device
from ..seeding import stream_generator, stream_seed

DTYPES = {"float64": torch.float64, "float32": torch.float32}
ERROR_METRICS = {"output": "output_sq_error", "grad_U": "grad_U_sq_error", "grad_V": "grad_V_sq_error"}


def prompt_length_grid(log2_min: int, log2_max: int, points_per_octave: int = 1) -> list[int]:
    """Log-spaced integer prompt lengths round(2^{k/points_per_octave}) from 2^log2_min to 2^log2_max."""
    if log2_max - log2_min < 2:
        raise ValueError(
            f"config keys log2_min_prompt_length = {log2_min} and log2_max_prompt_length = {log2_max}: "
            "the L grid needs log2_max_prompt_length ≥ log2_min_prompt_length + 2 to fit a rate"
        )
    steps = np.arange(log2_min * points_per_octave, log2_max * points_per_octave + 1)
    return sorted({int(round(2.0 ** (k / points_per_octave))) for k in steps})


def tilt_scales(measure_name: str, c: float) -> tuple[float, float]:
    """(σ², u) with c = σ² u² (SPEC F4): Gaussian varies σ² = c at u = 1, the others u = √c at σ = 1."""
    if measure_name == "gaussian":
        return float(c), 1.0
    return 1.0, math.sqrt(c)


def sweep_measure(measure_name: str, dim: int, sigma_sq: float, dtype, device):
    """The token measure of the sweep: N(0, σ² I_D), or unit-variance Rademacher / uniform."""
    cov = sigma_sq * torch.eye(dim, dtype=dtype, device=device) if measure_name == "gaussian" else None
    return make_measure(measure_name, dim, cov=cov, dtype=dtype, device=device)


def simulate_errors(inputs, outputs, params, rule="simulate_errors"):
    """One (measure, c) job: rows (L, repetition) with output and gradient squared errors.

    Column ``kappa`` is log ρ(a) = K(2a) − 2K(a) of the repetition's query (= aᵀSa for Gaussian tokens):
    the effective prompt length is L e^{−kappa}.
    """
    dtype, device = DTYPES[params["dtype"]], resolve_device(params.get("device", "cpu"))
    name, c, dim = params["measure"], float(params["c"]), int(params["dim"])
    sigma_sq, u = tilt_scales(name, c)
    measure = sweep_measure(name, dim, sigma_sq, dtype, device)
    lengths = prompt_length_grid(params["log2_min_prompt_length"], params["log2_max_prompt_length"], params["points_per_octave"])
    n_reps, block = int(params["n_repetitions"]), int(params["repetition_block"])
    attention_matrix = u * torch.eye(dim, dtype=dtype, device=device)  # U = u·O with O = I
    value_matrix = torch.eye(dim, dtype=dtype, device=device)  # V = I_D
    cols = {k: [] for k in ("repetition", "kappa", "output", "grad_U", "grad_V")}
    for b, start in enumerate(progress(range(0, n_reps, block), desc=f"errors {name} c={c:g}")):
        r = min(block, n_reps - start)
        q_gen = stream_generator(params["seed"], f"bounds/queries/{name}/c{c:g}", b, device=device)
        p_gen = stream_generator(params["seed"], f"bounds/prompts/{name}/c{c:g}", b, device=device)
        query = torch.randn(r, dim, generator=q_gen, dtype=dtype, device=device)  # z_q, [R, D]
        tilt = query @ attention_matrix.T  # a = U z_q, [R, D]
        mean_l, cov_l = streaming_tilted_moments(
            tilt, measure, lengths[-1], p_gen, chunk_size=params["chunk_size"],
            prefix_lengths=lengths, second_moment=True, prompt_batch_shape=(r,),
        )  # [P, R, D], [P, R, D, D]
        mean_inf, cov_inf = measure.cgf_grad(tilt), measure.cgf_hess(tilt)  # [R, D], [R, D, D]
        gap = (mean_l - mean_inf) @ value_matrix.T  # T_L − T_∞, [P, R, Dout]
        err_u, err_v = jacobian_sq_errors(mean_l, cov_l, mean_inf, cov_inf, query, value_matrix)  # [P, R]
        cols["output"].append((gap * gap).sum(-1).T.cpu().numpy())  # [R, P]
        cols["grad_U"].append(err_u.T.cpu().numpy())
        cols["grad_V"].append(err_v.T.cpu().numpy())
        cols["repetition"].append(np.arange(start, start + r))
        cols["kappa"].append(measure.cgf(2 * tilt).sub(2 * measure.cgf(tilt)).cpu().numpy())  # log E w²/(E w)²
    n_l = len(lengths)
    reps = np.concatenate(cols["repetition"])
    frame = pd.DataFrame(
        {
            "measure": name,
            "c": c,
            "sigma_sq": sigma_sq,
            "u": u,
            "prompt_length": np.tile(np.asarray(lengths, dtype=np.int64), len(reps)),
            "repetition": np.repeat(reps, n_l),
            "kappa": np.repeat(np.concatenate(cols["kappa"]), n_l),
            "output_sq_error": np.concatenate(cols["output"]).ravel(),
            "grad_U_sq_error": np.concatenate(cols["grad_U"]).ravel(),
            "grad_V_sq_error": np.concatenate(cols["grad_V"]).ravel(),
        }
    )
    write_parquet(frame, outputs["result"], provenance(rule, params, seed=params["seed"]))


def collect_errors(inputs, outputs, params, rule="collect_errors"):
    """Concatenate the per-(measure, c) jobs into output_errors.parquet and gradient_errors.parquet."""
    frame = pd.concat([read_parquet(p) for p in inputs["jobs"]], ignore_index=True)
    keys = ["measure", "c", "sigma_sq", "u", "prompt_length", "repetition", "kappa"]
    write_parquet(frame[keys + ["output_sq_error"]], outputs["output_errors"], provenance(rule, params, seed=params["seed"]))
    write_parquet(
        frame[keys + ["grad_U_sq_error", "grad_V_sq_error"]], outputs["gradient_errors"], provenance(rule, params, seed=params["seed"])
    )


def _error_matrix(cell: pd.DataFrame, column: str):
    """[R, P] errors and the sorted L grid of one (measure, c) cell."""
    wide = cell.pivot(index="repetition", columns="prompt_length", values=column).sort_index(axis=1)
    return wide.to_numpy(), wide.columns.to_numpy()


def _row(**kw):
    base = dict(quantity="", metric="", measure="", c=np.nan, statistic="", prompt_length=np.nan,
                estimate=np.nan, ci_low=np.nan, ci_high=np.nan, predicted=np.nan,
                fit_min_prompt_length=np.nan, fit_max_prompt_length=np.nan, n_repetitions=0)
    base.update(kw)
    return base


def _paper_form_rows(metric: str, group: list, level: float) -> list[dict]:
    """Joint fit of c₁ ln L / L^{c₂/σ²} over the Gaussian cells of ``group`` with its bootstrap CI.

    ``group`` holds (c, σ², fitted L [P'], errors [R, P'], bootstrap indices [B, R]) per c; each c is
    resampled with its own indices (the cells are independent). F4 predicts c₂ = 1/2 (exponent 1/(2c), σ² = c).
    """
    ls = np.concatenate([g[2] for g in group])  # [N]
    s2 = np.concatenate([np.full(len(g[2]), g[1]) for g in group])  # [N]
    point = np.concatenate([g[3].mean(0) for g in group])  # [N]
    boot = np.concatenate([bootstrap_statistic(g[3], "mean", g[4]) for g in group], axis=1)  # [B, N]
    est, boot_fit = fit_paper_form(ls, s2, point), fit_paper_form(ls, s2, boot)  # [2], [B, 2]
    rows = []
    for k, pname in enumerate(("c1", "c2")):
        lo, hi = percentile_ci(boot_fit[:, k], level)
        rows.append(_row(quantity=f"paper_form_{pname}", metric=metric, measure="gaussian", statistic="mean",
                         estimate=est[k], ci_low=lo, ci_high=hi, predicted=0.5 if pname == "c2" else np.nan,
                         c=min(g[0] for g in group), fit_min_prompt_length=ls.min(), fit_max_prompt_length=ls.max(),
                         n_repetitions=int(group[0][3].shape[0])))
    return rows


def estimate_rates(inputs, outputs, params, rule="estimate_rates"):
    """Write rates.parquet, one long table; the column ``quantity`` says what a row holds.

    Keys: ``metric`` (output | grad_U | grad_V), ``measure``, ``c``, ``statistic`` (mean | median | q90),
    ``prompt_length`` (NaN where not per-L). Values: ``estimate`` with its bootstrap ``ci_low``/``ci_high``
    (``ci_level``, whole repetitions resampled) and the theory value ``predicted``.

    * ``exponent``: p̂ with statistic ∝ L^{−p}, least squares on log–log over L in
      [fit_min_prompt_length, fit_max_prompt_length] (upper half of the grid); predicted min(1, 1/(2c))
      for the Gaussian mean (SPEC F4), 1 for medians and bounded tokens.
    * ``local_exponent``: −d log(statistic)/d log L at each L.
    * ``error_statistic``: the mean / median / 90% quantile of the squared error at each L (for figures).
    * ``asymptotic_constant`` (Gaussian, output): L·E‖T_L − T_∞‖² at the largest L against E_q tr C (F2),
      NaN where that average is infinite (c ≥ 1/2).
    * ``paper_form_c1``, ``paper_form_c2``: c₁ ln L / L^{c₂/σ²} fitted jointly over the Gaussian cells with
      c ≥ paper_form_min_c (the row's ``c``); predicted c₂ = 1/2.
    """
    frame = read_parquet(inputs["output_errors"])
    grads = read_parquet(inputs["gradient_errors"], columns=["measure", "c", "prompt_length", "repetition", "grad_U_sq_error", "grad_V_sq_error"])
    frame = frame.merge(grads, on=["measure", "c", "prompt_length", "repetition"], validate="one_to_one")
    n_boot, level = int(params["n_bootstrap"]), float(params["ci_level"])
    dim = int(params["dim"])
    rows, paper_cells = [], {}
    cells = list(frame.groupby(["measure", "c"], sort=True))
    for (name, c), cell in progress(cells, desc="rates"):
        c = float(c)
        c_index = int(round(c * 1e6))
        for metric, column in ERROR_METRICS.items():
            errors, lengths = _error_matrix(cell, column)  # [R, P], [P]
            n_reps = errors.shape[0]
            fit = upper_half(lengths)
            rng = np.random.default_rng(stream_seed(params["seed"], f"bounds/bootstrap/{name}/{metric}", c_index))
            idx = bootstrap_indices(n_reps, n_boot, rng)  # [B, R]
            common = dict(metric=metric, measure=name, c=c, n_repetitions=n_reps)
            for stat in STATISTICS:
                point = statistic(errors, stat)  # [P]
                boot = bootstrap_statistic(errors, stat, idx)  # [B, P]
                p_hat = loglog_exponent(lengths[fit], point[fit])
                lo, hi = percentile_ci(loglog_exponent(lengths[fit], boot[:, fit]), level)
                rows.append(_row(quantity="exponent", statistic=stat, estimate=p_hat, ci_low=lo, ci_high=hi,
                                 predicted=float(predicted_exponent(c, name)) if stat == "mean" else 1.0,
                                 fit_min_prompt_length=lengths[fit].min(), fit_max_prompt_length=lengths[fit].max(), **common))
                local = local_exponents(lengths, point)  # [P]
                llo, lhi = percentile_ci(local_exponents(lengths, boot), level)
                for j, L in enumerate(lengths):
                    rows.append(_row(quantity="local_exponent", statistic=stat, prompt_length=float(L), estimate=local[j],
                                     ci_low=llo[j], ci_high=lhi[j], predicted=float(predicted_exponent(c, name)) if stat == "mean" else 1.0, **common))
                for j, L in enumerate(lengths):
                    qlo, qhi = percentile_ci(boot[:, j], level)
                    rows.append(_row(quantity="error_statistic", statistic=stat, prompt_length=float(L),
                                     estimate=point[j], ci_low=qlo, ci_high=qhi, **common))
            q90, boot_q90 = statistic(errors, "q90"), bootstrap_statistic(errors, "q90", idx)  # [P], [B, P]
            qlo, qhi = percentile_ci(boot_q90, level)
            for j, L in enumerate(lengths):
                rows.append(_row(quantity="error_statistic", statistic="q90", prompt_length=float(L), estimate=q90[j],
                                 ci_low=qlo[j], ci_high=qhi[j], **common))
            if metric == "output" and name == "gaussian":
                sigma_sq = float(cell["sigma_sq"].iloc[0])
                scaled = lengths[-1] * errors[:, -1]
                boot_last = scaled[idx].mean(axis=1)  # [B]
                lo, hi = percentile_ci(boot_last, level)
                rows.append(_row(quantity="asymptotic_constant", statistic="mean", prompt_length=float(lengths[-1]),
                                 estimate=scaled.mean(), ci_low=lo, ci_high=hi,
                                 predicted=float(random_query_mean_trace_c(c, sigma_sq, dim)), **common))
            if name == "gaussian" and c >= float(params["paper_form_min_c"]):
                paper_cells.setdefault(metric, []).append((c, float(cell["sigma_sq"].iloc[0]), lengths[fit], errors[:, fit], idx))
    for metric, group in paper_cells.items():
        rows.extend(_paper_form_rows(metric, group, level))
    out = pd.DataFrame(rows)
    write_parquet(out, outputs["rates"], provenance(rule, params, seed=params["seed"]))


def fixed_query_setup(kappa: float, dim: int, rho: float, dtype=torch.float64):
    """Tokens N(0, S), S_ij = ρ^|i−j|, U = I, V = I, and z_q = a along e₁ scaled so that aᵀSa = κ.

    Host-side (CPU) tensors: the closed-form bounds are evaluated here; the Monte Carlo moves them to the device.
    """
    cpu = torch.device("cpu")
    cov = toeplitz_covariance(dim, rho, dtype=dtype, device=cpu)
    e = torch.zeros(dim, dtype=dtype, device=cpu)
    e[0] = 1.0
    query = e * math.sqrt(kappa / float(e @ cov @ e))  # [D]
    return cov, query, torch.eye(dim, dtype=dtype, device=cpu), torch.eye(dim, dtype=dtype, device=cpu)


def order_statistic_ci(sorted_values: np.ndarray, prob: float, level: float):
    """Distribution-free CI of the prob-quantile from order statistics (binomial ranks)."""
    n = len(sorted_values)
    lo_rank = int(stats.binom.ppf(0.5 * (1 - level), n, prob))
    hi_rank = int(stats.binom.ppf(1 - 0.5 * (1 - level), n, prob))
    return sorted_values[max(lo_rank - 1, 0)], sorted_values[min(hi_rank, n - 1)]


def simulate_fixed_query_bounds(inputs, outputs, params, rule="simulate_fixed_query_bounds"):
    """Write fixed_query_bounds.parquet: per (κ, L, δ) the empirical (1−δ)-quantile, F2 and F3/§D bounds."""
    dtype, device = DTYPES[params["dtype"]], resolve_device(params.get("device", "cpu"))
    dim, level = int(params["dim"]), float(params["ci_level"])
    lengths = prompt_length_grid(params["log2_min_prompt_length"], params["log2_max_prompt_length"], 1)
    n_reps, block = int(params["n_repetitions"]), int(params["repetition_block"])
    deltas = [float(d) for d in params["deltas"]]
    rows = []
    for kappa in params["kappas"]:
        kappa = float(kappa)
        cov, query, attention_matrix, value_matrix = fixed_query_setup(kappa, dim, params["rho"], dtype)
        measure = make_measure("gaussian", dim, cov=cov.to(device), dtype=dtype, device=device)
        tilt = (attention_matrix @ query).to(device)  # a [D]
        limit = measure.cgf_grad(tilt) @ value_matrix.T.to(device)  # T_∞ [Dout]
        kidx = int(round(kappa * 1e6))
        errors = []
        for b, start in enumerate(progress(range(0, n_reps, block), desc=f"fixed query kappa={kappa:g}")):
            r = min(block, n_reps - start)
            gen = stream_generator(params["seed"], "bounds/fixed_query/prompts", kidx, b, device=device)
            mean_l, _ = streaming_tilted_moments(
                tilt.expand(r, dim), measure, lengths[-1], gen, chunk_size=params["chunk_size"],
                prefix_lengths=lengths, prompt_batch_shape=(r,),
            )  # [P, R, D]
            gap = mean_l @ value_matrix.T.to(device) - limit  # [P, R, Dout]
            errors.append(torch.linalg.vector_norm(gap, dim=-1).T.cpu().numpy())  # [R, P]
        errors = np.sort(np.concatenate(errors), axis=0)  # [R, P], sorted per L
        terms = gaussian_bound_terms(tilt.cpu(), cov, value_matrix)
        c_mat = gaussian_asymptotic_covariance(tilt.cpu(), cov, value_matrix)
        f2_gen = stream_generator(params["seed"], "bounds/fixed_query/f2_law", kidx)
        f2_q = gaussian_norm_quantiles(c_mat, [1 - d for d in deltas], f2_gen, int(params["n_f2_draws"]))  # [Δ]
        for j, L in enumerate(lengths):
            for k, delta in enumerate(deltas):
                q = float(np.quantile(errors[:, j], 1 - delta))
                lo, hi = order_statistic_ci(errors[:, j], 1 - delta, level)
                bound = float(sharp_bound(terms, L, delta)[0])
                rows.append(dict(
                    kappa=kappa, prompt_length=L, effective_prompt_length=L * math.exp(-kappa), delta=delta,
                    n_repetitions=n_reps, empirical_quantile=q, quantile_ci_low=lo, quantile_ci_high=hi,
                    empirical_rms=float(np.sqrt(np.mean(errors[:, j] ** 2))),
                    f2_rms=math.sqrt(terms["trace_c"] / L), f2_quantile=float(f2_q[k]) / math.sqrt(L),
                    sharp_bound=bound, simple_bound=float(simple_bound(kappa, terms["trace_c"], L, delta)),
                    exceed_fraction=float(np.mean(errors[:, j] > bound)), bound_holds=bool(q <= bound),
                    trace_c=terms["trace_c"],
                ))
    out = pd.DataFrame(rows)
    broken = out[~out["bound_holds"]]
    if len(broken):
        print(f"WARNING: empirical quantile above the rigorous bound in {len(broken)} cells:\n{broken}")
    write_parquet(out, outputs["result"], provenance(rule, params, seed=params["seed"]))
