"""Leading coefficients A(c) = lim L·E err² of the random-query sweep (docs/theory.md#random-query-rate,
docs/theory.md#jacobians): closed forms against the project's own fixed-query constants averaged over Monte Carlo
queries (5 standard errors from the sample sd, tolerance.MC_Z), the quadrature against itself refined, and one
end-to-end check against the sweep's own error code."""
import math

import numpy as np
import pytest
import torch

from largeprompt.core.seeding import stream_rng
from largeprompt.maths.concentration import repetition_block_errors, sweep_measure, tilt_scales
from largeprompt.maths.fluctuations import asymptotic_covariance, random_query_mean_trace_c
from largeprompt.maths.gradients import gaussian_jacobian_constants
from largeprompt.maths.leading_constants import (
    METRICS,
    coordinate_functions,
    gaussian_leading_coefficient,
    leading_coefficient,
    product_coefficient,
    query_averages,
    query_rule,
)
from largeprompt.maths.measures import make_measure
from tolerance import assert_within, eps, mc_tolerance, rounding_tolerance

F64 = torch.float64
C_VALUES = {"gaussian": (0.05, 0.1, 0.2), "rademacher": (0.25, 1.0, 4.0), "uniform": (0.25, 1.0, 4.0)}


def test_gaussian_output_constant_is_mean_trace_c():
    """A_output(c) for Gaussian tokens is random_query_mean_trace_c(c, σ² = c, D), to rounding (a dozen operations)."""
    for dim in (1, 2, 3, 4):
        for c in (0.0, 0.01, 0.1, 0.25, 0.4, 0.49):
            expected = float(random_query_mean_trace_c(c, c, dim))
            assert_within(leading_coefficient("gaussian", "output", c, dim), expected,
                          rounding_tolerance(16, expected), f"D = {dim}, c = {c}")


def test_gaussian_is_infinite_from_one_half():
    """Gaussian tokens: the weight e^{c‖z_q‖²} is not integrable for c ≥ 1/2, so A(c) is NaN; bounded tokens stay finite."""
    for metric in METRICS:
        for c in (0.5, 0.75, 4.0):
            assert math.isnan(leading_coefficient("gaussian", metric, c, 2))
            for name in ("rademacher", "uniform"):
                assert 0.0 < leading_coefficient(name, metric, c, 2) < math.inf
        assert math.isfinite(leading_coefficient("gaussian", metric, 0.499, 2))
    with pytest.raises(ValueError, match="metric"):
        leading_coefficient("gaussian", "grad_W", 0.1, 2)
    with pytest.raises(ValueError, match="token measure"):
        leading_coefficient("laplace", "output", 0.1, 2)


def test_gaussian_closed_forms_equal_the_product_route():
    """The χ² closed forms (output, grad_U, grad_V) equal the per-coordinate product formulas for N(0, c) coordinates,
    D = 1…4, c < 1/2. The trapezoidal rule on e^{−(1−2c)t²/2}·poly(t) is exact to rounding at this step
    (error ~e^{−2π²/(h²(1−2c))}); the sums have ~10³ terms, so 10⁴·eps relative."""
    for c in (0.05, 0.2, 0.35):
        avg = query_averages("gaussian", c)
        for dim in (1, 2, 3, 4):
            for metric in METRICS:
                closed = gaussian_leading_coefficient(metric, c, dim)
                assert_within(product_coefficient(avg, metric, dim), closed, 1e4 * eps(F64) * closed, f"{metric} D={dim} c={c}")


def test_coordinate_functions_match_project_measures():
    """Per-coordinate ρ₁ and e = E_{μ_{2a}}(z − k'(a))² from the atoms (Rademacher exact, uniform Gauss–Legendre) equal
    K(2a) − 2K(a) and ∇²K(2a) + Δ² of largeprompt.maths.measures in D = 1. Tolerance 1e-10·(1 + |value|): far below
    the module's 1e-8 target, far above either side's error (Langevin closed forms ~1e-11,
    docs/theory.md#rademacher-and-uniform-limits)."""
    t = np.linspace(-8.0, 8.0, 161)
    for name in ("rademacher", "uniform"):
        measure = make_measure(name, 1)
        for c in (0.25, 4.0):
            a = torch.from_numpy(math.sqrt(c) * t)[:, None]
            log_rho, e, _ = coordinate_functions(name, c, t)
            ref_log_rho = (measure.cgf(2 * a) - 2 * measure.cgf(a)).numpy()
            delta = (measure.cgf_grad(2 * a) - measure.cgf_grad(a))[:, 0]
            ref_e = (measure.cgf_hess(2 * a)[:, 0, 0] + delta**2).numpy()
            assert_within(log_rho, ref_log_rho, 1e-10 * (1 + np.abs(ref_log_rho)), f"{name} log ρ₁, c = {c}")
            assert_within(e, ref_e, 1e-10 * (1 + np.abs(ref_e)), f"{name} e, c = {c}")


def test_product_formula_equals_tensor_product_rule():
    """The factorised sums of products equal the tensor-product rule over z_q evaluated point by point, with the
    project's Rademacher CGF for ρ, m_a, H and exact enumeration of the 2^D atoms for E_{μ_{2a}}, D = 2 and 3.
    The rule is coarse on purpose (the identity holds for any weights); ~10³·D terms per sum, so 10⁴·eps relative."""
    c = 1.0
    t1 = np.linspace(-6.0, 6.0, 25)
    w1 = np.exp(-0.5 * t1**2) * (t1[1] - t1[0]) / math.sqrt(2 * math.pi)
    avg = query_averages("rademacher", c, rule=(t1, w1))
    for dim in (2, 3):
        measure = make_measure("rademacher", dim)
        grids = np.meshgrid(*([t1] * dim), indexing="ij")
        g = torch.from_numpy(np.stack([x.ravel() for x in grids], -1))  # [n^D, D]
        w = torch.from_numpy(np.prod([x.ravel() for x in np.meshgrid(*([w1] * dim), indexing="ij")], 0))  # [n^D]
        a = math.sqrt(c) * g
        rho = torch.exp(measure.cgf(2 * a) - 2 * measure.cgf(a))
        atoms = torch.tensor(np.array(np.meshgrid(*([[-1.0, 1.0]] * dim), indexing="ij")).reshape(dim, -1).T)  # [2^D, D]
        p_2a = torch.softmax(a @ (2 * atoms.T), -1)  # μ_{2a} on the atoms, [n^D, 2^D]
        y = atoms[None] - measure.cgf_grad(a)[:, None]  # [n^D, 2^D, D]
        gap = y[..., :, None] * y[..., None, :] - measure.cgf_hess(a)[:, None]
        fixed = {"output": torch.diagonal(asymptotic_covariance(a, measure, torch.eye(dim, dtype=F64)), 0, -2, -1).sum(-1),
                 "grad_U": rho * (g * g).sum(-1) * (p_2a * (gap * gap).sum((-2, -1))).sum(-1)}
        fixed["grad_V"] = dim * fixed["output"]
        for metric in METRICS:
            tensor = float((w * fixed[metric]).sum())
            assert_within(product_coefficient(avg, metric, dim), tensor, 1e4 * eps(F64) * tensor, f"{metric} D = {dim}")


def test_quadrature_converges_by_doubling():
    """Halving the trapezoidal step (twice the query nodes) and doubling / halving the Gauss–Legendre nodes moves A(c)
    by less than 1e-10 relative at c up to 4 (the target is 1e-8), D = 2 and 4."""
    for name in ("rademacher", "uniform"):
        for c in (0.1, 1.0, 4.0):
            base = query_averages(name, c)
            variants = [query_averages(name, c, rule=query_rule(c, refine=2))]
            if name == "uniform":
                variants += [query_averages(name, c, gl_nodes=100), query_averages(name, c, gl_nodes=400)]
            for dim in (2, 4):
                for metric in METRICS:
                    ref = product_coefficient(base, metric, dim)
                    assert ref == leading_coefficient(name, metric, c, dim)
                    for other in variants:
                        assert_within(product_coefficient(other, metric, dim), ref, 1e-10 * ref, f"{name} {metric} c={c}")


def _stratified_queries(n, rng):
    """n queries with the law N(0, I_2), ‖z_q‖² stratified: the i-th has ‖z_q‖² = −2 ln(1 − (i + Uᵢ)/n) (the χ²₂
    quantile of a uniform in its n-th of [0, 1)) and a uniform angle. The mean over them is unbiased for E_{z_q}, and
    the sample sd over repetitions overstates its standard error (stratification only removes variance)."""
    u = (np.arange(n) + rng.random(n)) / n
    radius, angle = np.sqrt(-2.0 * np.log1p(-u)), 2.0 * np.pi * rng.random(n)
    return torch.from_numpy(radius[:, None] * np.stack([np.cos(angle), np.sin(angle)], -1))


def _tilted_tokens(name, tilt, n, rng):
    """n i.i.d. tokens [N, n, D] of the tilted law μ_b for tilts b [N, D], coordinate by coordinate by inversion:
    Rademacher +1 with probability (1 + tanh b)/2; uniform on [−s, s], s = √3, density ∝ e^{bx}:
    x = ±(s + log1p((1 − U) expm1(−2|b|s))/|b|), the sign of b (+ at b = 0)."""
    b = tilt[:, None].expand(-1, n, -1).numpy()
    u = rng.random(b.shape)
    if name == "rademacher":
        return torch.from_numpy(np.where(u < 0.5 * (1.0 + np.tanh(b)), 1.0, -1.0))
    s, ab = math.sqrt(3.0), np.maximum(np.abs(b), 1e-100)
    return torch.from_numpy(np.where(b < 0, -1.0, 1.0) * (s + np.log1p((1.0 - u) * np.expm1(-2.0 * ab * s)) / ab))


def _fixed_query_constants(name, c, g, rng, tokens_per_query=16):
    """Per-query limits of L·E[err² | z_q] [N] for (output, grad_U, grad_V) at queries g [N, D]: tr C by
    asymptotic_covariance; grad_U by gaussian_jacobian_constants (Gaussian) or, for bounded tokens, by an unbiased
    Monte Carlo over tokens z ~ μ_{2a} (:func:`_tilted_tokens`): ρ(a) ‖g‖² mean ‖(z − ∇K(a))(z − ∇K(a))ᵀ − ∇²K(a)‖²,
    with ρ, ∇K, ∇²K from largeprompt.maths.measures."""
    dim = g.shape[-1]
    sigma_sq, u = tilt_scales(name, c)
    measure, eye = sweep_measure(name, dim, sigma_sq, F64, "cpu"), torch.eye(dim, dtype=F64)
    a = u * g
    trace_c = torch.diagonal(asymptotic_covariance(a, measure, eye), 0, -2, -1).sum(-1)
    if name == "gaussian":
        const_u = torch.func.vmap(lambda ai, gi: gaussian_jacobian_constants(ai, measure.cov, gi, eye)[0])(a, g)
    else:
        y = _tilted_tokens(name, 2 * a, tokens_per_query, rng) - measure.cgf_grad(a)[:, None]  # [N, M, D]
        gap = y[..., :, None] * y[..., None, :] - measure.cgf_hess(a)[:, None]
        rho = torch.exp(measure.cgf(2 * a) - 2 * measure.cgf(a))
        const_u = rho * (g * g).sum(-1) * (gap * gap).sum((-2, -1)).mean(-1)
    return {"output": trace_c, "grad_U": const_u, "grad_V": dim * trace_c}


@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform"])
def test_leading_coefficient_matches_query_monte_carlo(name):
    """A(c) at D = 2 equals the mean over 40 000 queries z_q ~ N(0, I) (stratified in ‖z_q‖², :func:`_stratified_queries`)
    of the fixed-query constant (each exact or unbiased) within 5 standard errors of that mean, the sd taken from the
    sample; the quadrature's 1e-10 is negligible beside it."""
    dim, n = 2, 40_000
    for k, c in enumerate(C_VALUES[name]):
        g = _stratified_queries(n, stream_rng(11, f"test/leading_constants/{name}/queries", k))
        consts = _fixed_query_constants(name, c, g, stream_rng(11, f"test/leading_constants/{name}/tokens", k))
        for metric, values in consts.items():
            emp, se = float(values.mean()), float(values.std() / math.sqrt(n))
            assert_within(emp, leading_coefficient(name, metric, c, dim), mc_tolerance(se), f"{name} {metric} c = {c}")


@pytest.mark.parametrize(("name", "c"), [("gaussian", 0.1), ("rademacher", 1.0)])
def test_sweep_errors_times_length_approach_leading_coefficient(name, c, monkeypatch):
    """End to end: L·mean err from repetition_block_errors at L = 2^12 over 4000 repetitions (query and prompt each)
    is A(c) within 5 standard errors (sample sd over repetitions) plus 10·A/L for the remainder of the limit. Its
    leading part is, relative to the fixed-query constant, ~ρ(a)²/L (the E[U_L²ε] term of the delta method): weighted
    by the constant, E e^{3c‖z_q‖²} = (1 − 6c)^{−1} = 2.5 for Gaussian tokens at c = 0.1, and ρ² ≤ 4^D = 16 for
    Rademacher (ρ ≤ 2^D). The allowance is below 0.15 s.e. here, so the check is in effect 5 s.e.

    The queries are stratified in ‖z_q‖² (:func:`_stratified_queries`): with i.i.d. queries the heavy tail of the
    fixed-query constant over queries (Gaussian: e^{c‖z_q‖²}) makes the sample mean fall below A more often than above
    while the sample sd understates the spread (over 10 other seeds at 2000 i.i.d. queries, one grad_U z-score was
    −4.8). With stratified queries, over 16 other seeds at 2000 repetitions every z-score lay in [−2.2, 1.9].
    The attention kernel is pinned (no tuning): kernels differ only by round-off."""
    monkeypatch.setenv("LARGEPROMPT_ATTENTION_KERNEL", "engine=torch")
    dim, L, reps = 2, 2**12, 4000
    query = _stratified_queries(reps, stream_rng(12, f"test/leading_constants/e2e/{name}/queries"))
    errors = repetition_block_errors(name, dim, [c], query, [L], stream_rng(12, f"test/leading_constants/e2e/{name}/prompts"), 4096)
    for metric, err in zip(("output", "grad_U", "grad_V"), errors[:3]):
        scaled = L * err[0, :, 0]  # [R]
        expected = leading_coefficient(name, metric, c, dim)
        se = float(scaled.std() / math.sqrt(reps))
        assert_within(float(scaled.mean()), expected, mc_tolerance(se) + 10.0 * expected / L, f"{name} {metric}")
