"""R2 at fixed queries: empirical quantiles of ‖T_L − T_∞‖ against the delta-method prediction and the
rigorous finite-L bound (docs/experiments.md#fixed_query_bound, docs/theory.md#fixed-query-fluctuations,
docs/theory.md#fixed-query-bound).

The rows of rule ``simulate_fixed_query_bound``, one per (κ, L, δ) of fixed_query_bound/quantiles.parquet:

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

import numpy as np
import torch

from largeprompt.core.seeding import stream_generator, stream_rng
from largeprompt.maths.attention import streaming_tilted_moments
from largeprompt.maths.fluctuations import gaussian_asymptotic_covariance, gaussian_bound_terms, gaussian_norm_quantiles, sharp_bound, simple_bound
from largeprompt.maths.measures import make_measure, toeplitz_covariance
from largeprompt.maths.rates import order_statistic_ci


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


class FixedQuery:
    """One κ of the experiment: tokens N(0, S), U = V = I, the query of :func:`fixed_query_setup`, the limit T_∞ and
    the closed-form terms of the bounds and of the limit law (docs/theory.md#fixed-query-bound)."""

    def __init__(self, kappa: float, dim: int, rho: float, dtype, device):
        cov, query, attention_matrix, value_matrix = fixed_query_setup(kappa, dim, rho, dtype)
        self.kappa, self.cov, self.value_matrix = kappa, cov, value_matrix
        self.measure = make_measure("gaussian", dim, cov=cov.to(device), dtype=dtype, device=device)
        self.tilt = (attention_matrix @ query).to(device)  # a [D]
        self.limit = self.measure.cgf_grad(self.tilt)  # T_∞ = V ∇K(a), V = I [D]
        self.chol = torch.linalg.cholesky(self.measure.cov)  # C (S = C Cᵀ), as the measure draws z = C g
        self.standard = make_measure("gaussian", dim, cov=torch.eye(dim, dtype=dtype, device=device), dtype=dtype,
                                     device=device)  # the g the prompts are streamed as (block_errors)
        self.terms = gaussian_bound_terms(self.tilt.cpu(), cov, value_matrix)

    def stream_index(self) -> int:
        return int(round(self.kappa * 1e6))

    def block_errors(self, seed: int, block: int, repetitions: int, lengths, chunk_size: int) -> np.ndarray:
        """‖T_L − T_∞‖ of ``repetitions`` prompts (repetition block ``block``'s stream) at every L: [R, P].

        The tokens are z = C g with g ~ N(0, I) and S = C Cᵀ, streamed as g: the scores a·z = (Cᵀa)·g and the
        tilted mean of z is C times that of g, so no pass maps the prompt (the same law and draws; round-off apart,
        the same numbers)."""
        gen = stream_rng(seed, "fixed_query_bound/prompts", self.stream_index(), block)  # numpy's ziggurat (docs/theory.md#token-sampler)
        dim = self.tilt.shape[-1]
        mean_g, _ = streaming_tilted_moments((self.chol.T @ self.tilt).expand(repetitions, dim), self.standard, lengths[-1],
                                             gen, chunk_size=chunk_size, prefix_lengths=lengths,
                                             prompt_batch_shape=(repetitions,))  # [P, R, D]
        mean_l = mean_g @ self.chol.T  # the tilted mean of z = C g
        return torch.linalg.vector_norm(mean_l - self.limit, dim=-1).T.cpu().numpy()  # V = I

    def limit_law_quantiles(self, seed: int, levels, n_draws: int) -> np.ndarray:
        """The ``levels``-quantiles of ‖N(0, C)‖ from ``n_draws`` draws of the limit law [len(levels)]."""
        c_mat = gaussian_asymptotic_covariance(self.tilt.cpu(), self.cov, self.value_matrix)
        gen = stream_generator(seed, "fixed_query_bound/limit_law", self.stream_index())
        return gaussian_norm_quantiles(c_mat, levels, gen, int(n_draws))


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
