"""Softmax's exact R∞ for bounded covariates (docs/theory.md#bounded-token-risk), its derivatives, what the limit
predicts (docs/theory.md#bounded-softmax-optimum) and linear attention's finite-L optimum per measure
(docs/theory.md#bounded-linear-optimum), each against an independent computation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from largeprompt.icl.bounded_optima import scale_profile, softmax_optimum, valley_point
from largeprompt.icl.bounded_risk import BoundedTokenRisk, Quadrature, _langevin, coordinate_cgf_derivatives, limit_risk, query_rule, task_rule
from largeprompt.icl.full_model_risk import FullModelRisk, full_model_risk
from largeprompt.icl.risks import optimal_linear_attention_risk
from largeprompt.icl.task import EXCESS_KURTOSIS, RegressionTask
from tolerance import rounding_tolerance

D_X, TAU2, SIGMA2 = 3, 1 / 3, 0.1
P = 3 * (D_X + 1) ** 2 + D_X + 1


def theta(seed: int, scale: float = 0.5) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(P) * scale


@pytest.fixture(scope="module", params=["rademacher", "uniform"])
def bounded(request):
    return BoundedTokenRisk(request.param, D_X, TAU2, SIGMA2, Quadrature(10, 20))


def test_gaussian_coordinates_reduce_to_the_closed_form():
    """κ' = id with Gauss-Hermite queries is the Gaussian closed form with Λ = I (exact rules: the integrand is a
    polynomial of degree 2 in x_q and 4 in β)."""
    quad = BoundedTokenRisk("gaussian", D_X, TAU2, SIGMA2, Quadrature(3, 3))
    closed = FullModelRisk(np.eye(D_X), TAU2, SIGMA2)
    for seed in range(3):
        th = theta(seed, 0.8)
        (r1, g1), (r2, g2) = quad.value_and_gradient(th), closed.value_and_gradient(th)
        tol = rounding_tolerance(quad.x.shape[0] * D_X * quad.b.size, abs(r2))
        assert abs(r1 - r2) <= tol
        assert np.abs(g1 - g2).max() <= rounding_tolerance(quad.x.shape[0] * D_X * quad.b.size, np.abs(g2).max())


def _autograd_risk(measure: str, th: torch.Tensor) -> torch.Tensor:
    """R∞ by brute force: x_q on the query rule, β on the *tensor* Gauss-Hermite grid (no independence used), and
    the output uᵀ∇K(a) with ∇K by autograd of the token CGF K(a) = Σ κ(a_x + a_y β) + σ²a_y²/2."""
    x, w = (torch.tensor(v) for v in query_rule(measure, D_X, 6))
    b1, o1 = task_rule(TAU2, 6)
    grid = torch.tensor(np.stack(np.meshgrid(*([b1] * D_X), indexing="ij"), -1).reshape(-1, D_X))  # [K^d, d]
    omega = torch.tensor(np.prod(np.stack(np.meshgrid(*([o1] * D_X), indexing="ij"), -1).reshape(-1, D_X), -1))
    D = D_X + 1
    Q, K, V, O = th[:D * D].view(D, D), th[D * D:2 * D * D].view(D, D), th[2 * D * D:3 * D * D].view(D, D), th[3 * D * D:].view(1, D)
    U, u = K.T @ Q / math.sqrt(D), (O @ V).view(-1)
    a = x @ U[:, :D_X].T  # [N, D]
    kappa = {"rademacher": lambda t: torch.log(torch.cosh(t)),
             "uniform": lambda t: torch.log(torch.sinh(math.sqrt(3) * t) / (math.sqrt(3) * t))}[measure]
    a_rep = a[:, None, :].expand(-1, grid.shape[0], -1)  # [N, K^d, D]

    def cgf(av):  # av [N, K^d, D] → Σ K
        return (kappa(av[..., :D_X] + av[..., D_X:] * grid).sum(-1) + 0.5 * SIGMA2 * av[..., D_X] ** 2).sum()

    mean = torch.autograd.grad(cgf(a_rep), a_rep, create_graph=True)[0]  # ∇K [N, K^d, D]
    residual = mean @ u - (grid * x[:, None, :]).sum(-1)  # [N, K^d]
    return (w[:, None] * omega * residual**2).sum() + SIGMA2


@pytest.mark.parametrize("measure", ["rademacher", "uniform"])
def test_gradient_matches_autograd_of_an_independent_formula(measure):
    th = theta(4, 0.4)
    risk = BoundedTokenRisk(measure, D_X, TAU2, SIGMA2, Quadrature(6, 6))
    t = torch.tensor(th, requires_grad=True)
    value = _autograd_risk(measure, t)
    (grad,) = torch.autograd.grad(value, t)
    r, g = risk.value_and_gradient(th)
    # the two rules differ only in how β's tensor grid is summed: agreement to rounding of N·K^d terms
    n = risk.x.shape[0] * 6**D_X
    assert abs(r - float(value.detach())) <= rounding_tolerance(n, abs(r))
    assert np.abs(g - grad.numpy()).max() <= rounding_tolerance(n, np.abs(g).max())


def test_complex_step_hessian_matches_finite_differences(bounded):
    th, v = theta(5, 0.6), np.random.default_rng(6).standard_normal(P)
    H = bounded.hessian(th)
    assert np.abs(H - H.T).max() <= 1e-12 * np.abs(H).max()
    h = 1e-5  # central differences: error h²·|∇⁴R| ≈ 1e-10, rounding eps·|∇R|/h ≈ 1e-11
    fd = (bounded.gradient(th + h * v) - bounded.gradient(th - h * v)) / (2 * h)
    assert np.abs(fd - H @ v).max() <= 1e-6 * np.abs(H @ v).max()


def test_monte_carlo_over_queries_and_tasks(bounded):
    """The quadrature against plain Monte Carlo over (x_q, β, ε_q), through the measure's ∇K (torch measures)."""
    from largeprompt.maths.measures import make_measure
    th, n = theta(7, 0.5), 400_000
    rng = np.random.default_rng(8)
    gen = torch.Generator().manual_seed(9)
    x = make_measure(bounded.measure, D_X).sample(n, gen).numpy()
    beta = rng.standard_normal((n, D_X)) * math.sqrt(TAU2)
    Q, K, V, O = bounded.weights(th)
    U, u = K.T @ Q / 2.0, (O @ V)[0]
    a = x @ U[:, :D_X].T
    kp, _ = coordinate_cgf_derivatives(bounded.measure, a[:, :D_X] + a[:, D_X:] * beta)
    grad_k = np.concatenate([kp, ((beta * kp).sum(-1) + SIGMA2 * a[:, D_X])[:, None]], -1)
    err = (grad_k @ u - (beta * x).sum(-1) - math.sqrt(SIGMA2) * rng.standard_normal(n)) ** 2
    assert abs(err.mean() - bounded.value(th)) <= 5 * err.std() / math.sqrt(n)


@pytest.mark.slow
@pytest.mark.parametrize("measure", ["rademacher", "uniform"])
def test_long_prompts_reach_the_quadrature_risk(measure):
    """Brute force of the finite-prompt softmax model at L = 20 000: its MSE is R∞ + O(1/L)."""
    from largeprompt.icl import models
    from largeprompt.icl.engine import stacked
    th = theta(10, 0.3)
    risk = BoundedTokenRisk(measure, D_X, TAU2, SIGMA2, Quadrature(10, 20))
    task = RegressionTask(np.eye(D_X), TAU2, SIGMA2, measure)
    params = models.unflatten(torch.tensor(th), D_X + 1)
    stack = stacked.RunStack.from_parameters([params], [True])
    errors = []
    for block in range(8):
        q, p, y = task.sample(500, 20_000, torch.Generator().manual_seed(100 + block))
        errors.append(((stacked.predict(stack, q, p)[0] - y) ** 2).numpy())
    err = np.concatenate(errors)
    se = err.std() / math.sqrt(err.size)
    # the O(1/L) finite-prompt excess at these small weights is below 5e-4 (it is ≈ v²(d + σ²)e^{‖a‖²}/L)
    assert abs(err.mean() - risk.value(th)) <= 5 * se + 5e-4


def test_quadrature_error_is_stated_and_small(bounded):
    th = theta(11, 0.5)
    stated = float(bounded.quadrature_error(th))
    finer = BoundedTokenRisk(bounded.measure, D_X, TAU2, SIGMA2, Quadrature(30, 60)).value(th)
    assert stated <= 1e-8
    assert abs(bounded.value(th) - finer) <= stated + rounding_tolerance(10**5, finer)


def test_langevin_series_and_closed_form_join():
    x = np.array([0.0999999, 0.1, 0.1000001, -0.1, 1e-8, 3.0, -30.0, 400.0])
    value, slope = _langevin(x)
    ref = np.array([1 / math.tanh(v) - 1 / v if abs(v) > 1e-3 else v / 3 for v in x])
    assert np.allclose(value, ref, rtol=1e-10, atol=1e-15)
    complex_value, complex_slope = _langevin(x + 1e-30j)
    assert np.allclose(complex_value.imag / 1e-30, slope, rtol=1e-9)  # the complex step of 𝓛 is 𝓛'
    assert np.allclose(complex_slope.real, slope, rtol=1e-12)


def test_rademacher_valley_reaches_sigma2_at_every_scale():
    """tanh(c xⱼ) = tanh(c) xⱼ on the cube: v = 1/tanh c, A = cI gives R∞ = σ² exactly."""
    risk = BoundedTokenRisk("rademacher", D_X, TAU2, SIGMA2, Quadrature(10, 20))
    for c in (0.1, 0.7, 2.0):
        value = risk.value(valley_point(D_X, c, 1 / math.tanh(c)))
        assert abs(value - SIGMA2) <= rounding_tolerance(8 * 20 * D_X, 1.0)


def test_uniform_profile_rises_from_sigma2_and_matches_the_full_risk():
    scales = np.geomspace(0.01, 3.0, 25)
    profile = scale_profile("uniform", D_X, TAU2, SIGMA2, scales)
    risk = profile["profile_risk"].to_numpy()
    assert np.all(np.diff(risk) > 0) and risk[0] - SIGMA2 < 1e-6 and risk[-1] - SIGMA2 > 0.05
    full = BoundedTokenRisk("uniform", D_X, TAU2, SIGMA2, Quadrature(12, 24))
    for row in profile[profile["attention_scale"] <= 1.0].iloc[::4].itertuples():  # where 12 nodes per coordinate converge
        value = full.value(valley_point(D_X, row.attention_scale, row.value_scale))
        assert abs(value - row.profile_risk) <= 1e-9 + float(full.quadrature_error(valley_point(D_X, row.attention_scale,
                                                                                                row.value_scale)))
    for measure in ("gaussian", "rademacher"):
        flat = scale_profile(measure, D_X, TAU2, SIGMA2, scales)["profile_risk"]
        assert np.abs(flat - SIGMA2).max() <= 1e-12
    assert softmax_optimum("uniform", D_X, TAU2, SIGMA2, scales)["attained"] is False


@pytest.mark.parametrize("measure", ["gaussian", "rademacher", "uniform"])
@pytest.mark.parametrize("prompt_length", [5, 20])
def test_linear_attention_optimum_by_monte_carlo(measure, prompt_length):
    """R(Γ*) = dτ²k/(L + k) + σ², k = d + 1 + κ₄ + σ²/τ², and the least-squares γ of x_qᵀγ m̂ is L/(L + k)."""
    task = RegressionTask(np.eye(D_X), TAU2, SIGMA2, measure)
    q, p, y = task.sample(200_000, prompt_length, torch.Generator().manual_seed(12))
    m = (p[..., -1:] * p[..., :-1]).mean(1)  # m̂ [N, d]
    feature = (q[:, :-1] * m).sum(-1)  # x_qᵀ m̂
    k = D_X + 1 + EXCESS_KURTOSIS[measure] + SIGMA2 / TAU2
    gamma = prompt_length / (prompt_length + k)
    err = ((gamma * feature - y) ** 2).numpy()
    closed = optimal_linear_attention_risk(np.eye(D_X), TAU2, SIGMA2, prompt_length, EXCESS_KURTOSIS[measure])
    assert closed == pytest.approx(D_X * TAU2 * k / (prompt_length + k) + SIGMA2, rel=1e-12)
    assert abs(err.mean() - closed) <= 5 * err.std() / math.sqrt(err.size)
    fitted = float((feature * y).sum() / (feature * feature).sum())
    assert abs(fitted - gamma) <= 5 * float(err.std()) / math.sqrt(float((feature * feature).sum()))


@pytest.mark.parametrize("measure", ["rademacher", "uniform"])
def test_bounded_task_samples_the_measure(measure):
    task = RegressionTask(np.eye(D_X), TAU2, SIGMA2, measure)
    q, p, y, beta = task.sample_with_tasks(2000, 50, torch.Generator().manual_seed(13))
    x = p[..., :-1].reshape(-1)
    assert abs(float(x.mean())) < 5 / math.sqrt(x.numel()) and abs(float((x * x).mean()) - 1) < 5 * 2 / math.sqrt(x.numel())
    assert float((x**4).mean()) - 3 == pytest.approx(EXCESS_KURTOSIS[measure], abs=0.05)
    assert float(x.abs().max()) <= math.sqrt(3) + 1e-12
    noise = p[..., -1] - (p[..., :-1] @ beta.unsqueeze(-1)).squeeze(-1)
    assert float(noise.var()) == pytest.approx(SIGMA2, rel=0.05)
    assert torch.all(q[:, -1] == 0) and float(q[:, :-1].abs().max()) <= math.sqrt(3) + 1e-12


def test_bounded_measures_need_identity_covariance_and_their_own_limit():
    with pytest.raises(ValueError, match="covariance must be I"):
        RegressionTask(np.array([[1.0, 0.5], [0.5, 1.0]]), TAU2, SIGMA2, "uniform")
    task = RegressionTask(np.eye(D_X), TAU2, SIGMA2, "uniform")
    with pytest.raises(ValueError, match="limit_risk"):
        full_model_risk(task)
    assert isinstance(limit_risk(task, "softmax"), BoundedTokenRisk)
    assert not isinstance(limit_risk(task, "linear"), BoundedTokenRisk)
