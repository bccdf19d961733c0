"""Fixed-query fluctuations: covariance, bias, moments and bounds (docs/theory.md#fixed-query-fluctuations,
#leading-bias, #fixed-query-bound) against Monte Carlo (float64, standard-error tolerances plus stated O(1/L)
remainders) and against each other (rounding bounds from eps)."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from largeprompt.core.seeding import stream_generator
from largeprompt.io.pipeline import Runtime
from largeprompt.maths.attention import streaming_tilted_moments
from largeprompt.maths.fluctuations import (
    asymptotic_covariance,
    gaussian_asymptotic_covariance,
    gaussian_fourth_moment,
    leading_bias,
    random_query_mean_trace_c,
)
from largeprompt.maths.measures import make_measure, toeplitz_covariance
from largeprompt.stages.simulate_fixed_query_bound import simulate_fixed_query_bound
from tolerance import assert_within, gamma, mc_tolerance

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


def _covariance_rounding(a, measure, cov, value, scale=1.0):
    """Rounding bound for ρ V[∇²K(2a) + ΔΔᵀ]Vᵀ (Gaussian N(m, S)), Δ = ∇K(2a) − ∇K(a), and for its pieces.

    ρ = e^{K(2a) − 2K(a)} has relative error γ_{2D+4} times the |·| sum of its exponent's terms,
    3(|a|ᵀ|m| + |a|ᵀ|S||a|); Δ is formed with cancellation from terms of size Δ_abs = 2|m| + 3|S||a|, so the
    |·| evaluation of the bracket is |S| + Δ_abs Δ_absᵀ, then two products with V (inner size D).
    Returns (bound on the matrix, ρ-relative part, Δ_abs) for callers that need the pieces.
    """
    dim = a.shape[-1]
    m = measure.cgf_grad(torch.zeros_like(a))
    a_abs, s_abs = a.abs(), cov.abs()
    rho_rel = gamma(2 * dim + 4) * float(3 * (a_abs @ m.abs() + a_abs @ s_abs @ a_abs))
    delta_abs = 2 * m.abs() + s_abs @ a_abs * 3
    rho = float(torch.exp(measure.cgf(2 * a) - 2 * measure.cgf(a)))
    inner_abs = s_abs + torch.outer(delta_abs, delta_abs)
    matrix = scale * rho * (rho_rel + gamma(2 * dim + 6)) * (value.abs() @ inner_abs @ value.abs().T)
    return matrix, rho_rel, delta_abs


def test_general_covariance_reduces_to_gaussian_formula():
    measure, cov, a, value = _gaussian_setup(1.3)
    tol, _, _ = _covariance_rounding(a, measure, cov, value)
    assert_within(asymptotic_covariance(a, measure, value), gaussian_asymptotic_covariance(a, cov, value), 2 * tol, "C")


@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform"])
def test_delta_method_covariance_matches_monte_carlo(name):
    """L·Cov(T_L) → C: entrywise within 5 Monte Carlo SE plus an O(1/L) finite-L allowance of 3·max|C|/L."""
    if name == "gaussian":
        measure, cov, a, value = _gaussian_setup(0.5)
    else:
        measure = make_measure(name, 2)
        a = torch.tensor([0.6, -0.4], dtype=F64)
        value = torch.tensor([[1.0, 0.5], [-0.3, 2.0]], dtype=F64)
    L, R = 1024, 6000
    err = _finite_outputs(measure, a, value, L, R, f"test/delta_method_covariance/{name}") * math.sqrt(L)  # [R, Dout]
    centred = err - err.mean(0)
    prods = centred.unsqueeze(-1) * centred.unsqueeze(-2)  # [R, Dout, Dout]
    emp, se = prods.mean(0), prods.std(0) / math.sqrt(R)
    c_theory = asymptotic_covariance(a, measure, value)
    slack = mc_tolerance(se) + 3.0 * c_theory.abs().max() / L
    assert_within(emp, c_theory, slack, "L·Cov(T_L)")
    # Power: the test tells C from the naive i.i.d. covariance V ∇²K(a) Vᵀ (no e^κ factor).
    naive = value @ measure.cgf_hess(a) @ value.T
    assert torch.any((emp - naive).abs() > slack)


def test_delta_method_bias_matches_monte_carlo():
    """E T_L − T_∞ = −(e^κ/L) V S a + O(L⁻²): mean error within 5 SE of the leading bias, plus 5% of it for the
    O(L⁻²) remainder at L = 256."""
    measure, cov, a, value = _gaussian_setup(1.0)
    L, R = 256, 30000
    err = _finite_outputs(measure, a, value, L, R, "test/leading_bias")  # [R, Dout]
    emp, se = err.mean(0), err.std(0) / math.sqrt(R)
    bias = leading_bias(a, measure, value, L)
    # e^{K(2a) − 2K(a)} against e^{aᵀSa} = e (aᵀSa = 1 up to rounding of a's scaling), then V times Δ = S a
    _, rho_rel, delta_abs = _covariance_rounding(a, measure, cov, value)
    bias_tol = math.exp(1.0) / L * (rho_rel + gamma(2 * 2 + 8)) * (value.abs() @ delta_abs)
    assert_within(bias, -(math.exp(1.0) / L) * (value @ (cov @ a)), 2 * bias_tol, "leading bias")
    assert_within(emp, bias, mc_tolerance(se) + 0.05 * bias.abs(), "E T_L − T∞")
    assert torch.any(emp.abs() > 4 * se), "bias not detected: the test would not fail without it"


def test_fourth_moment_matches_monte_carlo():
    """c₄ = E‖ξ‖⁴/D⁴ (docs/theory.md#fixed-query-bound), direct Monte Carlo of w⁴‖V(z − m_a)‖⁴ / M(a)⁴."""
    measure, cov, a, value = _gaussian_setup(0.2)
    gen = stream_generator(7, "test/c4", 0)
    z = measure.sample(400_000, gen)  # [N, D]
    w = torch.exp(z @ a - measure.cgf(a))  # w / D
    xi = w.unsqueeze(-1) * ((z - measure.cgf_grad(a)) @ value.T)  # ξ / D, [N, Dout]
    x = (xi * xi).sum(-1) ** 2
    emp, se = x.mean(), x.std() / math.sqrt(len(x))
    assert_within(emp, gaussian_fourth_moment(a, cov, value), mc_tolerance(se), "c₄")


def test_random_query_mean_trace_c():
    """E_{z_q} tr C over Gaussian queries (docs/theory.md#random-query-rate): closed form against Monte Carlo."""
    dim, c, sigma_sq = 2, 0.1, 0.1
    gen = stream_generator(7, "test/trc", 0)
    g = torch.randn(400_000, dim, generator=gen, dtype=F64)
    cov = sigma_sq * torch.eye(dim, dtype=F64)
    tr = torch.diagonal(gaussian_asymptotic_covariance(g * math.sqrt(c / sigma_sq), cov, torch.eye(dim, dtype=F64)), dim1=-2, dim2=-1).sum(-1)
    emp, se = float(tr.mean()), float(tr.std() / math.sqrt(len(tr)))
    assert_within(emp, float(random_query_mean_trace_c(c, sigma_sq, dim)), mc_tolerance(se), "E tr C")
    assert np.isnan(random_query_mean_trace_c(0.5, 1.0, dim))


def test_rigorous_bound_holds_at_its_confidence(tmp_path):
    """docs/theory.md#fixed-query-bound: P(‖T_L − T_∞‖ > B) ≤ δ on every cell, up to 4 binomial SE; the empirical
    quantile stays below B."""
    fixed_query = dict(dim=2, rho=0.5, kappas=[0.25, 2.25], log2_min_prompt_length=4, log2_max_prompt_length=10,
                       n_repetitions=3000, repetition_block=1000, deltas=[0.1, 0.01], n_limit_law_draws=20000,
                       chunk_size=1024, ci_level=0.95)
    params = dict(seed=11, dtype="float64", fixed_query_bound=fixed_query)
    out = tmp_path / "fq.parquet"
    simulate_fixed_query_bound({}, {"quantiles": str(out)}, params, runtime=Runtime(device="cpu"))
    frame = pd.read_parquet(out)
    n = fixed_query["n_repetitions"]
    slack = mc_tolerance(np.sqrt(frame["delta"] * (1 - frame["delta"]) / n), z=4)
    assert (frame["exceed_fraction"] <= frame["delta"] + slack).all()
    assert frame["bound_holds"].all()
    assert (frame["empirical_quantile"] <= frame["sharp_bound"]).all()
    # The Gaussian limit law describes the quantile once L e^{-κ} is large: within 15% at κ = 0.25, L = 2^10
    # (a modelling margin for the finite-L departure, not a floating-point tolerance).
    last = frame[(frame["kappa"] == 0.25) & (frame["prompt_length"] == 1024)]
    assert np.allclose(last["empirical_quantile"], last["delta_method_quantile"], rtol=0.15)
    # The figure's columns: the δ-method RMS √(tr C/L), e^κ, and quantiles divided by the RMS (a few roundings each).
    rms = np.sqrt(frame["trace_c"] / frame["prompt_length"])
    assert_within(frame["delta_method_rms"], rms, gamma(3) * rms, "δ-method RMS")
    assert_within(frame["unit_effective_prompt_length"], np.exp(frame["kappa"]), gamma(2) * np.exp(frame["kappa"]), "e^κ")
    for name, column in (("normalised_quantile", "empirical_quantile"), ("normalised_quantile_ci_low", "quantile_ci_low"),
                         ("normalised_quantile_ci_high", "quantile_ci_high"), ("normalised_delta_method_quantile", "delta_method_quantile")):
        assert_within(frame[name] * frame["delta_method_rms"], frame[column], gamma(4) * frame[column], name)
    law = frame.groupby(["kappa", "delta"])["normalised_delta_method_quantile"]  # ‖N(0, C)‖-quantile / √tr C: no L (5 roundings each)
    assert_within(law.max() - law.min(), 0.0, gamma(10) * law.max(), "δ-method quantile / RMS across L")


def test_fixed_query_errors_streamed_whitened_are_the_errors_of_the_drawn_prompts():
    """FixedQuery.block_errors streams g ~ N(0, I) with the tilt Cᵀa and maps the tilted mean by C: the errors of the
    prompts z = C g drawn from the same stream (the measure's own sampler), to round-off (a few roundings per token's
    score, and sums of L terms)."""
    from largeprompt.core.seeding import stream_rng
    from largeprompt.maths.attention import tilted_moments
    from largeprompt.maths.fixed_query import FixedQuery

    setup = FixedQuery(2.25, 3, 0.5, F64, "cpu")
    lengths, reps = [16, 100, 1000], 40
    errors = setup.block_errors(5, 0, reps, lengths, chunk_size=300)
    gen = stream_rng(5, "fixed_query_bound/prompts", setup.stream_index(), 0)
    prompts = torch.cat([setup.measure.sample((reps, min(300, 1000 - s)), gen) for s in range(0, 1000, 300)], dim=1)
    mean, _ = tilted_moments(setup.tilt.expand(reps, 3), prompts, prefix_lengths=lengths)  # [P, R, D]
    direct = torch.linalg.vector_norm(mean - setup.limit, dim=-1).T.numpy()
    scale = prompts.abs().max().item() * (1 + setup.tilt.abs().sum().item() * prompts.abs().max().item())
    assert_within(errors, direct, gamma(4 * 1000) * scale, "whitened against drawn prompts")
