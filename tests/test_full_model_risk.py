"""The numpy R∞ of the §6 model and its exact derivatives against torch autograd of the closed form
(docs/theory.md#risk-derivatives), and the flow classes (docs/experiments.md#flow-classes,
docs/theory.md#drifting-flows)."""
import math

import numpy as np
import pytest
import torch

from largeprompt.icl import models
from largeprompt.icl.dynamics import full_model_flow
from largeprompt.icl.engine.runs import initial_parameters
from largeprompt.icl.flow_class import classify_flow, escape_time, plateau_threshold
from largeprompt.icl.full_model_risk import full_model_risk
from largeprompt.icl.risks import infinite_prompt_risk
from largeprompt.icl.task import regression_task
from tolerance import assert_within, gamma, infinite_prompt_risk_abs, ode_tolerance

TASK = regression_task({"dim": 5, "covariance_rho": 0.5, "task_variance": 0.2, "noise_variance": 0.1})
D = TASK.token_dim
# Along any path an entry of R∞, ∇R∞ or ∇²R∞ passes through at most this many roundings: U (D products and a
# division), four d-term contractions on the way to the risk and back, and the D-term products of the chain rule.
ROUNDINGS = 2 * D + 4 * TASK.dim + 8


def torch_risk(theta):
    p = models.unflatten(theta, D)
    return infinite_prompt_risk(TASK, p["Q"], p["K"], p["V"], p["O"])


def abs_risk(theta):
    p = models.unflatten(theta, D)
    return infinite_prompt_risk_abs(TASK, p["Q"], p["K"], p["V"], p["O"])


def points(scale, n=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(n, 3 * D * D + D, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("scale", [0.1, 0.7, 2.0])
def test_value_and_gradient_equal_autograd(scale):
    risk = full_model_risk(TASK)
    thetas = points(scale)
    value, grad = risk.value_and_gradient(thetas.numpy())  # one batched call
    for i, theta in enumerate(thetas):
        leaf = theta.clone().requires_grad_(True)
        (want,) = torch.autograd.grad(torch_risk(leaf), leaf)
        bound = theta.abs().clone().requires_grad_(True)
        (abs_grad,) = torch.autograd.grad(abs_risk(bound), bound)
        # both sides round at most ROUNDINGS times along every path: their difference is within twice the bound
        tol = 2 * gamma(ROUNDINGS) * abs_grad
        assert_within(value[i], torch_risk(theta), 2 * gamma(ROUNDINGS) * abs_risk(theta.abs()), "R∞")
        assert_within(grad[i], want, tol, "∇R∞")


@pytest.mark.parametrize("scale", [0.1, 1.0])
def test_complex_step_hessian_equals_autograd(scale):
    risk = full_model_risk(TASK)
    theta = points(scale, n=1, seed=1)[0]
    got = risk.hessian(theta.numpy())
    want = torch.autograd.functional.hessian(torch_risk, theta)
    abs_hessian = torch.autograd.functional.hessian(abs_risk, theta.abs())  # entrywise ≥ |each Hessian term|
    assert_within(got, want, 2 * gamma(ROUNDINGS) * abs_hessian, "∇²R∞")
    assert np.array_equal(got, got.T) or np.abs(got - got.T).max() <= 2 * gamma(ROUNDINGS) * float(abs_hessian.max())
    batched = risk.sharpness(np.stack([theta.numpy(), 2 * theta.numpy()]))
    assert_within(batched[0], torch.linalg.eigvalsh(want)[-1], 4 * gamma(ROUNDINGS) * abs_hessian.sum(), "λ_max")


def test_readout_determinant_at_a_minimiser_is_det_inverse_covariance():
    """At u_x = 0, m_y = 0, u_y M_x = Λ⁻¹ (K = I, Q = √D Λ⁻¹/u_y on the x block): R∞ = σ², ∇R∞ = 0, det = det Λ⁻¹."""
    lam_inv = torch.linalg.inv(TASK.covariance)
    u_y = 1.7
    Q = torch.zeros(D, D, dtype=torch.float64)
    Q[:5, :5] = math.sqrt(D) * lam_inv / u_y  # U = KᵀQ/√D with K = I; only the first d columns of U matter
    V, O = torch.eye(D, dtype=torch.float64), torch.zeros(1, D, dtype=torch.float64)
    O[0, 5] = u_y  # u = VᵀOᵀ = u_y e_D
    theta = models.flatten({"Q": Q, "K": torch.eye(D, dtype=torch.float64), "V": V, "O": O}).numpy()
    risk = full_model_risk(TASK)
    value, grad = risk.value_and_gradient(theta)
    scale = float(abs_risk(torch.from_numpy(np.abs(theta))))
    assert abs(value - TASK.noise_variance) <= 2 * gamma(ROUNDINGS) * scale
    assert np.abs(grad).max() <= 4 * gamma(ROUNDINGS) * scale * D
    det_inv = float(torch.linalg.det(lam_inv))
    assert risk.readout_determinant(theta) == pytest.approx(det_inv, rel=8 * gamma(ROUNDINGS))


def test_classify_flow_on_synthetic_flows():
    times = np.linspace(0.0, 10.0, 11)
    start, sigma2 = 1.1, 0.1
    assert plateau_threshold(start, sigma2) == pytest.approx(0.6)
    flat = np.full_like(times, start)
    assert classify_flow(times, flat, np.ones_like(times), sigma2)[0] == "plateau"
    falling = np.where(times < 4, start, 0.2)
    for det, kind in ((np.ones_like(times), "converges"), (-np.ones_like(times), "drifts")):
        got, t_escape = classify_flow(times, falling, det, sigma2)
        assert (got, t_escape) == (kind, 4.0)
    # only the sign at the horizon counts: a determinant that changes sign after the escape and settles positive converges
    settles = np.where(times < 6, -1.0, 1.0)
    assert classify_flow(times, falling, settles, sigma2)[0] == "converges"
    assert math.isnan(escape_time(times, flat, 0.6))


@pytest.mark.slow
def test_drifting_flows_grow_and_converging_flows_reach_a_minimiser():
    """The class rule against what it claims: a converging flow ends at a minimiser (R∞ = σ², det(u_y M_x) = det Λ⁻¹,
    weights settled), a drifting one keeps det < 0 while R∞ keeps falling towards σ² and its weights keep growing."""
    times = np.linspace(0.0, 400.0, 81)
    risk = full_model_risk(TASK)
    det_inv = float(torch.linalg.det(torch.linalg.inv(TASK.covariance)))
    seen = set()
    for seed in range(4):
        thetas, risks = full_model_flow(TASK, initial_parameters(20251211, seed, D), times)
        det = risk.readout_determinant(thetas)
        kind, _ = classify_flow(times, risks, det, TASK.noise_variance)
        seen.add(kind)
        norms = np.linalg.norm(thetas, axis=1)
        tol = ode_tolerance(1e-9, 1e-11, norms[-1])
        assert np.all(np.diff(risks) <= tol), "R∞ decreases along its gradient flow"
        if kind == "converges":
            assert risks[-1] - TASK.noise_variance <= 1e-6 and abs(det[-1] - det_inv) <= 1e-4 * det_inv
            assert abs(norms[-1] - norms[40]) <= tol
        elif kind == "drifts":
            assert np.all(det[40:] < 0) and risks[-1] < risks[40] and norms[-1] > norms[40] + tol
    assert seen == {"converges", "drifts"}, seen
