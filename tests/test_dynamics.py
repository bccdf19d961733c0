"""Infinite-prompt flows against THEORY §F(iii) closed forms, and the block-sparse symmetry of §F(i)."""
import math

import numpy as np
import pytest
import torch

from largeprompt import models
from largeprompt.dynamics import (
    balanced_flow,
    bayes_point,
    full_model_flow,
    isotropic_flow,
    isotropic_product,
    reduced_attention,
    reduced_flow,
    reduced_model_sgd,
)
from largeprompt.icl import RegressionTask, infinite_prompt_risk
from largeprompt.measures import toeplitz_covariance
from largeprompt.seeding import stream_generator

TIMES = np.linspace(0.0, 1.5, 16)


@pytest.mark.parametrize("d,v0,a0", [(3, 2.0, 0.1), (3, 1.0, 0.2), (2, -1.5, 0.3), (4, 0.2, 0.5)])
def test_reduced_ode_matches_the_psi_solution(d, v0, a0):
    """ODE integration of (v, A) on R∞ from A0 = a0 I against Ψ(p(t)) = Ψ(p0) + 2t (THEORY §F(iii))."""
    task = RegressionTask(np.eye(d), 1.0, 0.25)
    v, A, risk = reduced_flow(task, v0, a0 * np.eye(d), TIMES)
    v_cf, a_cf = isotropic_flow(v0, a0, d, TIMES)
    assert np.abs(v - v_cf).max() < 1e-7
    assert np.abs(np.diagonal(A, axis1=1, axis2=2) - a_cf[:, None]).max() < 1e-7
    assert np.abs(A - np.einsum("t,ij->tij", np.diagonal(A, axis1=1, axis2=2)[:, 0], np.eye(d))).max() < 1e-10  # stays isotropic
    c = v0**2 - d * a0**2
    assert np.abs(v**2 - d * np.diagonal(A, axis1=1, axis2=2)[:, 0] ** 2 - c).max() < 1e-7  # balancedness conserved
    assert np.allclose(risk, 0.25 + d * (v * A[:, 0, 0] - 1) ** 2, atol=1e-10)


def test_balanced_isotropic_flow_is_logistic():
    """c = 0: p(t) = [1 + (1/p0 − 1)e^{−4√d t}]⁻¹, both for the Ψ solution and the ODE."""
    d, a0 = 3, 0.2
    v0 = math.sqrt(d) * a0
    p0 = v0 * a0
    logistic = 1.0 / (1.0 + (1.0 / p0 - 1.0) * np.exp(-4.0 * math.sqrt(d) * TIMES))
    assert np.abs(isotropic_product(p0, 0.0, d, TIMES) - logistic).max() < 1e-12
    assert np.abs(isotropic_product(p0, 1e-9, d, TIMES) - logistic).max() < 1e-6  # the Ψ branch agrees as c → 0
    v, A, _ = reduced_flow(RegressionTask(np.eye(d), 1.0, 0.1), v0, a0 * np.eye(d), TIMES)
    assert np.abs(v * A[:, 0, 0] - logistic).max() < 1e-7


def test_psi_limit_and_saddle():
    d, c = 3, 0.7
    k = math.sqrt(c * c + 4 * d)
    v0 = math.sqrt(c + d * 0.01)
    v, a = isotropic_flow(v0, 0.1, d, [200.0])
    assert abs(a[0] ** 2 - (k - c) / (2 * d)) < 1e-9 and abs(v[0] * a[0] - 1) < 1e-9
    # c = 0, p0 < 0: logistic towards the saddle at the origin
    assert abs(isotropic_product(-0.1, 0.0, d, [5.0])[0]) < 1e-6
    v, A, _ = reduced_flow(RegressionTask(np.eye(d), 1.0, 0.1), -0.2 * math.sqrt(d), 0.2 * np.eye(d), TIMES)
    assert np.abs(v * A[:, 0, 0] - isotropic_product(-0.2 * 0.2 * math.sqrt(d), 0.0, d, TIMES)).max() < 1e-7


def test_balanced_flow_reaches_the_bayes_point():
    """R5: from b = ‖A‖_F = α the flow converges to b* = tr(Σ⁻²)^{1/4}, A* = tr(Σ⁻²)^{−1/4}Σ⁻¹."""
    sigma = toeplitz_covariance(5, 0.5, dtype=torch.float64).numpy()
    b_star, A_star = bayes_point(sigma)
    times = np.linspace(0, 60, 7)
    A, b, risk = balanced_flow(sigma, 1.0, times)
    assert abs(b[-1] - b_star) < 1e-5 and np.abs(A[-1] - A_star).max() < 1e-5
    assert np.abs(b**2 - (A**2).sum(axis=(1, 2))).max() < 1e-7  # balancedness conserved
    assert risk[-1] < 1e-9 and np.all(np.diff(risk) < 0)
    inv = np.linalg.inv(sigma)
    assert abs(b_star - np.trace(inv @ inv) ** 0.25) < 1e-12


def test_full_model_flow_decreases_the_risk_and_keeps_the_symmetry():
    """Gradient flow on the §6 closed form: R∞ decreases; the rescaling invariants Q→cQ, K→K/c are conserved."""
    task = RegressionTask(toeplitz_covariance(3, 0.5, dtype=torch.float64), 1 / 3, 0.1)
    params0 = models.init_parameters(4, stream_generator(1, "test/flow"))
    times = np.linspace(0, 20, 11)
    thetas, risks = full_model_flow(task, params0, times)
    assert np.all(np.diff(risks) < 1e-12) and risks[-1] < 0.7 * risks[0]
    norms = lambda th: {n: float(p.norm() ** 2) for n, p in models.unflatten(torch.tensor(th), 4).items()}  # noqa: E731
    n0, n1 = norms(thetas[0]), norms(thetas[-1])
    # gradient flow on a function of KᵀQ conserves QQᵀ − KKᵀ, in particular ‖Q‖² − ‖K‖²; likewise ‖V‖² − ‖O‖²
    assert abs((n1["Q"] - n1["K"]) - (n0["Q"] - n0["K"])) < 1e-6
    assert abs((n1["V"] - n1["O"]) - (n0["V"] - n0["O"])) < 1e-6
    p = models.unflatten(torch.tensor(thetas[-1]), 4)
    assert abs(float(infinite_prompt_risk(task, p["Q"], p["K"], p["V"], p["O"])) - risks[-1]) < 1e-12


def _block_sparse_loss(U, Vmat, query, prompt, target):
    """ŷ = e_Dᵀ V Σᵢ softmax(⟨U z_q, zᵢ⟩) zᵢ with a full value matrix V [D, D]."""
    pred = models.readout(query, prompt, U, Vmat[-1], "softmax")
    return models.mse(pred, target)


@pytest.mark.parametrize("mirrored", [True, False])
def test_block_sparse_family_is_invariant_under_autograd(mirrored):
    """THEORY §F(i): on mirrored batches (y → −y) the gradient at W = diag(A, 0), V = diag(0, v) stays in the family."""
    d = 3
    task = RegressionTask(toeplitz_covariance(d, 0.4, dtype=torch.float64), 1.0, 0.25)
    gen = stream_generator(6, "test/symmetry")
    query, prompt, target = task.sample(256, 30, gen)
    if mirrored:
        flip = torch.ones(d + 1, dtype=torch.float64)
        flip[-1] = -1.0
        query, prompt, target = torch.cat([query, query]), torch.cat([prompt, prompt * flip]), torch.cat([target, -target])
    A = 0.5 * torch.randn(d, d, generator=gen, dtype=torch.float64)
    U, u = reduced_attention(torch.tensor(1.3, dtype=torch.float64), A)
    Vmat = torch.zeros(d + 1, d + 1, dtype=torch.float64)
    Vmat[-1] = u
    support_U = torch.zeros(d + 1, d + 1, dtype=torch.bool)
    support_U[:d, :d] = True
    support_V = torch.zeros(d + 1, d + 1, dtype=torch.bool)
    support_V[d, d] = True
    U.requires_grad_(True)
    Vmat.requires_grad_(True)
    for _ in range(30):
        gU, gV = torch.autograd.grad(_block_sparse_loss(U, Vmat, query, prompt, target), [U, Vmat])
        scale = max(float(gU.abs().max()), float(gV.abs().max()))
        off = max(float(gU[~support_U].abs().max()), float(gV[~support_V].abs().max()))
        if not mirrored:
            assert off > 1e-4 * scale  # without mirroring the family is left: the check can fail
            return
        assert off <= 1e-13 * scale
        with torch.no_grad():
            U -= 0.1 * gU
            Vmat -= 0.1 * gV
    assert float(U.detach()[~support_U].abs().max()) < 1e-14
    assert float(Vmat.detach()[~support_V].abs().max()) < 1e-14


def test_reduced_sgd_tracks_the_flow_better_at_larger_L():
    """R4 in miniature: the SGD–flow distance at L = 200 is well below that at L = 20 (same batches per step)."""
    d = 3
    task = RegressionTask(np.eye(d), 1.0, 0.25)
    gaps = {}
    for L in (20, 200):
        steps, v, A = reduced_model_sgd(task, 2.0, 0.1 * np.eye(d), L, 0.02, 25, 512, 1, 0, log_every=5)
        v_inf, a_inf = isotropic_flow(2.0, 0.1, d, 0.02 * steps)
        gaps[L] = np.sqrt((v - v_inf) ** 2 + ((A - a_inf[:, None, None] * np.eye(d)) ** 2).sum(axis=(1, 2))).max()
    assert gaps[200] < 0.4 * gaps[20], gaps
