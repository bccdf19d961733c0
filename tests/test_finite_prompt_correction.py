"""Finite-L correction of the reduced softmax model: L·(R_L − R∞) → F(v, A) (docs/theory.md#finite-prompt-correction,
#valley-optimum)."""
import math

import numpy as np
import pytest
import torch
from scipy import optimize

from largeprompt.icl.risks import reduced_finite_prompt_correction, valley_correction, valley_optimal_scale, valley_optimum
from tolerance import assert_within, eps, gamma, mc_tolerance

LAM = np.array([[1.0, 0.3, 0.0], [0.3, 1.0, 0.3], [0.0, 0.3, 1.0]])
A = np.array([[0.3, 0.05, 0.0], [-0.05, 0.25, 0.02], [0.04, 0.0, 0.35]])  # non-symmetric, ‖A‖ < 1/2


def scaled_excess_risk(v, A, lam, noise_variance, L, n, seed=0, block=10_000, task_variance=1.0):
    """Monte Carlo of L·(R_L − R∞) with common random numbers; y_q is averaged out exactly; β ~ N(0, τ² I).

    (ŷ_L − y_q)² − (ŷ_∞ − y_q)² = (ŷ_L − ŷ_∞)(ŷ_L + ŷ_∞ − 2y_q), and E[y_q | x_q, β] = βᵀx_q.
    """
    gen = torch.Generator().manual_seed(seed)
    d = lam.shape[0]
    chol, At, lam_t = torch.linalg.cholesky(torch.tensor(lam)), torch.tensor(A), torch.tensor(lam)
    values = []
    for start in range(0, n, block):
        b = min(block, n - start)
        xq = torch.randn(b, d, generator=gen, dtype=torch.float64) @ chol.T  # [b, d]
        beta = torch.randn(b, d, generator=gen, dtype=torch.float64) * math.sqrt(task_variance)
        x = torch.randn(b, L, d, generator=gen, dtype=torch.float64) @ chol.T  # [b, L, d]
        y = (x @ beta[:, :, None])[..., 0] + math.sqrt(noise_variance) * torch.randn(b, L, generator=gen, dtype=torch.float64)
        weights = torch.softmax((x @ (xq @ At)[:, :, None])[..., 0], dim=-1)  # softmax(x_qᵀ A xᵢ)
        y_L = v * (weights * y).sum(-1)
        y_inf = v * ((beta @ lam_t) * (xq @ At)).sum(-1)  # v βᵀΛAᵀx_q
        values.append(((y_L - y_inf) * (y_L + y_inf - 2 * (xq * beta).sum(-1))).numpy())
    values = np.concatenate(values)
    return L * values.mean(), L * values.std() / math.sqrt(len(values))


@pytest.mark.slow
@pytest.mark.parametrize("v, lam", [(1.5, np.eye(3)), (2.0, LAM)], ids=["isotropic", "toeplitz"])
def test_correction_matches_monte_carlo(v, lam):
    F = reduced_finite_prompt_correction(v, A, lam, 0.25)
    L = 200
    estimate, se = scaled_excess_risk(v, A, lam, 0.25, L=L, n=100_000)
    # Monte Carlo error, plus the O(1/L) remainder of L·(R_L − R∞) − F, allowed a coefficient of 20·|F| (10% at L = 200)
    assert_within(estimate, F, mc_tolerance(se) + 20 * abs(F) / L, "L·(R_L − R∞)")


def test_correction_is_infinite_beyond_the_critical_norm():
    assert math.isinf(reduced_finite_prompt_correction(1.0, 0.75 * np.eye(2), np.eye(2), 0.1))
    assert math.isfinite(reduced_finite_prompt_correction(1.0, 0.70 * np.eye(2), np.eye(2), 0.1))


def test_valley_optimal_scale_minimises_the_correction():
    """On the valley vA = I the best scale α* minimises f(α) = F(1/α, αI): α* = 0.4042, f = 44.08 at d = 3, σ = 0.5
    (docs/theory.md#valley-optimum)."""
    d, s2 = 3, 0.25
    f = lambda alpha: reduced_finite_prompt_correction(1.0 / alpha, alpha * np.eye(d), np.eye(d), s2)  # noqa: E731
    xatol = 1e-9
    numeric = optimize.minimize_scalar(f, bounds=(0.05, 0.7), method="bounded", options={"xatol": xatol}).x
    alpha = valley_optimal_scale(d, s2)
    # Brent's bounded search stops within 2(√eps·|x| + xatol/3) of its minimiser; a minimum of an f computed to
    # δf = γ_50|f| (3×3 eigen/inverse/determinant) is only defined to √(4δf/f''), f'' by central differences
    h = 1e-3
    curvature = (f(alpha + h) - 2 * f(alpha) + f(alpha - h)) / h**2
    search = 2 * (math.sqrt(eps(np.float64)) * abs(numeric) + xatol / 3)
    assert_within(alpha, numeric, search + math.sqrt(4 * gamma(50) * abs(f(alpha)) / curvature), "α* vs numeric")
    # the reference values are quoted to 4 and 2 decimals: half a unit in the last digit
    assert_within(alpha, 0.4042, 0.5e-4, "α* quoted")
    assert_within(f(alpha), 44.08, 0.5e-2, "f(α*) quoted")
    assert f(alpha) > d * (d + 1 + s2)  # softmax pays more than linear attention's d(d+1+σ²)/L


def general_valley_scale(lam, task_variance, noise_variance):
    """α* = √s, s the smaller root of (d+2)(trΛ+2σ²/τ²)s² − (d+4)(trΛ+σ²/τ²)s + (trΛ+σ²/τ²) = 0
    (docs/theory.md#valley-optimum, general Λ and τ²), and f(α*) from the closed form on the valley
    f = τ²(1−2s)^{−d/2}[(trΛ+σ²/τ²)/s + trΛ/(1−2s)]."""
    d, tr, r = lam.shape[0], float(np.trace(lam)), noise_variance / task_variance
    a, b, c = (d + 2) * (tr + 2 * r), -(d + 4) * (tr + r), tr + r
    s = (-b - math.sqrt(b * b - 4 * a * c)) / (2 * a)  # the smaller root (a > 0)
    f = task_variance * (1 - 2 * s) ** (-d / 2) * ((tr + r) / s + tr / (1 - 2 * s))
    return math.sqrt(s), f


@pytest.mark.parametrize("lam, tau2, sigma2", [(LAM, 0.2, 0.1), (np.diag([0.5, 1.0, 2.0]), 3.0, 0.25), (np.eye(3), 1.0, 0.25)],
                         ids=["toeplitz", "diagonal", "isotropic"])
def test_valley_optimum_is_the_general_quadratic_root(lam, tau2, sigma2):
    alpha_root, f_root = general_valley_scale(lam, tau2, sigma2)
    f = lambda a: valley_correction(a, lam, tau2, sigma2)  # noqa: E731
    # valley_correction on the valley is the closed form (a 3×3 eigen/inverse/determinant: γ_50 relative)
    assert_within(f(alpha_root), f_root, gamma(50) * abs(f_root), "f(α*) closed form")
    alpha, f_min = valley_optimum(lam, tau2, sigma2)
    # Brent stops within 2(√eps·α + xatol/3) of the minimiser of the computed f, itself defined to √(4δf/f'')
    h = 1e-3
    curvature = (f(alpha_root + h) - 2 * f(alpha_root) + f(alpha_root - h)) / h**2
    search = 2 * (math.sqrt(eps(np.float64)) * alpha_root + 1e-10 / 3)
    tol = search + math.sqrt(4 * gamma(50) * abs(f_root) / curvature)
    assert_within(alpha, alpha_root, tol, "α* vs quadratic root")
    # f is flat at its minimum: f(α̂) − f(α*) ≤ ½ f''·(α̂ − α*)², plus the rounding of f
    assert_within(f_min, f_root, 0.5 * curvature * tol**2 + gamma(50) * abs(f_root), "f(α*)")
    if np.array_equal(lam, np.eye(3)) and tau2 == 1.0:  # trΛ = d: the Λ = I quadratic of valley_optimal_scale
        assert_within(alpha_root, valley_optimal_scale(3, sigma2), gamma(20) * alpha_root, "Λ = I root")


@pytest.mark.slow
def test_correction_scales_with_the_task_variance_by_monte_carlo():
    """τ² ≠ 1: L·(R_L − R∞) → τ²·F(v, A; σ²/τ²) = f(α) on the valley vA = Λ⁻¹ (docs/theory.md#valley-optimum)."""
    tau2, sigma2 = 0.1, 0.3  # σ²/τ² = 3: the noise ratio, not σ², sets the correction
    alpha, _ = valley_optimum(LAM, tau2, sigma2)
    v, A_valley = 1.0 / alpha, alpha * np.linalg.inv(LAM)
    want = valley_correction(alpha, LAM, tau2, sigma2)
    assert_within(want, tau2 * reduced_finite_prompt_correction(v, A_valley, LAM, sigma2 / tau2),
                  gamma(50) * abs(want), "valley_correction = τ²F(σ²/τ²)")
    L = 200
    estimate, se = scaled_excess_risk(v, A_valley, LAM, sigma2, L=L, n=30_000, task_variance=tau2)
    # Monte Carlo error plus the O(1/L) remainder, as in test_correction_matches_monte_carlo
    tol = mc_tolerance(se) + 20 * abs(want) / L
    assert_within(estimate, want, tol, "L·(R_L − R∞) at τ² = 0.1")
    # the check tells the τ² scaling from its plausible mistakes: F(σ²/τ²) unscaled, or τ²F(σ²)
    for wrong in (reduced_finite_prompt_correction(v, A_valley, LAM, sigma2 / tau2),
                  tau2 * reduced_finite_prompt_correction(v, A_valley, LAM, sigma2)):
        assert abs(estimate - wrong) > tol
