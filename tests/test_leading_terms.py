"""Leading-term fits (largeprompt.maths.leading_terms, docs/experiments.md#claims): the fit recovers exact
coefficients, and R1's pooled coefficient of a real self-normalised estimator is its delta-method value."""
import numpy as np
import pytest

from largeprompt.maths.leading_terms import coefficient_fit, coefficient_with_bootstrap, in_ray_regime, ray_coefficient
from tolerance import rounding_tolerance


@pytest.mark.parametrize("q", [1.0, 0.5])
def test_coefficient_fit_recovers_exact_terms(q):
    lengths = np.array([100.0, 316.0, 1000.0, 3162.0, 10000.0])
    means = np.stack([(a + b * lengths ** -q) / lengths for a, b in ((1.5, 20.0), (0.3, -4.0))])  # [2, P]
    coef = coefficient_fit(lengths, means, q)
    design = np.stack([np.ones_like(lengths), lengths**-q], axis=-1)
    # least squares loses cond(design) times the rounding of forming L·means and the solve (about 10·P operations)
    tol = rounding_tolerance(10 * len(lengths), np.linalg.cond(design) * 20.0, np.float64)
    np.testing.assert_allclose(coef, [[1.5, 20.0], [0.3, -4.0]], atol=tol)


def test_bootstrap_interval_covers_a_known_coefficient():
    """err_L = √A·S_L/L + b/L with S_L a nested Gaussian random walk: E err² = A/L + b²/L² exactly."""
    rng = np.random.default_rng(0)
    lengths = np.array([64, 256, 1024, 4096])
    steps = rng.standard_normal((4000, len(lengths))) * np.sqrt(np.diff(lengths, prepend=0))
    errors = (np.sqrt(2.0) * np.cumsum(steps, axis=1) / lengths + 3.0 / lengths) ** 2  # [R, P]
    idx = rng.integers(0, errors.shape[0], size=(400, errors.shape[0]))
    fit = coefficient_with_bootstrap(lengths, errors, np.stack([errors[i].mean(0) for i in idx]))
    assert abs(fit["estimate"] - 2.0) < 4 * fit["se"] and fit["se"] < 0.1
    assert fit["ci_low"] < fit["estimate"] < fit["ci_high"]


def test_ray_regime_needs_the_doubly_tilted_tokens():
    assert in_ray_regime(np.log([1.0, 3.0, 4.0]), 100.0).tolist() == [True, True, False]


def test_ray_coefficient_of_a_self_normalised_estimator_is_one():
    """One-dimensional N(0, 1) tokens, tilt a: T_L = Σ e^{a z} z / Σ e^{a z} → a with C = e^{a²}(1 + a²); the pooled
    L·E err²/C fitted as A + B/L over L ≥ 100 is 1 within its bootstrap error, and points outside the regime are
    left out."""
    rng = np.random.default_rng(1)
    tilts = np.array([0.0, 0.4, 0.8, 2.5])
    lengths = [100, 400, 1600]
    n_prompts = 3000
    z = rng.standard_normal((n_prompts, lengths[-1]))
    sq = np.empty((n_prompts, len(lengths), len(tilts)))
    for j, a in enumerate(tilts):
        w = np.exp(a * z)
        for k, L in enumerate(lengths):
            sq[:, k, j] = ((w[:, :L] * z[:, :L]).sum(1) / w[:, :L].sum(1) - a) ** 2
    fit = ray_coefficient(sq, lengths, np.exp(tilts**2) * (1 + tilts**2), tilts**2, 100, rng)
    assert fit["n_points"] == 3 and fit["max_log_rho"] == pytest.approx(0.64)
    assert abs(fit["estimate"] - 1.0) < 4 * fit["se"] and fit["se"] < 0.05


def test_exponent_fit_recovers_exponent_and_correction():
    """Gaps A_s·L^−p(1 + b/L) exactly: the profiled fit returns p and b (b to the refined grid's step), and fixing
    b = 0 gives a biased exponent."""
    from largeprompt.maths.leading_terms import exponent_fit
    lengths = np.repeat([20, 40, 80, 160, 320, 640], 3)
    seeds = np.tile([0, 1, 2], 6)
    gaps = np.array([1.0, 2.0, 0.5])[seeds] * lengths**-1.0 * (1 + 12.0 / lengths)
    fit = exponent_fit(lengths, gaps, seeds)
    assert fit["exponent"] == pytest.approx(1.0, abs=2e-3) and fit["correction"] == pytest.approx(12.0, rel=0.05)
    assert exponent_fit(lengths, gaps, seeds, correction=False)["exponent"] > 1.05
