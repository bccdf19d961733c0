"""Gradients of the attention output with respect to U and V, finite and infinite prompt (docs/theory.md#jacobians).

With a = U z_q, T = V z̄ where z̄ is the softmax-weighted prompt mean (finite L) or ∇K(a) (L = ∞).
Differentiating the tilt gives, exactly,

    dT = dV z̄ + V Σ̂ dU z_q,   i.e.   ∂T_k/∂V_jl = δ_kj z̄_l,   ∂T_k/∂U_ij = (V Σ̂)_ki (z_q)_j,

with Σ̂ the softmax-weighted covariance (finite L) or ∇²K(a) (L = ∞; S for Gaussian tokens).

**Gradient error metric.** The pipeline records the squared Frobenius norm of the Jacobian
difference, which does not depend on any loss:

    ‖J^U_L − J^U_∞‖_F² = ‖V (Σ̂_L − ∇²K(a))‖_F² ‖z_q‖²,    ‖J^V_L − J^V_∞‖_F² = Dout ‖z̄_L − ∇K(a)‖².

For a loss ℓ(T), ∇_U ℓ = J^{Uᵀ} g with g = ∂ℓ/∂T, so these bound the gradient errors by ‖g‖².
"""
from __future__ import annotations

import torch

from largeprompt.maths.measures import TokenMeasure


def output_jacobians(mean: torch.Tensor, cov: torch.Tensor, query: torch.Tensor, value_matrix: torch.Tensor):
    """(∂T/∂U [..., Dout, D, D], ∂T/∂V [..., Dout, Dout, D]) from a tilted mean [..., D] and covariance [..., D, D].

    Index order follows the parameter: J^U[..., k, i, j] = ∂T_k/∂U_ij and J^V[..., k, j, l] = ∂T_k/∂V_jl.
    """
    d_out = value_matrix.shape[0]
    v_sigma = value_matrix @ cov  # V Σ̂, [..., Dout, D]
    jac_u = v_sigma.unsqueeze(-1) * query.unsqueeze(-2).unsqueeze(-2)  # [..., Dout, D, D]
    eye = torch.eye(d_out, dtype=mean.dtype, device=mean.device)  # [Dout, Dout]
    jac_v = eye.unsqueeze(-1) * mean.unsqueeze(-2).unsqueeze(-2)  # [..., Dout, Dout, D]
    return jac_u, jac_v


def infinite_prompt_jacobians(query: torch.Tensor, measure: TokenMeasure, attention_matrix: torch.Tensor, value_matrix: torch.Tensor):
    """Jacobians of T_μ(z_q) = V ∇K(U z_q) wrt U and V (docs/theory.md#jacobians, L = ∞): z̄ → ∇K(a), Σ̂ → ∇²K(a)."""
    tilt = query @ attention_matrix.T  # a = U z_q, [..., D]
    return output_jacobians(measure.cgf_grad(tilt), measure.cgf_hess(tilt), query, value_matrix)


def jacobian_sq_errors(
    finite_mean: torch.Tensor,
    finite_cov: torch.Tensor,
    limit_mean: torch.Tensor,
    limit_cov: torch.Tensor,
    query: torch.Tensor,
    value_matrix: torch.Tensor,
):
    """(‖J^U_L − J^U_∞‖_F², ‖J^V_L − J^V_∞‖_F²) [...] without forming the Jacobians (metric in the module doc)."""
    d_out = value_matrix.shape[0]
    cov_gap = value_matrix @ (finite_cov - limit_cov)  # V(Σ̂_L − ∇²K), [..., Dout, D]
    err_u = (cov_gap * cov_gap).sum((-2, -1)) * (query * query).sum(-1)
    mean_gap = finite_mean - limit_mean  # [..., D]
    err_v = d_out * (mean_gap * mean_gap).sum(-1)
    return err_u, err_v


def gaussian_jacobian_constants(a: torch.Tensor, cov: torch.Tensor, query: torch.Tensor, value_matrix: torch.Tensor):
    """Limits of L·E‖J^U_L − J^U_∞‖_F² and L·E‖J^V_L − J^V_∞‖_F² at a fixed query, Gaussian tokens (docs/theory.md#jacobians).

    V part: Dout e^κ (tr S + ‖Sa‖²). U part: e^κ ‖z_q‖² E_{y~N(Sa,S)} ‖V(yyᵀ − S)‖_F², which by Isserlis'
    theorem with B = VᵀV and μ = Sa equals
    tr S·tr BS + tr BS² + ‖μ‖² tr BS + μᵀBμ tr S + 2 μᵀSBμ + ‖μ‖² μᵀBμ.
    Returns (U constant, V constant) as 0-d tensors.
    """
    kappa = (a @ cov) @ a
    mu = cov @ a  # [D]
    b = value_matrix.T @ value_matrix  # [D, D]
    tr_s, tr_bs, tr_bss = torch.trace(cov), torch.trace(b @ cov), torch.trace(b @ cov @ cov)
    mu_sq, mu_b = mu @ mu, mu @ b @ mu
    isserlis = tr_s * tr_bs + tr_bss + mu_sq * tr_bs + mu_b * tr_s + 2.0 * (mu @ cov @ b @ mu) + mu_sq * mu_b
    d_out = value_matrix.shape[0]
    return torch.exp(kappa) * (query @ query) * isserlis, d_out * torch.exp(kappa) * (tr_s + mu_sq)
