"""F2 covariance and bias, the THEORY §D moments and bounds, against Monte Carlo (float64, SE-derived tolerances)."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from largeprompt.attention import streaming_tilted_moments
from largeprompt.fluctuations import (
    asymptotic_covariance,
    gaussian_asymptotic_covariance,
    gaussian_fourth_moment,
    leading_bias,
    random_query_mean_trace_c,
)
from largeprompt.measures import make_measure, toeplitz_covariance
from largeprompt.seeding import stream_generator
from largeprompt.stages.bounds import simulate_fixed_query_bounds

F64 = torch.float64


def _gaussian_setup(kappa, dim=2, rho=0.5):
    cov = toeplitz_covariance(dim, rho)
    direction = torch.tensor([1.0, -0.7][:dim], dtype=F64)
    a = direction * math.sqrt(kappa / float(direction @ cov @ direction))  # aᵀSa = κ
    value = torch.tensor([[1.0, 0.5], [-0.3, 2.0]], dtype=F64)[:, :dim]
    return make_measure("gaussian", dim, cov=cov), cov, a, value


def _finite_outputs(measure, a, value, prompt_length, reps, stream):
    """T_L − T_∞ for ``reps`` independent prompts at one fixed tilt a: [R, Dout]."""
    gen = stream_generator(7, stream, 0)
    mean, _ = streaming_tilted_moments(a.expand(reps, a.shape[0]), measure, prompt_length, gen,
                                       chunk_size=prompt_length, prompt_batch_shape=(reps,))
    return (mean - measure.cgf_grad(a)) @ value.T


def test_general_covariance_reduces_to_gaussian_formula():
    measure, cov, a, value = _gaussian_setup(1.3)
    torch.testing.assert_close(asymptotic_covariance(a, measure, value), gaussian_asymptotic_covariance(a, cov, value))


@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform"])
def test_f2_covariance_matches_monte_carlo(name):
    """L·Cov(T_L) → C (SPEC F2): entrywise within 5 Monte Carlo SE plus the O(1/L) finite-L correction."""
    if name == "gaussian":
        measure, cov, a, value = _gaussian_setup(0.5)
    else:
        measure = make_measure(name, 2)
        a = torch.tensor([0.6, -0.4], dtype=F64)
        value = torch.tensor([[1.0, 0.5], [-0.3, 2.0]], dtype=F64)
    L, R = 1024, 6000
    err = _finite_outputs(measure, a, value, L, R, f"test/f2cov/{name}") * math.sqrt(L)  # [R, Dout]
    centred = err - err.mean(0)
    prods = centred.unsqueeze(-1) * centred.unsqueeze(-2)  # [R, Dout, Dout]
    emp, se = prods.mean(0), prods.std(0) / math.sqrt(R)
    c_theory = asymptotic_covariance(a, measure, value)
    slack = 5 * se + 3.0 * c_theory.abs().max() / L
    assert torch.all((emp - c_theory).abs() <= slack), (emp, c_theory, se)
    # Power: the test tells C from the naive i.i.d. covariance V ∇²K(a) Vᵀ (no e^κ factor).
    naive = value @ measure.cgf_hess(a) @ value.T
    assert torch.any((emp - naive).abs() > slack)


def test_f2_bias_matches_monte_carlo():
    """E T_L − T_∞ = −(e^κ/L) V S a + O(L⁻²) (SPEC F2): mean error within 5 SE of the leading bias."""
    measure, cov, a, value = _gaussian_setup(1.0)
    L, R = 256, 30000
    err = _finite_outputs(measure, a, value, L, R, "test/f2bias")  # [R, Dout]
    emp, se = err.mean(0), err.std(0) / math.sqrt(R)
    bias = leading_bias(a, measure, value, L)
    torch.testing.assert_close(bias, -(math.exp(1.0) / L) * (value @ (cov @ a)))
    assert torch.all((emp - bias).abs() <= 5 * se + 0.05 * bias.abs()), (emp, bias, se)
    assert torch.any(emp.abs() > 4 * se), "bias not detected: the test would not fail without it"


def test_fourth_moment_matches_monte_carlo():
    """c₄ = E‖ξ‖⁴/D⁴ (THEORY §D), direct Monte Carlo of w⁴‖V(z − m_a)‖⁴ / M(a)⁴."""
    measure, cov, a, value = _gaussian_setup(0.2)
    gen = stream_generator(7, "test/c4", 0)
    z = measure.sample(400_000, gen)  # [N, D]
    w = torch.exp(z @ a - measure.cgf(a))  # w / D
    xi = w.unsqueeze(-1) * ((z - measure.cgf_grad(a)) @ value.T)  # ξ / D, [N, Dout]
    x = (xi * xi).sum(-1) ** 2
    emp, se = x.mean(), x.std() / math.sqrt(len(x))
    assert abs(float(emp - gaussian_fourth_moment(a, cov, value))) <= 5 * float(se)


def test_random_query_mean_trace_c():
    """E_{z_q} tr C in the F4 setting: closed form against an average over Gaussian queries."""
    dim, c, sigma_sq = 2, 0.1, 0.1
    gen = stream_generator(7, "test/trc", 0)
    g = torch.randn(400_000, dim, generator=gen, dtype=F64)
    cov = sigma_sq * torch.eye(dim, dtype=F64)
    tr = torch.diagonal(gaussian_asymptotic_covariance(g * math.sqrt(c / sigma_sq), cov, torch.eye(dim, dtype=F64)), dim1=-2, dim2=-1).sum(-1)
    emp, se = float(tr.mean()), float(tr.std() / math.sqrt(len(tr)))
    assert abs(emp - float(random_query_mean_trace_c(c, sigma_sq, dim))) <= 5 * se
    assert np.isnan(random_query_mean_trace_c(0.5, 1.0, dim))


def test_rigorous_bound_holds_at_its_confidence(tmp_path):
    """THEORY §D: P(‖T_L − T_∞‖ > B) ≤ δ on every cell, up to 4 binomial SE; the empirical quantile stays below B."""
    params = dict(seed=11, dtype="float64", device="cpu", dim=2, rho=0.5, kappas=[0.25, 2.25],
                  log2_min_prompt_length=4, log2_max_prompt_length=10, n_repetitions=3000, repetition_block=1000,
                  chunk_size=1024, deltas=[0.1, 0.01], ci_level=0.95, n_f2_draws=20000)
    out = tmp_path / "fq.parquet"
    simulate_fixed_query_bounds({}, {"result": str(out)}, params)
    frame = pd.read_parquet(out)
    n = params["n_repetitions"]
    slack = 4 * np.sqrt(frame["delta"] * (1 - frame["delta"]) / n)
    assert (frame["exceed_fraction"] <= frame["delta"] + slack).all()
    assert frame["bound_holds"].all()
    assert (frame["empirical_quantile"] <= frame["sharp_bound"]).all()
    # F2 describes the quantile once L e^{-κ} is large: within 15% at κ = 0.25, L = 2^10.
    last = frame[(frame["kappa"] == 0.25) & (frame["prompt_length"] == 1024)]
    assert np.allclose(last["empirical_quantile"], last["f2_quantile"], rtol=0.15)
