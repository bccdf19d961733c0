"""Closed-form Jacobians of T wrt U and V (docs/theory.md#jacobians) against torch autograd, finite L and L = ∞.

Float64; each comparison is held to the rounding bound of both computations (tests/tolerance.py).
"""
import math

import pytest
import torch

from largeprompt.core.seeding import stream_generator
from largeprompt.maths.attention import finite_prompt_attention, infinite_prompt_attention, tilted_moments
from largeprompt.maths.gradients import infinite_prompt_jacobians, jacobian_sq_errors, output_jacobians
from largeprompt.maths.measures import make_measure, toeplitz_covariance
from tolerance import assert_within, attention_tolerance, gamma, matmul_tolerance, mc_tolerance, tilted_moments_tolerance

F64 = torch.float64


def _finite_jacobian_tolerances(U, V, z_q, tokens):
    """Bounds on |closed form − autograd| for (J^U, J^V) at finite L, both computations' rounding.

    J^V = δ_kj z̄_l carries the tilted-mean bound; J^U = (V Σ̂)_ki (z_q)_j carries |V|·(covariance bound)·|z_q|,
    plus γ_N |V| (Σᵢwᵢ|zᵢ||zᵢ|ᵀ + (Σᵢwᵢ|zᵢ|)(Σᵢwᵢ|zᵢ|)ᵀ)|z_q| for autograd's softmax backward, which forms
    wᵢ(gᵢ − Σⱼwⱼgⱼ) from uncentred terms.
    """
    tilt = U @ z_q
    from_tilt = (gamma(z_q.shape[-1]) * (U.abs() @ z_q.abs()) @ tokens.abs().T).max()
    mean_tol, cov_tol = tilted_moments_tolerance(tilt, tokens, score_error=from_tilt)
    w = torch.softmax(tokens @ tilt, 0)
    first_abs = w @ tokens.abs()
    cov_abs = torch.einsum("l,li,lj->ij", w, tokens.abs(), tokens.abs()) + torch.outer(first_abs, first_abs)
    g = gamma(3 * tokens.shape[0] + 2 * tokens.shape[1] + 8)
    tol_u = (V.abs() @ (cov_tol + g * cov_abs)).unsqueeze(-1) * z_q.abs()
    tol_v = torch.eye(V.shape[0], dtype=F64).unsqueeze(-1) * mean_tol
    return 2 * tol_u, 2 * tol_v


def _limit_hessian_abs(name, measure, a):
    """|·| evaluation of ∇²K(a), as the closed form or autograd through ∇K computes it [D, D].

    Gaussian: |S|. Rademacher: 1 + tanh²a. Uniform, x = √3a: 3(1/x² + coth²x + 1), covering both
    1/x² − 1/sinh²x and autograd's 1/x² − (1 − tanh²x)/tanh²x.
    """
    if name == "gaussian":
        return measure.cov.abs()
    if name == "rademacher":
        return torch.diag(1 + torch.tanh(a) ** 2)
    x = math.sqrt(3) * a
    return torch.diag(3 * (1 / x**2 + 1 / torch.tanh(x) ** 2 + 1))


def _params(dim=3, d_out=2):
    gen = stream_generator(3, "test/gradients/params", 0)
    U = 0.6 * torch.randn(dim, dim, generator=gen, dtype=F64)
    V = torch.randn(d_out, dim, generator=gen, dtype=F64)
    z_q = torch.randn(dim, generator=gen, dtype=F64)
    return U, V, z_q


@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform"])
def test_finite_prompt_jacobians_match_autograd(name):
    U, V, z_q = _params()
    measure = make_measure(name, 3, cov=toeplitz_covariance(3, 0.4) if name == "gaussian" else None)
    tokens = measure.sample(300, stream_generator(3, f"test/gradients/tokens/{name}", 0))  # [L, D]
    def direct(u, v):  # T_L = V Σᵢ softmax_i(⟨U z_q, zᵢ⟩) zᵢ, plain softmax (not the streaming code)
        return v @ (torch.softmax(tokens @ (u @ z_q), dim=0) @ tokens)

    jac_u_auto, jac_v_auto = torch.autograd.functional.jacobian(direct, (U, V))  # [Dout, D, D], [Dout, Dout, D]
    assert_within(direct(U, V), finite_prompt_attention(z_q, tokens, U, V, chunk_size=64),
                  2 * attention_tolerance(z_q, tokens, U, V), "T_L")
    mean, cov = tilted_moments(U @ z_q, tokens, chunk_size=64, second_moment=True)
    jac_u, jac_v = output_jacobians(mean, cov, z_q, V)
    tol_u, tol_v = _finite_jacobian_tolerances(U, V, z_q, tokens)
    assert_within(jac_u, jac_u_auto, tol_u, "J^U")
    assert_within(jac_v, jac_v_auto, tol_v, "J^V")


@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform"])
def test_infinite_prompt_jacobians_match_autograd(name):
    U, V, z_q = _params()
    measure = make_measure(name, 3, cov=toeplitz_covariance(3, 0.4) if name == "gaussian" else None)
    jac_u_auto, jac_v_auto = torch.autograd.functional.jacobian(
        lambda u, v: infinite_prompt_attention(z_q, measure, u, v), (U, V)
    )
    jac_u, jac_v = infinite_prompt_jacobians(z_q, measure, U, V)
    a = U @ z_q
    # ∇²K: a few dozen roundings (special functions, autograd chain) on the |·| scale; then V·, ⊗z_q
    hess_abs = _limit_hessian_abs(name, measure, a)
    tol_u = 2 * matmul_tolerance(32 + 3, (V.abs() @ hess_abs).unsqueeze(-1) * z_q.abs())
    assert_within(jac_u, jac_u_auto, tol_u, "J^U")
    assert_within(jac_v, jac_v_auto, 0.0, "J^V")  # ∇K(a) itself on both sides: autograd of v ↦ v∇K is exact


def test_gaussian_limit_jacobians_are_the_theory_formulas():
    """docs/theory.md#jacobians: ∂T_k/∂V_jl = δ_kj (m + S U z_q)_l and ∂T_k/∂U_ij = (V S)_ki (z_q)_j."""
    U, V, z_q = _params()
    S, m = toeplitz_covariance(3, 0.4), torch.tensor([0.2, -0.1, 0.3], dtype=F64)
    measure = make_measure("gaussian", 3, mean=m, cov=S)
    jac_u, jac_v = infinite_prompt_jacobians(z_q, measure, U, V)
    eye = torch.eye(2, dtype=F64)
    tol_u = 2 * matmul_tolerance(3 + 1, torch.einsum("ki,j->kij", V.abs() @ S, z_q.abs()))
    assert_within(jac_u, torch.einsum("ki,j->kij", V @ S, z_q), tol_u, "J^U")
    tol_v = 2 * matmul_tolerance(2 * 3 + 1, torch.einsum("kj,l->kjl", eye, m.abs() + S.abs() @ U.abs() @ z_q.abs()))
    assert_within(jac_v, torch.einsum("kj,l->kjl", eye, m + S @ U @ z_q), tol_v, "J^V")


def test_sq_error_metric_is_frobenius_norm_of_jacobian_difference():
    U, V, z_q = _params()
    measure = make_measure("uniform", 3)
    tokens = measure.sample(200, stream_generator(3, "test/gradients/metric", 0))
    mean, cov = tilted_moments(U @ z_q, tokens, second_moment=True)
    a = U @ z_q
    ju_l, jv_l = output_jacobians(mean, cov, z_q, V)
    ju_i, jv_i = infinite_prompt_jacobians(z_q, measure, U, V)
    err_u, err_v = jacobian_sq_errors(mean, cov, measure.cgf_grad(a), measure.cgf_hess(a), z_q, V)
    # Σx² with x = J_L − J_∞ formed two ways; each x carries δx = γ_{D+2}|V|(|Σ̂_L| + |∇²K|)|z_q| (resp.
    # γ_1(|z̄_L| + |∇K|) for V), so δΣx² ≤ 2Σ|x|δx + γ_n Σx² for either form, and twice that between them.
    x_u, x_v = ju_l - ju_i, jv_l - jv_i
    dx_u = gamma(3 + 2) * (V.abs() @ (cov.abs() + measure.cgf_hess(a).abs())).unsqueeze(-1) * z_q.abs()
    dx_v = gamma(1) * torch.eye(V.shape[0], dtype=F64).unsqueeze(-1) * (mean.abs() + measure.cgf_grad(a).abs())
    tol_u = 2 * (2 * (x_u.abs() * dx_u).sum() + gamma(x_u.numel() + 3) * (x_u**2).sum())
    tol_v = 2 * (2 * (x_v.abs() * dx_v).sum() + gamma(x_v.numel() + 3) * (x_v**2).sum())
    assert_within(err_u, (x_u**2).sum(), tol_u, "‖ΔJ^U‖²")
    assert_within(err_v, (x_v**2).sum(), tol_v, "‖ΔJ^V‖²")


def test_gradient_fluctuation_constants_match_monte_carlo():
    """docs/theory.md#jacobians: L·E‖J_L − J_∞‖_F² → the Isserlis closed form, for U and V, at a fixed query.

    Within 5 standard errors plus an allowance of 5·const/L for the O(1/L) remainder of the limit.
    """
    from largeprompt.maths.attention import streaming_tilted_moments
    from largeprompt.maths.gradients import gaussian_jacobian_constants

    dim, L, R = 2, 1024, 4000
    S = toeplitz_covariance(dim, 0.5)
    V = torch.tensor([[1.0, 0.5], [-0.3, 2.0], [0.2, 0.1]], dtype=F64)
    z_q = torch.tensor([0.5, -0.3], dtype=F64)
    U = torch.eye(dim, dtype=F64)
    a = U @ z_q
    measure = make_measure("gaussian", dim, cov=S)
    mean, cov = streaming_tilted_moments(a.expand(R, dim), measure, L, stream_generator(3, "test/gradients/const", 0),
                                         chunk_size=L, second_moment=True, prompt_batch_shape=(R,))
    err_u, err_v = jacobian_sq_errors(mean, cov, measure.cgf_grad(a), measure.cgf_hess(a), z_q, V)  # [R]
    const_u, const_v = gaussian_jacobian_constants(a, S, z_q, V)
    for err, const in ((err_u * L, const_u), (err_v * L, const_v)):
        emp, se = float(err.mean()), float(err.std() / math.sqrt(R))
        assert_within(emp, float(const), mc_tolerance(se) + 5.0 * float(const) / L, "L·E‖ΔJ‖²")
