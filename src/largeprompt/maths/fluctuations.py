"""Fixed-query fluctuations of finite-prompt attention and their bounds
(docs/theory.md#fixed-query-fluctuations, docs/theory.md#leading-bias, docs/theory.md#fixed-query-bound).

For a fixed query with tilt a = U z_q, T_{μ_L} − T_μ = U_L / D_L with U_L the mean of
ξᵢ = wᵢ V(zᵢ − ∇K(a)), wᵢ = e^{⟨a, zᵢ⟩}, and D_L the mean of the wᵢ (docs/theory.md#fixed-query-fluctuations). Everything below
is a closed form in a, S (or the CGF K) and V; κ = aᵀSa sets the effective prompt length L e^{−κ}.

Shapes: tilt a ``[..., D]``, covariance S ``[D, D]``, value matrix V ``[Dout, D]``.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from largeprompt.core.seeding import standard_normal
from largeprompt.maths.measures import TokenMeasure


def tilt_concentration(a: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """κ = aᵀSa [...], the log of ρ(a) = E w²/(E w)² for Gaussian tokens (docs/theory.md#notation)."""
    return ((a @ cov) * a).sum(-1)


def asymptotic_covariance(a: torch.Tensor, measure: TokenMeasure, value_matrix: torch.Tensor) -> torch.Tensor:
    """C of √L (T_{μ_L} − T_μ) → N(0, C) for any measure (docs/theory.md#fixed-query-fluctuations) [..., Dout, Dout].

    C = e^{K(2a)−2K(a)} V [∇²K(2a) + ΔΔᵀ] Vᵀ with Δ = ∇K(2a) − ∇K(a).
    """
    rho = torch.exp(measure.cgf(2 * a) - 2 * measure.cgf(a))  # [...]
    delta = measure.cgf_grad(2 * a) - measure.cgf_grad(a)  # [..., D]
    inner = measure.cgf_hess(2 * a) + delta.unsqueeze(-1) * delta.unsqueeze(-2)  # [..., D, D]
    return rho[..., None, None] * (value_matrix @ inner @ value_matrix.T)


def gaussian_asymptotic_covariance(a: torch.Tensor, cov: torch.Tensor, value_matrix: torch.Tensor) -> torch.Tensor:
    """C = e^κ (V S Vᵀ + V S a aᵀ S Vᵀ) for Gaussian tokens N(m, S) (docs/theory.md#fixed-query-fluctuations) [..., Dout, Dout]."""
    kappa = tilt_concentration(a, cov)  # [...]
    vsa = (a @ cov) @ value_matrix.T  # V S a, [..., Dout]
    vsv = value_matrix @ cov @ value_matrix.T  # [Dout, Dout]
    return torch.exp(kappa)[..., None, None] * (vsv + vsa.unsqueeze(-1) * vsa.unsqueeze(-2))


def leading_bias(a: torch.Tensor, measure: TokenMeasure, value_matrix: torch.Tensor, prompt_length) -> torch.Tensor:
    """E T_{μ_L} − T_μ ≈ −(1/L) e^{K(2a)−2K(a)} V (∇K(2a) − ∇K(a)) (docs/theory.md#leading-bias) [..., Dout].

    For Gaussian tokens this is −(e^κ/L) V S a, exact up to O(L⁻²).
    """
    rho = torch.exp(measure.cgf(2 * a) - 2 * measure.cgf(a))  # [...]
    delta = measure.cgf_grad(2 * a) - measure.cgf_grad(a)  # [..., D]
    return -(rho / prompt_length).unsqueeze(-1) * (delta @ value_matrix.T)


def gaussian_fourth_moment(a: torch.Tensor, cov: torch.Tensor, value_matrix: torch.Tensor) -> torch.Tensor:
    """c₄ = E‖ξ‖⁴ / D⁴ for Gaussian tokens (docs/theory.md#fixed-query-bound) [...].

    c₄ = e^{6κ} [(tr Σ_V + ‖μ_V‖²)² + 2 tr Σ_V² + 4 μ_Vᵀ Σ_V μ_V], Σ_V = V S Vᵀ, μ_V = 3 V S a.
    """
    kappa = tilt_concentration(a, cov)  # [...]
    sigma_v = value_matrix @ cov @ value_matrix.T  # [Dout, Dout]
    mu_v = 3.0 * (a @ cov) @ value_matrix.T  # [..., Dout]
    mu_sq = (mu_v * mu_v).sum(-1)
    quad = ((mu_v @ sigma_v) * mu_v).sum(-1)
    tr, tr_sq = torch.trace(sigma_v), torch.trace(sigma_v @ sigma_v)
    return torch.exp(6.0 * kappa) * ((tr + mu_sq) ** 2 + 2.0 * tr_sq + 4.0 * quad)


def _as_np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def simple_bound(kappa, trace_c, prompt_length, delta):
    """The simple bound: ‖T_{μ_L} − T_μ‖ ≤ 2√2 √(tr C) / √(Lδ) w.p. ≥ 1 − δ (docs/theory.md#fixed-query-bound).

    Here tr C = e^κ (tr VSVᵀ + ‖VSa‖²). Valid only when L ≥ 8(e^κ − 1)/δ; NaN otherwise (vacuous).
    Arguments broadcast (numpy).
    """
    kappa, trace_c, n, delta = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (kappa, trace_c, prompt_length, delta)))
    bound = 2.0 * math.sqrt(2.0) * np.sqrt(trace_c / (n * delta))
    return np.where(n >= 8.0 * np.expm1(kappa) / delta, bound, np.nan)


def fourth_moment_of_mean(trace_c, trace_c_sq, c4, prompt_length):
    """E‖U_L‖⁴/D⁴ = c₄/L³ + (L−1)/L³ [(tr C)² + 2 tr C²] for i.i.d. mean-zero ξ (docs/theory.md#fixed-query-bound)."""
    n = np.asarray(prompt_length, dtype=np.float64)
    return c4 / n**3 + (n - 1.0) / n**3 * (trace_c**2 + 2.0 * trace_c_sq)


def sharp_bound_at_split(kappa, trace_c, moment4, prompt_length, delta1, delta2):
    """B = q/(1 − r) for one split δ = δ₁ + δ₂ (docs/theory.md#fixed-query-bound); +inf where r ≥ 1.

    q = min(√(tr C/(Lδ₁)), (E‖U_L‖⁴/D⁴/δ₁)^{1/4}) bounds ‖U_L‖/D w.p. ≥ 1 − δ₁ (Chebyshev / Markov);
    r = min(√((e^κ−1)(1−δ₂)/(Lδ₂)), √(2e^κ ln(1/δ₂)/L)) bounds 1 − D_L/D w.p. ≥ 1 − δ₂ (Cantelli / Maurer).
    """
    n = np.asarray(prompt_length, dtype=np.float64)
    q = np.minimum(np.sqrt(trace_c / (n * delta1)), (moment4 / delta1) ** 0.25)
    r = np.minimum(
        np.sqrt(np.expm1(kappa) * (1.0 - delta2) / (n * delta2)),
        np.sqrt(2.0 * np.exp(kappa) * np.log(1.0 / delta2) / n),
    )
    return np.where(r < 1.0, q / np.maximum(1.0 - r, 1e-300), np.inf)


def split_grid(n_split: int = 99) -> np.ndarray:
    """The deterministic grid of fractions f, δ₁ = f δ, δ₂ = (1 − f) δ, searched by :func:`sharp_bound`."""
    return np.linspace(0.01, 0.99, n_split)


def trivial_bound(vsa_norm, vs_half_fro, vs_half_op, prompt_length, delta):
    """B_triv = ‖VSa‖ + ‖VS^{1/2}‖_F + ‖VS^{1/2}‖_op √(2 ln(L/δ)) (docs/theory.md#fixed-query-bound); does not decay in L."""
    n = np.asarray(prompt_length, dtype=np.float64)
    return vsa_norm + vs_half_fro + vs_half_op * np.sqrt(2.0 * np.log(n / delta))


def gaussian_bound_terms(a: torch.Tensor, cov: torch.Tensor, value_matrix: torch.Tensor) -> dict:
    """The query-dependent constants of the fixed-query bounds (docs/theory.md#fixed-query-bound) for one tilt a [D] (floats)."""
    c_mat = gaussian_asymptotic_covariance(a, cov, value_matrix)  # [Dout, Dout]
    evals, evecs = torch.linalg.eigh(cov)
    cov_half = evecs @ torch.diag(evals.clamp_min(0).sqrt()) @ evecs.T  # S^{1/2}
    vs_half = value_matrix @ cov_half  # [Dout, D]
    return {
        "kappa": float(tilt_concentration(a, cov)),
        "trace_c": float(torch.trace(c_mat)),
        "trace_c_sq": float(torch.trace(c_mat @ c_mat)),
        "c4": float(gaussian_fourth_moment(a, cov, value_matrix)),
        "vsa_norm": float(torch.linalg.vector_norm(value_matrix @ (cov @ a))),
        "vs_half_fro": float(torch.linalg.matrix_norm(vs_half, "fro")),
        "vs_half_op": float(torch.linalg.matrix_norm(vs_half, 2)),
    }


def sharp_bound(terms: dict, prompt_length, delta: float, n_split: int = 99) -> np.ndarray:
    """The rigorous (1 − δ) bound min(min_f B(fδ, (1−f)δ), B_triv) (docs/theory.md#fixed-query-bound), per prompt length.

    B depends only on (κ, C, L, δ), not on the prompt, so the minimising split f* is a deterministic
    choice and B(f*δ, (1−f*)δ) is a valid (1 − δ) bound: no union over the grid is needed.
    """
    n = np.atleast_1d(np.asarray(prompt_length, dtype=np.float64))[:, None]  # [P, 1]
    frac = split_grid(n_split)[None, :]  # [1, F]
    moment4 = fourth_moment_of_mean(terms["trace_c"], terms["trace_c_sq"], terms["c4"], n)
    b = sharp_bound_at_split(terms["kappa"], terms["trace_c"], moment4, n, frac * delta, (1.0 - frac) * delta)  # [P, F]
    b_triv = trivial_bound(terms["vsa_norm"], terms["vs_half_fro"], terms["vs_half_op"], n[:, 0], delta)  # [P]
    return np.minimum(b.min(axis=1), b_triv)


def random_query_mean_trace_c(c, sigma_sq, dim: int) -> np.ndarray:
    """E_{z_q} tr C over random queries (docs/theory.md#random-query-rate), finite only for c < 1/2 (NaN otherwise).

    Tokens N(0, σ² I_D), z_q ~ N(0, I_D), U = u I, V = I_D, c = σ² u²: tr C = σ² e^{c‖g‖²}(D + c‖g‖²)
    and E e^{c‖g‖²} = (1 − 2c)^{−D/2}, E ‖g‖² e^{c‖g‖²} = D (1 − 2c)^{−D/2−1}, so
    E tr C = σ² D (1 − 2c)^{−D/2} (1 − c)/(1 − 2c). It is the limit of L·E‖T_L − T_∞‖².
    """
    c = np.asarray(c, dtype=np.float64)
    safe = np.where(c < 0.5, c, 0.0)
    value = sigma_sq * dim * (1.0 - 2.0 * safe) ** (-dim / 2.0) * (1.0 - safe) / (1.0 - 2.0 * safe)
    return np.where(c < 0.5, value, np.nan)


def gaussian_norm_quantiles(c_mat: torch.Tensor, probs, generator: torch.Generator, n_draws: int = 200_000) -> np.ndarray:
    """Quantiles of ‖X‖, X ~ N(0, C) (the limit law of √L(T_{μ_L} − T_μ), docs/theory.md#fixed-query-fluctuations), by a seeded Monte Carlo."""
    evals, evecs = torch.linalg.eigh(c_mat)
    root = evecs @ torch.diag(evals.clamp_min(0).sqrt())  # C^{1/2} up to rotation
    g = standard_normal((n_draws, c_mat.shape[0]), generator, c_mat.dtype, c_mat.device)
    norms = torch.linalg.vector_norm(g @ root.T, dim=-1).cpu().numpy()  # [n_draws]
    return np.quantile(norms, np.asarray(probs, dtype=np.float64))
