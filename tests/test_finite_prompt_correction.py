"""Finite-L correction of the reduced softmax model: L·(R_L − R∞) → F(v, A) (docs/theory.md#finite-prompt-correction,
#valley-optimum)."""
import math

import numpy as np
import pytest
import torch
from scipy import optimize
from tolerance import assert_within, eps, gamma, mc_tolerance

from largeprompt.icl import reduced_finite_prompt_correction, valley_optimal_scale

LAM = np.array([[1.0, 0.3, 0.0], [0.3, 1.0, 0.3], [0.0, 0.3, 1.0]])
A = np.array([[0.3, 0.05, 0.0], [-0.05, 0.25, 0.02], [0.04, 0.0, 0.35]])  # non-symmetric, ‖A‖ < 1/2


def scaled_excess_risk(v, A, lam, noise_variance, L, n, seed=0, block=10_000):
    """Monte Carlo of L·(R_L − R∞) with common random numbers; y_q is averaged out exactly.

    (ŷ_L − y_q)² − (ŷ_∞ − y_q)² = (ŷ_L − ŷ_∞)(ŷ_L + ŷ_∞ − 2y_q), and E[y_q | x_q, β] = βᵀx_q.
    """
    gen = torch.Generator().manual_seed(seed)
    d = lam.shape[0]
    chol, At, lam_t = torch.linalg.cholesky(torch.tensor(lam)), torch.tensor(A), torch.tensor(lam)
    values = []
    for start in range(0, n, block):
        b = min(block, n - start)
        xq = torch.randn(b, d, generator=gen, dtype=torch.float64) @ chol.T  # [b, d]
        beta = torch.randn(b, d, generator=gen, dtype=torch.float64)  # τ² = 1
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
