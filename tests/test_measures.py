"""Token measures: CGF gradients and Hessians against independent computations (docs/theory.md#gaussian-limit,
#rademacher-and-uniform-limits).

Closed forms are held to rounding bounds from eps and the condition of each formula (the cancellation in
coth x − 1/x and 1/x² − 1/sinh²x near the series cutoff), plus the truncation of the series below it;
quadrature to its own epsrel/epsabs; Monte Carlo to standard errors.
"""
import itertools
import math

import mpmath
import numpy as np
import pytest
import torch
from scipy import integrate

from largeprompt.maths.measures import Gaussian, Rademacher, Uniform, langevin, langevin_derivative, log_sinhc, make_measure, toeplitz_covariance
from tolerance import (
    assert_within,
    eps,
    gamma,
    matmul_tolerance,
    mc_tolerance,
    quad_tolerance,
    rounding_tolerance,
    tilted_moments_tolerance,
)

SERIES_CUTOFF = 1e-2  # |x| below which largeprompt.maths.measures switches to the Taylor series


def langevin_tolerances(x):
    """Float64 error bounds for (𝓛(x), 𝓛'(x), log(sinh x/x)) as computed by largeprompt.maths.measures [same shape as x].

    Closed forms (|x| ≥ cutoff), with e = e^{−2|x|}: γ_6 times the |·| evaluation, where the rounding of e is
    amplified by e/(1 − e) in 1 − e:
      𝓛 = coth x − 1/x:                    γ_6 (|coth x| + 1/|x|)
      𝓛' = 1/x² − 4e/(1 − e)²:             γ_6 (1/x² + 4e/(1 − e)² (1 + 2e/(1 − e)))
      log sinhc = |x| + log1p(−e) − log 2 − log|x|:  γ_6 (|x| + |log1p(−e)| + log 2 + |log|x|| + e/(1 − e))
    Series (|x| < cutoff): rounding γ_6 times the sum of |terms|, plus the first omitted term of the
    alternating series: |x|⁷/4725, |x|⁶/675, |x|⁶/2835.
    """
    x = np.abs(np.asarray(x, dtype=np.float64))
    small = x < SERIES_CUTOFF
    xs = np.where(small, 1.0, x)  # closed forms only where used
    e = np.exp(-2 * xs)
    amp = e / (1 - e)
    g = gamma(6)
    closed = (
        g * (1 / np.tanh(xs) + 1 / xs),
        g * (1 / xs**2 + 4 * e / (1 - e) ** 2 * (1 + 2 * amp)),
        g * (xs + np.abs(np.log1p(-e)) + math.log(2) + np.abs(np.log(xs)) + amp),
    )
    series = (
        g * (x / 3 + x**3 / 45 + 2 * x**5 / 945) + x**7 / 4725,
        g * (1 / 3 + x**2 / 15 + 2 * x**4 / 189) + x**6 / 675,
        g * (x**2 / 6 + x**4 / 180) + x**6 / 2835,
    )
    return tuple(np.where(small, s_, c_) for s_, c_ in zip(series, closed))


TILTS = [
    [0.0, 0.0, 0.0],
    [1e-9, -2e-7, 3e-5],
    [0.3, -0.7, 1.1],
    [2.5, -4.0, 0.05],
    [30.0, -25.0, 8.0],
]


@pytest.mark.parametrize("a", TILTS)
def test_rademacher_cgf_by_exact_enumeration(a):
    a = torch.tensor(a, dtype=torch.float64)
    cube = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=3)), dtype=torch.float64)  # [8, 3]
    log_w = cube @ a
    w = torch.softmax(log_w, 0)  # exact tilted law on the 8 atoms
    mean = w @ cube
    cov = (cube - mean).T @ ((cube - mean) * w[:, None])
    r = Rademacher(3)
    # K = Σ log cosh aⱼ against a log-sum-exp over 8 scores of size ≤ Σ|aⱼ|: |·| scale Σ|a| + 3·3 log 2
    k_tol = 2 * rounding_tolerance(8 + 3 + 4, float(a.abs().sum()) + 9 * math.log(2))
    assert_within(r.cgf(a), torch.logsumexp(log_w, 0) - math.log(8), k_tol, "K")
    # enumeration: the tilted-moment rounding bound over the 8 atoms; closed forms tanh, 1 − tanh²: γ_4(1 + tanh²)
    mean_tol, cov_tol = tilted_moments_tolerance(a, cube)
    tanh = torch.tanh(a)
    assert_within(r.cgf_grad(a), mean, mean_tol + rounding_tolerance(4, tanh.abs()), "∇K")
    assert_within(r.cgf_hess(a), cov, cov_tol + torch.diag(rounding_tolerance(4, 1 + tanh**2)), "∇²K")


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")  # ∫z e^{tz} ≈ 0 for t ≈ 0
@pytest.mark.parametrize("t", [0.0, 1e-10, 3e-6, 4e-3, 0.0099, 0.0101, 0.4, 2.0, 9.0, -17.0, 60.0])
def test_uniform_cgf_by_quadrature(t):
    lo, hi = -math.sqrt(3), math.sqrt(3)
    shift = abs(t) * hi  # factor e^{|t|√3} out of every integral to avoid overflow
    rel, abs1 = 1e-13, 1e-15  # quad's epsrel (all three) and epsabs (m1, which vanishes at t = 0)
    m0 = integrate.quad(lambda z: math.exp(t * z - shift), lo, hi, epsabs=0, epsrel=rel, limit=200)[0]
    m1 = integrate.quad(lambda z: z * math.exp(t * z - shift), lo, hi, epsabs=abs1, epsrel=rel, limit=200)[0]
    m2 = integrate.quad(lambda z: z * z * math.exp(t * z - shift), lo, hi, epsabs=0, epsrel=rel, limit=200)[0]
    d0, d1, d2 = quad_tolerance(m0, rel, 0), quad_tolerance(m1, rel, abs1), quad_tolerance(m2, rel, 0)
    u = Uniform(1)
    a = torch.tensor([t], dtype=torch.float64)
    x = math.sqrt(3) * t
    tol_ls, tol_l, tol_dl = (float(b) for b in np.array(langevin_tolerances(x))[[2, 0, 1]])
    # reference errors: quadrature propagated through log, ratio and variance, plus their rounding
    k_ref = math.log(m0 / (hi - lo)) + shift
    grad_ref, m2_ref = m1 / m0, m2 / m0
    grad_err = d1 / m0 + abs(m1) * d0 / m0**2 + gamma(2) * abs(grad_ref)
    k_err = d0 / m0 + rounding_tolerance(4, abs(math.log(m0 / (hi - lo))) + shift)
    hess_err = d2 / m0 + m2 * d0 / m0**2 + 2 * abs(grad_ref) * grad_err + rounding_tolerance(4, m2_ref + grad_ref**2)
    assert_within(u.cgf(a).item(), k_ref, k_err + tol_ls + rounding_tolerance(2, abs(k_ref)), "K")
    assert_within(u.cgf_grad(a).item(), grad_ref, grad_err + math.sqrt(3) * tol_l, "∇K")
    assert_within(u.cgf_hess(a)[0, 0].item(), m2_ref - grad_ref**2, hess_err + 3 * tol_dl, "∇²K")


def test_uniform_is_coordinatewise_product():
    a = torch.tensor([[0.2, -3.0, 1e-8], [5.0, 0.0, -0.01]], dtype=torch.float64)
    u3, u1 = Uniform(3), Uniform(1)
    per_coord = torch.stack([u1.cgf_grad(a[..., j : j + 1])[..., 0] for j in range(3)], -1)
    assert torch.allclose(u3.cgf_grad(a), per_coord, rtol=0, atol=0)
    hess = u3.cgf_hess(a)
    assert torch.count_nonzero(hess - torch.diag_embed(torch.diagonal(hess, dim1=-2, dim2=-1))) == 0


def test_langevin_functions_match_high_precision_everywhere():
    mpmath.mp.dps = 50
    xs = np.concatenate([-np.logspace(-12, 2.5, 80), [0.0], np.logspace(-12, 2.5, 80)])
    x = torch.tensor(xs, dtype=torch.float64)
    got_l, got_dl, got_ls = langevin(x), langevin_derivative(x), log_sinhc(x)
    tols = np.stack(langevin_tolerances(xs), -1)  # [N, 3]
    for xi, gl, gdl, gls, tol in zip(xs, got_l, got_dl, got_ls, tols):
        if xi == 0.0:
            ref_l, ref_dl, ref_ls = 0.0, 1.0 / 3.0, 0.0
        else:
            X = mpmath.mpf(float(xi))
            ref_l = float(mpmath.coth(X) - 1 / X)
            ref_dl = float(1 / X**2 - 1 / mpmath.sinh(X) ** 2)
            ref_ls = float(mpmath.log(mpmath.sinh(X) / X))
        assert math.isfinite(gl) and math.isfinite(gdl) and math.isfinite(gls)
        refs = np.array([ref_l, ref_dl, ref_ls])
        # the library's bound plus the rounding of the 50-digit reference to float64
        assert_within([gl.item(), gdl.item(), gls.item()], refs, tol + eps(torch.float64) * np.abs(refs), f"x = {xi:.3g}")


def test_langevin_gradient_is_finite_at_zero():
    x = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    langevin(x).sum().backward()
    assert_within(x.grad, torch.full((3,), 1.0 / 3.0, dtype=torch.float64), rounding_tolerance(4, 1.0 / 3.0), "𝓛'(0)")


def test_gaussian_tilted_mean_by_monte_carlo_at_one_million_tokens():
    """∇K(a) = m + S a: the self-normalised importance-sampling mean at L = 10⁶, within 5 standard errors."""
    gen = torch.Generator().manual_seed(12345)
    S = toeplitz_covariance(3, 0.5)
    g = Gaussian([0.3, -0.2, 0.1], S)
    a = torch.tensor([0.4, -0.3, 0.2], dtype=torch.float64)
    z = g.sample(1_000_000, gen)  # [L, 3]
    log_w = z @ a
    w = torch.softmax(log_w, 0)
    estimate = w @ z
    # delta-method standard error of a self-normalised estimator: sqrt(Σ w_i² (z_i − ẑ)²)
    se = torch.sqrt((w[:, None] ** 2 * (z - estimate) ** 2).sum(0))
    expected = g.cgf_grad(a)
    assert_within(expected, g.loc + S @ a, 2 * matmul_tolerance(3 + 1, g.loc.abs() + S.abs() @ a.abs()), "m + Sa")
    assert_within(estimate, expected, mc_tolerance(se), "tilted mean")
    # and the un-tilted sample moments match m and S (the sampler itself); Var(zᵢzⱼ) = SᵢᵢSⱼⱼ + Sᵢⱼ²
    n = z.shape[0]
    assert_within(z.mean(0), g.loc, mc_tolerance(torch.sqrt(torch.diagonal(S) / n)), "sample mean")
    moment_sd = torch.sqrt(torch.outer(torch.diagonal(S), torch.diagonal(S)) + S**2)
    assert_within(torch.cov(z.T), S, mc_tolerance(moment_sd / math.sqrt(n)), "sample covariance")


def test_gaussian_cgf_and_hessian_closed_forms():
    S = toeplitz_covariance(4, -0.3, scale=2.0)
    g = Gaussian(torch.arange(4.0), S)
    a = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    # autograd of K gives ∇K, and of ∇K gives ∇²K
    a.requires_grad_(True)
    grad = torch.autograd.grad(g.cgf(a).sum(), a, create_graph=True)[0]
    # m + ½(S + Sᵀ)a from autograd against m + Sa: inner size D, both sides
    grad_tol = 2 * matmul_tolerance(4 + 3, g.loc.abs() + a.detach().abs() @ S.abs())
    assert_within(grad, g.cgf_grad(a), grad_tol, "∇K")
    hess = torch.autograd.functional.hessian(lambda x: g.cgf(x), a[0].detach())
    assert_within(hess, g.cgf_hess(a[0].detach()), rounding_tolerance(3, S.abs()), "∇²K")


def _autograd_tolerances(name, a):
    """Bounds on |autograd of K − closed-form ∇K| and |autograd² of K − closed-form ∇²K| [..., D].

    Rademacher: autograd of |a| + log1p(e) − log 2 (e = e^{−2|a|}) against tanh a, 1 − tanh² a: every term ≤ 1,
    γ_12·3. Uniform, x = √3a: the closed forms' bounds (langevin_tolerances) plus autograd's own path through
    log sinhc, whose |·| evaluation is that of 𝓛 (resp. 𝓛') with the e/(1 − e) amplification, and below the
    cutoff the first omitted series terms 2|x|⁵/945 (resp. 2x⁴/189) of the differentiated series.
    """
    x = np.abs(a.detach().numpy())
    if name == "rademacher":
        return np.full(x.shape, gamma(12) * 3), np.full(x.shape, gamma(12) * 3)
    x = math.sqrt(3) * x
    tol_l, tol_dl, _ = langevin_tolerances(x)
    series = x < SERIES_CUTOFF
    xs = np.where(series, 1.0, x)
    e = np.exp(-2 * xs)
    amp = 1 + 2 * e / (1 - e)
    path_1 = np.where(series, gamma(6) * (x / 3 + x**3 / 45) + 2 * x**5 / 945,
                      gamma(12) * (1 + 2 * e / (1 - e) * amp + 1 / xs))
    path_2 = np.where(series, gamma(6) * (1 / 3 + x**2 / 15) + 2 * x**4 / 189,
                      gamma(12) * (1 / xs**2 + 4 * e / (1 - e) * amp**2 + 4 * e / (1 - e) ** 2 * amp))
    return math.sqrt(3) * (tol_l + path_1), 3 * (tol_dl + path_2)


@pytest.mark.parametrize("name", ["rademacher", "uniform"])
def test_gradient_and_hessian_are_derivatives_of_the_cgf(name):
    m = make_measure(name, 3)
    a = torch.tensor([[0.7, -1e-4, 3.0], [-12.0, 0.02, 0.5]], dtype=torch.float64, requires_grad=True)
    grad = torch.autograd.grad(m.cgf(a).sum(), a)[0]
    tol_grad, tol_hess = _autograd_tolerances(name, a)
    assert_within(grad, m.cgf_grad(a.detach()), tol_grad, "∇K")
    for row, tol in zip(a.detach(), tol_hess):
        hess = torch.autograd.functional.hessian(m.cgf, row)
        assert_within(hess, m.cgf_hess(row), torch.diag(torch.as_tensor(tol)), "∇²K")  # off-diagonal: exact zeros


def test_unit_variance_product_measures_sample_correctly():
    gen = torch.Generator().manual_seed(7)
    for m in (Rademacher(2), Uniform(2)):
        z = m.sample((200_000,), gen)
        n = z.shape[0]
        assert z.shape == (n, 2)
        assert torch.all(z.abs() <= math.sqrt(3) * (1 + gamma(1)))  # √3·(2r − 1) with |2r − 1| ≤ 1: one rounding
        assert_within(z.mean(0), 0.0, mc_tolerance(math.sqrt(1.0 / n)), "mean")
        # sample variance: standard error √((μ₄ − 1)/n) (μ₄ = 1 Rademacher, 9/5 uniform), plus the O(1/n) term
        # (1 + n z̄²)/(n − 1) that is all there is for Rademacher (z² ≡ 1), with n z̄² ≤ z² at z standard errors
        mu4 = 1.0 if isinstance(m, Rademacher) else 9.0 / 5.0
        var_tol = mc_tolerance(math.sqrt((mu4 - 1.0) / n)) + (1 + mc_tolerance(1.0) ** 2) / (n - 1)
        assert_within(z.var(0), 1.0, var_tol, "variance")
        assert_within(m.covariance, torch.eye(2, dtype=torch.float64), rounding_tolerance(4, 1.0), "covariance")


def test_bad_measure_arguments_are_rejected():
    with pytest.raises(ValueError, match="allowed"):
        make_measure("cauchy", 2)
    with pytest.raises(ValueError):
        Gaussian([0.0, 0.0], [[1.0, 0.5], [0.4, 1.0]])


def test_langevin_functions_are_accurate_in_float32():
    """Just above the series cutoff the closed forms cancel; float32 inputs must still give float32 accuracy."""
    x64 = torch.tensor([0.0101, 0.02, 0.1, 1.0, 30.0], dtype=torch.float64)
    x32 = x64.to(torch.float32)
    for fn in (langevin, langevin_derivative, log_sinhc):
        got = fn(x32)
        assert got.dtype == torch.float32
        want = fn(x32.to(torch.float64))  # the same float32 inputs, evaluated in float64
        bounds = langevin_tolerances(x32.to(torch.float64).numpy())
        bound = dict(zip((langevin, langevin_derivative, log_sinhc), bounds))[fn]
        # the float64 evaluation's bound, then one rounding to float32
        assert_within(got, want, torch.as_tensor(bound) + eps(torch.float32) * want.abs(), fn.__name__)
