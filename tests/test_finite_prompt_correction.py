"""SPEC F6 finite-L correction of the reduced softmax model: L·(R_L − R∞) → F(v, A) (THEORY §F(iv))."""
import math

import numpy as np
import pytest
import torch
from scipy import optimize

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


@pytest.mark.parametrize("v, lam", [(1.5, np.eye(3)), (2.0, LAM)], ids=["isotropic", "toeplitz"])
def test_correction_matches_monte_carlo(v, lam):
    F = reduced_finite_prompt_correction(v, A, lam, 0.25)
    estimate, se = scaled_excess_risk(v, A, lam, 0.25, L=200, n=100_000)
    # 4 standard errors, plus 10% for the O(1/L) remainder at L = 200
    assert abs(estimate - F) <= 4 * se + 0.1 * abs(F), (estimate, se, F)


def test_correction_is_infinite_beyond_the_critical_norm():
    assert math.isinf(reduced_finite_prompt_correction(1.0, 0.75 * np.eye(2), np.eye(2), 0.1))
    assert math.isfinite(reduced_finite_prompt_correction(1.0, 0.70 * np.eye(2), np.eye(2), 0.1))


def test_valley_optimal_scale_minimises_the_correction():
    """On the valley vA = I the best scale α* minimises f(α) = F(1/α, αI); SPEC: α* = 0.4042, f = 44.1 at d = 3, σ = 0.5."""
    d, s2 = 3, 0.25
    f = lambda alpha: reduced_finite_prompt_correction(1.0 / alpha, alpha * np.eye(d), np.eye(d), s2)  # noqa: E731
    numeric = optimize.minimize_scalar(f, bounds=(0.05, 0.7), method="bounded", options={"xatol": 1e-9}).x
    alpha = valley_optimal_scale(d, s2)
    assert alpha == pytest.approx(numeric, abs=1e-6)
    assert alpha == pytest.approx(0.4042, abs=1e-4)
    assert f(alpha) == pytest.approx(44.08, abs=0.01)
    assert f(alpha) > d * (d + 1 + s2)  # softmax pays more than linear attention's d(d+1+σ²)/L
