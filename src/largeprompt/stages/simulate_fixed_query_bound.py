"""R2 at fixed queries: empirical quantiles of ‖T_L − T_∞‖ against the delta-method prediction and the
rigorous finite-L bound (docs/experiments.md#fixed_query_bound, docs/theory.md#fixed-query-fluctuations,
docs/theory.md#fixed-query-bound).

Rule ``simulate_fixed_query_bound``: one row per (κ, L, δ) of fixed_query_bound/quantiles.parquet:

* ``empirical_quantile`` with its order-statistic CI ``quantile_ci_low``/``quantile_ci_high``, ``empirical_rms``;
* the δ-method prediction: ``delta_method_rms`` = √(tr C/L) and ``delta_method_quantile``, the (1 − δ)-quantile
  of ‖N(0, C/L)‖ from ``n_limit_law_draws`` draws of the limit law;
* ``sharp_bound`` (the rigorous finite-L bound), ``simple_bound`` (NaN where it does not apply),
  ``exceed_fraction``, ``bound_holds``, ``trace_c``;
* for the figure's last panel: ``effective_prompt_length`` L e^{−κ}, ``unit_effective_prompt_length`` e^κ (the L
  where L e^{−κ} = 1), and ``normalised_quantile``, ``normalised_quantile_ci_low``, ``normalised_quantile_ci_high``,
  ``normalised_delta_method_quantile``: the quantile, its CI and the δ-method quantile divided by ``delta_method_rms``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.core.seeding import stream_generator, stream_rng
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.maths.attention import streaming_tilted_moments
from largeprompt.maths.concentration import prompt_length_grid
from largeprompt.maths.fluctuations import gaussian_asymptotic_covariance, gaussian_bound_terms, gaussian_norm_quantiles, sharp_bound, simple_bound
from largeprompt.maths.measures import make_measure, toeplitz_covariance
from largeprompt.maths.rates import order_statistic_ci


@dataclass(frozen=True)
class FixedQuerySettings:
    """Config section ``fixed_query_bound``."""

    kappas: list
    rho: float
    dim: int
    log2_min_prompt_length: int
    log2_max_prompt_length: int
    n_repetitions: int
    repetition_block: int
    deltas: list
    n_limit_law_draws: int
    chunk_size: int
    ci_level: float


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


def sorted_errors(cfg: FixedQuerySettings, measure, tilt, limit, lengths, seed, kappa, chunk_size, device):
    """‖T_L − T_∞‖ of every prompt at every L, sorted per L: [R, P]."""
    errors = []
    kidx = int(round(kappa * 1e6))
    dim = tilt.shape[-1]
    for b, start in enumerate(progress(range(0, cfg.n_repetitions, cfg.repetition_block), desc=f"fixed query kappa={kappa:g}")):
        r = min(cfg.repetition_block, cfg.n_repetitions - start)
        gen = stream_rng(seed, "fixed_query_bound/prompts", kidx, b)  # numpy's ziggurat (docs/theory.md#token-sampler)
        mean_l, _ = streaming_tilted_moments(tilt.expand(r, dim), measure, lengths[-1], gen, chunk_size=chunk_size,
                                             prefix_lengths=lengths, prompt_batch_shape=(r,))  # [P, R, D]
        errors.append(torch.linalg.vector_norm(mean_l - limit, dim=-1).T.cpu().numpy())  # V = I: [R, P]
    return np.sort(np.concatenate(errors), axis=0)


def kappa_rows(kappa, errors, lengths, terms, limit_quantiles, deltas, level) -> list[dict]:
    """One row per (L, δ): empirical (1−δ)-quantile with its CI, the δ-method prediction and both bounds (module docstring)."""
    rows = []
    for j, L in enumerate(lengths):
        rms = math.sqrt(terms["trace_c"] / L)  # the δ-method scale √(tr C/L)
        for k, delta in enumerate(deltas):
            q = float(np.quantile(errors[:, j], 1 - delta))
            lo, hi = order_statistic_ci(errors[:, j], 1 - delta, level)
            bound = float(sharp_bound(terms, L, delta)[0])
            law_q = float(limit_quantiles[k]) / math.sqrt(L)
            rows.append(dict(
                kappa=kappa, prompt_length=L, effective_prompt_length=L * math.exp(-kappa),
                unit_effective_prompt_length=math.exp(kappa), delta=delta,
                n_repetitions=errors.shape[0], empirical_quantile=q, quantile_ci_low=lo, quantile_ci_high=hi,
                empirical_rms=float(np.sqrt(np.mean(errors[:, j] ** 2))), delta_method_rms=rms, delta_method_quantile=law_q,
                sharp_bound=bound, simple_bound=float(simple_bound(kappa, terms["trace_c"], L, delta)),
                exceed_fraction=float(np.mean(errors[:, j] > bound)), bound_holds=bool(q <= bound),
                trace_c=terms["trace_c"], normalised_quantile=q / rms, normalised_quantile_ci_low=float(lo) / rms,
                normalised_quantile_ci_high=float(hi) / rms, normalised_delta_method_quantile=law_q / rms,
            ))
    return rows


def simulate_fixed_query_bound(inputs, outputs, params, rule="simulate_fixed_query_bound", runtime=DEFAULT_RUNTIME):
    """Write fixed_query_bound/quantiles.parquet: per (κ, L, δ) the empirical quantile, the δ-method prediction and the bounds."""
    cfg = settings_from(FixedQuerySettings, params["fixed_query_bound"], "fixed_query_bound")
    dtype, device = dtype_of(params["dtype"]), resolve_device(runtime.device)
    lengths = prompt_length_grid(cfg.log2_min_prompt_length, cfg.log2_max_prompt_length, 1)
    deltas = [float(d) for d in cfg.deltas]
    rows = []
    for kappa in map(float, cfg.kappas):
        cov, query, attention_matrix, value_matrix = fixed_query_setup(kappa, cfg.dim, cfg.rho, dtype)
        measure = make_measure("gaussian", cfg.dim, cov=cov.to(device), dtype=dtype, device=device)
        tilt = (attention_matrix @ query).to(device)  # a [D]
        limit = measure.cgf_grad(tilt)  # T_∞ = V ∇K(a), V = I [D]
        errors = sorted_errors(cfg, measure, tilt, limit, lengths, params["seed"], kappa, cfg.chunk_size, device)
        terms = gaussian_bound_terms(tilt.cpu(), cov, value_matrix)
        c_mat = gaussian_asymptotic_covariance(tilt.cpu(), cov, value_matrix)
        law_gen = stream_generator(params["seed"], "fixed_query_bound/limit_law", int(round(kappa * 1e6)))
        law_q = gaussian_norm_quantiles(c_mat, [1 - d for d in deltas], law_gen, int(cfg.n_limit_law_draws))  # [Δ]
        rows += kappa_rows(kappa, errors, lengths, terms, law_q, deltas, float(cfg.ci_level))
    out = pd.DataFrame(rows)
    broken = out[~out["bound_holds"]]
    if len(broken):
        print(f"WARNING: empirical quantile above the rigorous bound in {len(broken)} cells:\n{broken}")
    write_parquet(out, outputs["quantiles"], provenance(rule, params, base_seed=params["seed"], runtime=runtime))
