"""Token measures: CGF gradients and Hessians against independent computations (SPEC F1)."""
import itertools
import math

import mpmath
import numpy as np
import pytest
import torch
from scipy import integrate

from largeprompt.measures import (
    Gaussian,
    Rademacher,
    Uniform,
    langevin,
    langevin_derivative,
    log_sinhc,
    make_measure,
    toeplitz_covariance,
)

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
    assert torch.allclose(r.cgf(a), torch.logsumexp(log_w, 0) - math.log(8), atol=1e-12, rtol=1e-12)
    assert torch.allclose(r.cgf_grad(a), mean, atol=1e-12, rtol=1e-12)
    assert torch.allclose(r.cgf_hess(a), cov, atol=1e-12, rtol=1e-10)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")  # ∫z e^{tz} ≈ 0 for t ≈ 0
@pytest.mark.parametrize("t", [0.0, 1e-10, 3e-6, 4e-3, 0.0099, 0.0101, 0.4, 2.0, 9.0, -17.0, 60.0])
def test_uniform_cgf_by_quadrature(t):
    lo, hi = -math.sqrt(3), math.sqrt(3)
    shift = abs(t) * hi  # factor e^{|t|√3} out of every integral to avoid overflow
    m0 = integrate.quad(lambda z: math.exp(t * z - shift), lo, hi, epsabs=0, epsrel=1e-13, limit=200)[0]
    m1 = integrate.quad(lambda z: z * math.exp(t * z - shift), lo, hi, epsabs=1e-15, epsrel=1e-13, limit=200)[0]
    m2 = integrate.quad(lambda z: z * z * math.exp(t * z - shift), lo, hi, epsabs=0, epsrel=1e-13, limit=200)[0]
    u = Uniform(1)
    a = torch.tensor([t], dtype=torch.float64)
    assert u.cgf(a).item() == pytest.approx(math.log(m0 / (hi - lo)) + shift, rel=1e-9, abs=1e-12)
    assert u.cgf_grad(a).item() == pytest.approx(m1 / m0, rel=1e-9, abs=1e-12)
    assert u.cgf_hess(a)[0, 0].item() == pytest.approx(m2 / m0 - (m1 / m0) ** 2, rel=1e-7, abs=1e-10)


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
    for xi, gl, gdl, gls in zip(xs, got_l, got_dl, got_ls):
        if xi == 0.0:
            ref_l, ref_dl, ref_ls = 0.0, 1.0 / 3.0, 0.0
        else:
            X = mpmath.mpf(float(xi))
            ref_l = float(mpmath.coth(X) - 1 / X)
            ref_dl = float(1 / X**2 - 1 / mpmath.sinh(X) ** 2)
            ref_ls = float(mpmath.log(mpmath.sinh(X) / X))
        assert math.isfinite(gl) and math.isfinite(gdl) and math.isfinite(gls)
        assert gl.item() == pytest.approx(ref_l, rel=1e-11, abs=1e-300)
        assert gdl.item() == pytest.approx(ref_dl, rel=1e-9, abs=1e-14)
        assert gls.item() == pytest.approx(ref_ls, rel=1e-10, abs=1e-300)


def test_langevin_gradient_is_finite_at_zero():
    x = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    langevin(x).sum().backward()
    assert torch.allclose(x.grad, torch.full((3,), 1.0 / 3.0, dtype=torch.float64))


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
    assert torch.allclose(expected, g.loc + S @ a)
    assert torch.all((estimate - expected).abs() < 5 * se), (estimate, expected, se)
    # and the un-tilted sample moments match m and S (the sampler itself)
    assert torch.all((z.mean(0) - g.loc).abs() < 5 * torch.sqrt(torch.diagonal(S) / z.shape[0]))
    emp_cov = torch.cov(z.T)
    assert torch.allclose(emp_cov, S, atol=5 * math.sqrt(2.0 / z.shape[0]) * 1.5)


def test_gaussian_cgf_and_hessian_closed_forms():
    S = toeplitz_covariance(4, -0.3, scale=2.0)
    g = Gaussian(torch.arange(4.0), S)
    a = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    # autograd of K gives ∇K, and of ∇K gives ∇²K
    a.requires_grad_(True)
    grad = torch.autograd.grad(g.cgf(a).sum(), a, create_graph=True)[0]
    assert torch.allclose(grad, g.cgf_grad(a))
    hess = torch.autograd.functional.hessian(lambda x: g.cgf(x), a[0].detach())
    assert torch.allclose(hess, g.cgf_hess(a[0].detach()))


@pytest.mark.parametrize("name", ["rademacher", "uniform"])
def test_gradient_and_hessian_are_derivatives_of_the_cgf(name):
    m = make_measure(name, 3)
    a = torch.tensor([[0.7, -1e-4, 3.0], [-12.0, 0.02, 0.5]], dtype=torch.float64, requires_grad=True)
    grad = torch.autograd.grad(m.cgf(a).sum(), a)[0]
    assert torch.allclose(grad, m.cgf_grad(a.detach()), atol=1e-12)
    for row in a.detach():
        hess = torch.autograd.functional.hessian(m.cgf, row)
        assert torch.allclose(hess, m.cgf_hess(row), atol=1e-10)


def test_unit_variance_product_measures_sample_correctly():
    gen = torch.Generator().manual_seed(7)
    for m in (Rademacher(2), Uniform(2)):
        z = m.sample((200_000,), gen)
        assert z.shape == (200_000, 2)
        assert torch.all(z.abs() <= math.sqrt(3) + 1e-12)
        se = math.sqrt(1.0 / z.shape[0])
        assert torch.all(z.mean(0).abs() < 5 * se)
        assert torch.allclose(z.var(0), torch.ones(2, dtype=torch.float64), atol=0.02)
        assert torch.allclose(m.covariance, torch.eye(2, dtype=torch.float64))


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
        assert torch.allclose(got.to(torch.float64), want, rtol=1e-6, atol=0), fn.__name__
