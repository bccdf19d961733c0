"""Infinite-prompt flows against their closed forms (docs/theory.md#isotropic-flow, #balanced-flow) and the
block-sparse symmetry (docs/theory.md#block-sparse-family).

ODE results are held to the solver's own tolerances (RTOL, ATOL, passed explicitly) through
``tolerance.ode_tolerance``; closed forms and cancellations to rounding bounds derived from eps.
"""
import math

import numpy as np
import pytest
import torch

from largeprompt.core.seeding import stream_generator
from largeprompt.icl import models
from largeprompt.icl.dynamics import (
    balanced_flow,
    balanced_risk,
    bayes_point,
    full_model_flow,
    full_model_gradient_descent,
    isotropic_flow,
    isotropic_product,
    reduced_attention,
    reduced_flow,
    reduced_model_sgd,
)
from largeprompt.icl.risks import infinite_prompt_risk
from largeprompt.icl.task import RegressionTask
from largeprompt.maths.measures import toeplitz_covariance
from tolerance import assert_within, gamma, infinite_prompt_risk_abs, ode_tolerance, rounding_tolerance, sum_tolerance

TIMES = np.linspace(0.0, 1.5, 16)
RTOL, ATOL = 1e-10, 1e-12  # solve_ivp local tolerances for every flow below; the tests' bounds derive from them
ROOT_TOL = 1e-15  # isotropic_product's brentq xtol = rtol and its bracket margin below p = 1


def _psi(p, c, d):
    """Ψ(p) = (1/k) ln((c² + 4dp + k√(c² + 4dp²))/|1 − p|), k = √(c² + 4d): Ψ(p(t)) = Ψ(p0) + 2t."""
    k = math.sqrt(c * c + 4 * d)
    return math.log((c * c + 4 * d * p + k * math.sqrt(c * c + 4 * d * p * p)) / abs(1.0 - p)) / k


def _psi_inversion_tolerance(p, p0, c, d, times):
    """Error of p(t) from Ψ⁻¹(Ψ(p0) + 2t): brentq's tolerance plus the rounding of Ψ (≈16 operations, values
    ≤ |Ψ(p0)| + 2t + 1) mapped through dp/dΨ = ṗ/2 = (1 − p)√(c² + 4dp²)."""
    slope = np.abs(1.0 - p) * np.sqrt(c * c + 4 * d * p * p)
    return 3 * ROOT_TOL * (1 + np.abs(p)) + rounding_tolerance(16, (abs(_psi(p0, c, d)) + 2 * times + 1) * slope)


@pytest.mark.parametrize("d,v0,a0", [(3, 2.0, 0.1), (3, 1.0, 0.2), (2, -1.5, 0.3), (4, 0.2, 0.5)])
def test_reduced_ode_matches_the_psi_solution(d, v0, a0):
    """ODE integration of (v, A) on R∞ from A0 = a0 I against Ψ(p(t)) = Ψ(p0) + 2t (docs/theory.md#isotropic-flow)."""
    task = RegressionTask(np.eye(d), 1.0, 0.25)
    v, A, risk = reduced_flow(task, v0, a0 * np.eye(d), TIMES, rtol=RTOL, atol=ATOL)
    v_cf, a_cf = isotropic_flow(v0, a0, d, TIMES)
    diag = np.diagonal(A, axis1=1, axis2=2)  # [T, d]
    scale = max(np.abs(v).max(), np.abs(A).max())
    tol = ode_tolerance(RTOL, ATOL, scale)  # the closed form's own error (≈ ROOT_TOL) is far below
    assert_within(v, v_cf, tol, "v(t)")
    assert_within(diag, a_cf[:, None], tol, "a(t)")
    # stays isotropic: off-diagonal entries and diagonal spread within the solver's error
    assert_within(A, np.einsum("t,ij->tij", diag[:, 0], np.eye(d)), 2 * tol, "isotropy")
    c = v0**2 - d * a0**2
    # balancedness v² − d a² = c conserved: δ(v² − da²) ≤ 2(|v| + d|a|)·δ
    assert_within(v**2 - d * diag[:, 0] ** 2, c, 2 * (np.abs(v) + d * np.abs(diag[:, 0])) * tol, "balancedness")
    # the returned risk is R∞ at the returned (v, A): τ² Σ(vA − I)² + σ², rounding only (|·| evaluation, both sides)
    risk_abs = 0.25 + ((np.abs(v)[:, None, None] * np.abs(A) + np.eye(d)) ** 2).sum(axis=(1, 2))
    assert_within(risk, 0.25 + d * (v * A[:, 0, 0] - 1) ** 2, 2 * rounding_tolerance(3 * d + 6, risk_abs), "risk")


def test_balanced_isotropic_flow_is_logistic():
    """c = 0: p(t) = [1 + (1/p0 − 1)e^{−4√d t}]⁻¹, both for the Ψ solution and the ODE."""
    d, a0 = 3, 0.2
    v0 = math.sqrt(d) * a0
    p0 = v0 * a0
    rate = 4.0 * math.sqrt(d)
    logistic = 1.0 / (1.0 + (1.0 / p0 - 1.0) * np.exp(-rate * TIMES))
    # the same six-operation formula on both sides; exp has condition number |rate·t|
    closed_tol = 2 * rounding_tolerance(6 + 2 * rate * TIMES, logistic)
    assert_within(isotropic_product(p0, 0.0, d, TIMES), logistic, closed_tol, "logistic branch")
    # the Ψ branch agrees as c → 0: dṗ/dc = 0 at c = 0, so the O(c²t) model gap (1e-18) is below rounding
    psi_branch = isotropic_product(p0, 1e-9, d, TIMES)
    assert_within(psi_branch, logistic, _psi_inversion_tolerance(logistic, p0, 1e-9, d, TIMES) + closed_tol, "Ψ branch")
    v, A, _ = reduced_flow(RegressionTask(np.eye(d), 1.0, 0.1), v0, a0 * np.eye(d), TIMES, rtol=RTOL, atol=ATOL)
    tol = ode_tolerance(RTOL, ATOL, max(np.abs(v).max(), np.abs(A).max()))
    assert_within(v * A[:, 0, 0], logistic, (np.abs(v) + np.abs(A[:, 0, 0])) * tol, "ODE p = va")


def test_psi_limit_and_saddle():
    d, c = 3, 0.7
    k = math.sqrt(c * c + 4 * d)
    v0 = math.sqrt(c + d * 0.01)
    v, a = isotropic_flow(v0, 0.1, d, [200.0])  # p(200) = 1 up to the root finder: δp ≤ 2·ROOT_TOL
    # a² = p²/v² has |d ln a²/d ln p| ≤ 2; ten roundings in v and a
    assert_within(a[0] ** 2, (k - c) / (2 * d), (k - c) / (2 * d) * (4 * ROOT_TOL + gamma(10)), "a² limit")
    assert_within(v[0] * a[0], 1.0, 2 * ROOT_TOL + gamma(10), "va limit")
    # c = 0, p0 < 0: logistic towards the saddle, p(t) = p0 e^{−λt}/(1 − p0) · (1 + O(e^{−λt}))
    p0, t, lam = -0.1, 5.0, 4.0 * math.sqrt(d)
    p = isotropic_product(p0, 0.0, d, [t])[0]
    q = abs(p0) * math.exp(-lam * t) / (1.0 - p0)  # p = asymptote / (1 − q) exactly
    asymptote = p0 * math.exp(-lam * t) / (1.0 - p0)
    remainder = abs(asymptote) * q / (1.0 - q)
    assert p < 0
    assert_within(p, asymptote, remainder + 2 * rounding_tolerance(6 + 2 * lam * t, abs(asymptote)), "saddle")
    task = RegressionTask(np.eye(d), 1.0, 0.1)
    v, A, _ = reduced_flow(task, -0.2 * math.sqrt(d), 0.2 * np.eye(d), TIMES, rtol=RTOL, atol=ATOL)
    p_cf = isotropic_product(-0.2 * 0.2 * math.sqrt(d), 0.0, d, TIMES)
    tol = ode_tolerance(RTOL, ATOL, max(np.abs(v).max(), np.abs(A).max()))
    assert_within(v * A[:, 0, 0], p_cf, (np.abs(v) + np.abs(A[:, 0, 0])) * tol, "ODE towards the saddle")


def test_balanced_flow_reaches_the_bayes_point():
    """R5: from b = ‖A‖_F = α the flow converges to b* = tr(Σ⁻²)^{1/4}, A* = tr(Σ⁻²)^{−1/4}Σ⁻¹.

    Horizon 200: the slowest mode (smallest non-zero Hessian eigenvalue ≈ 0.23 at the Bayes point) has then
    decayed by e^{−46}, so what is left is the solver's error.
    """
    sigma = toeplitz_covariance(5, 0.5, dtype=torch.float64).numpy()
    b_star, A_star = bayes_point(sigma)
    times = np.linspace(0, 200, 7)
    A, b, risk = balanced_flow(sigma, 1.0, times, rtol=RTOL, atol=ATOL)
    tol = ode_tolerance(RTOL, ATOL, max(np.abs(A).max(), np.abs(b).max()))
    assert_within(b[-1], b_star, tol, "b*")
    assert_within(A[-1], A_star, tol, "A*")
    # balancedness b² − ‖A‖² conserved: δ ≤ 2(|b| + Σ|A_ij|)·tol
    assert_within(b**2 - (A**2).sum(axis=(1, 2)), 0.0, 2 * (np.abs(b) + np.abs(A).sum(axis=(1, 2))) * tol, "balancedness")
    # near the minimum R ≤ ½ λ_max ‖θ − θ*‖²; λ_max from the Hessian at θ*, ‖θ − θ*‖ ≤ √P·tol
    theta_star = torch.tensor(np.concatenate([A_star.ravel(), [b_star]]))
    sig = torch.tensor(sigma)
    hess = torch.autograd.functional.hessian(lambda th: balanced_risk(th[:-1].reshape(5, 5), th[-1], sig), theta_star)
    risk_tol = 0.5 * float(torch.linalg.eigvalsh(hess)[-1]) * len(theta_star) * tol**2
    assert_within(risk[-1], 0.0, risk_tol, "R at the end")
    assert np.all(np.diff(risk) < risk_tol)  # decreasing, up to the solver's error at the end
    # independent value: tr(Σ⁻²) from the eigenvalues of Σ; inversion is accurate to ≈ d·cond(Σ)·u
    evals = np.linalg.eigvalsh(sigma)
    cond = evals[-1] / evals[0]
    assert_within(b_star, np.sum(evals**-2.0) ** 0.25, b_star * gamma(4 * 5 * cond), "b* formula")


def test_gradient_descent_on_r_inf_has_the_euler_error_of_its_step():
    """docs/theory.md#euler-floor: plain GD with step lr on R∞ stays within C·lr of the flow at t = lr·k, so halving
    lr halves its distance to the flow (up to O(lr²)); the first step is θ₀ − lr ∇R∞(θ₀) by autograd."""
    task = RegressionTask(toeplitz_covariance(3, 0.5, dtype=torch.float64), 1 / 3, 0.1)
    params0 = models.init_parameters(4, stream_generator(1, "test/flow"))
    times = np.linspace(0, 2, 11)
    flow, _ = full_model_flow(task, params0, times, rtol=1e-11, atol=1e-13)
    errors = {}
    for lr in (0.04, 0.02, 0.01):
        steps = np.rint(times / lr).astype(int)
        descent = full_model_gradient_descent(task, params0, lr, steps)
        errors[lr] = np.linalg.norm(descent - flow, axis=1).max()
    # the ODE's own error (≈ 1e-9) is far below these (≥ 1e-4 here); the O(lr²) term moves each ratio by ≈ lr·C'
    assert errors[0.01] > 1e3 * 1e-9
    assert 1.8 < errors[0.04] / errors[0.02] < 2.2 and 1.9 < errors[0.02] / errors[0.01] < 2.1, errors
    theta0 = models.flatten({k: v.to(torch.float64) for k, v in params0.items()}).requires_grad_(True)
    p = models.unflatten(theta0, 4)
    grad = torch.autograd.grad(infinite_prompt_risk(task, p["Q"], p["K"], p["V"], p["O"]), theta0)[0]
    first = full_model_gradient_descent(task, params0, 0.01, [1, 0])
    theta0, grad = theta0.detach().numpy(), grad.numpy()
    # two float64 evaluations of the same gradient (closed form, autograd), scaled by lr: a few hundred eps of θ
    assert_within(first[0], theta0 - 0.01 * grad, 1e3 * np.finfo(np.float64).eps * (1 + np.abs(theta0).max()), "GD step")
    assert np.array_equal(first[1], theta0)


def test_full_model_flow_decreases_the_risk_and_keeps_the_symmetry():
    """Gradient flow on the §6 closed form: R∞ decreases; the rescaling invariants Q→cQ, K→K/c are conserved."""
    task = RegressionTask(toeplitz_covariance(3, 0.5, dtype=torch.float64), 1 / 3, 0.1)
    params0 = models.init_parameters(4, stream_generator(1, "test/flow"))
    times = np.linspace(0, 20, 11)
    rtol, atol = 1e-9, 1e-11
    thetas, risks = full_model_flow(task, params0, times, rtol=rtol, atol=atol)
    tol = ode_tolerance(rtol, atol, np.abs(thetas).max())

    def risk_fn(th):
        p = models.unflatten(th, 4)
        return infinite_prompt_risk(task, p["Q"], p["K"], p["V"], p["O"])

    grad_norm = max(float(torch.autograd.grad(risk_fn(th), th)[0].norm())
                    for th in torch.tensor(thetas).requires_grad_(True).unbind(0))
    risk_tol = grad_norm * math.sqrt(thetas.shape[1]) * tol  # |R(θ̃) − R(θ)| ≤ ‖∇R‖‖θ̃ − θ‖
    assert np.all(np.diff(risks) < 2 * risk_tol) and risks[-1] < 0.7 * risks[0]
    params = [models.unflatten(torch.tensor(th), 4) for th in (thetas[0], thetas[-1])]
    sq = [{n: float(p.norm() ** 2) for n, p in ps.items()} for ps in params]
    l1 = {n: float(params[0][n].abs().sum() + params[1][n].abs().sum()) for n in "QKVO"}
    # gradient flow on a function of KᵀQ conserves QQᵀ − KKᵀ, in particular ‖Q‖² − ‖K‖²; likewise ‖V‖² − ‖O‖².
    # δ‖Q‖² ≤ 2Σ|Q_ij|·tol at each end
    assert_within(sq[1]["Q"] - sq[1]["K"], sq[0]["Q"] - sq[0]["K"], 2 * (l1["Q"] + l1["K"]) * tol, "‖Q‖² − ‖K‖²")
    assert_within(sq[1]["V"] - sq[1]["O"], sq[0]["V"] - sq[0]["O"], 2 * (l1["V"] + l1["O"]) * tol, "‖V‖² − ‖O‖²")
    # the returned risks are R∞ at the returned θ: the same closed form on the same θ, rounding only
    p = params[1]
    risk_abs = float(infinite_prompt_risk_abs(task, *(p[n].abs() for n in "QKVO")))
    assert_within(float(infinite_prompt_risk(task, p["Q"], p["K"], p["V"], p["O"])), risks[-1],
                  2 * rounding_tolerance(40, risk_abs), "R∞ at θ(T)")


def _block_sparse_loss(U, Vmat, query, prompt, target):
    """ŷ = e_Dᵀ V Σᵢ softmax(⟨U z_q, zᵢ⟩) zᵢ with a full value matrix V [D, D]."""
    pred = models.readout(query, prompt, U, Vmat[-1], "softmax")
    return models.mse(pred, target)


def _gradient_abs_sums(U, Vmat, query, prompt, target):
    """|·| evaluation of the loss gradient as the readout's backward computes it, entrywise for U and V [D, D].

    With p = softmax(s), wᵢ = uᵀzᵢ (u = V_D) and g_b = 2(ŷ_b − y_b)/B:
    ∂ℓ/∂U_jk = Σ_b g_b Σᵢ p_bi (w_bi − ŷ_b) z_bi,j z_q,b,k and ∂ℓ/∂V_Dj = Σ_b g_b Σᵢ p_bi z_bi,j, a sum of
    n = B·L prompt-token terms; every difference is replaced by the sum of the absolute values.
    """
    with torch.no_grad():
        u = Vmat[-1].abs()
        p = torch.softmax(torch.einsum("bd,bld->bl", query @ U.T, prompt), -1)  # [B, L]
        w = prompt.abs() @ u  # |u|ᵀ|zᵢ|, [B, L]
        y_hat = (p * w).sum(-1)  # [B]
        g = 2 * (y_hat + target.abs()) / len(target)  # [B]
        abs_u = torch.einsum("b,bl,bl,blj,bk->jk", g, p, w + y_hat[:, None], prompt.abs(), query.abs())
        abs_v = torch.zeros_like(Vmat)
        abs_v[-1] = torch.einsum("b,bl,blj->j", g, p, prompt.abs())
    return abs_u, abs_v


@pytest.mark.parametrize("mirrored", [True, False])
def test_block_sparse_family_is_invariant_under_autograd(mirrored):
    """On mirrored batches (y → −y) the gradient at W = diag(A, 0), V = diag(0, v) stays in the family
    (docs/theory.md#block-sparse-family), at 30 points of a gradient-descent path inside the family.

    Off the support the gradient is an exactly cancelling sum, so in floating point it is bounded by
    γ_n Σ|terms| over the n = B·L prompt-token terms. The family is invariant but not attracting: off-family
    offsets grow by up to ≈ 2.6× per step at this learning rate, so the path is projected back onto the family
    after each step (otherwise rounding-level offsets grow to ~1e-8 within 30 steps, as any perturbation
    would in exact arithmetic).
    """
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
    n_terms = prompt.shape[0] * prompt.shape[1] + 4 * prompt.shape[1] + 4 * (d + 1) + 16  # sums, softmax, scores
    for _ in range(30):
        gU, gV = torch.autograd.grad(_block_sparse_loss(U, Vmat, query, prompt, target), [U, Vmat])
        abs_u, abs_v = _gradient_abs_sums(U.detach(), Vmat.detach(), query, prompt, target)
        tol_u, tol_v = sum_tolerance(n_terms, abs_u)[~support_U], sum_tolerance(n_terms, abs_v)[~support_V]
        if not mirrored:  # negative control: without mirroring the family is left, far above the bound
            assert torch.any(gU[~support_U].abs() > 1e6 * tol_u) and torch.any(gV[~support_V].abs() > 1e6 * tol_v)
            return
        assert_within(gU[~support_U], 0.0, tol_u, "∂ℓ/∂U off the family")
        assert_within(gV[~support_V], 0.0, tol_v, "∂ℓ/∂V off the family")
        with torch.no_grad():
            U -= 0.1 * gU * support_U
            Vmat -= 0.1 * gV * support_V


def test_reduced_sgd_tracks_the_flow_better_at_larger_L():
    """R4 in miniature: the SGD–flow distance at L = 200 is well below that at L = 20 (same batches per step)."""
    d = 3
    task = RegressionTask(np.eye(d), 1.0, 0.25)
    gaps = {}
    for L in (20, 200):
        steps, v, A, *_ = reduced_model_sgd(task, 2.0, 0.1 * np.eye(d), L, 0.02, 25, 512, 1, 0, log_every=5)
        v_inf, a_inf = isotropic_flow(2.0, 0.1, d, 0.02 * steps)
        gaps[L] = np.sqrt((v - v_inf) ** 2 + ((A - a_inf[:, None, None] * np.eye(d)) ** 2).sum(axis=(1, 2))).max()
    assert gaps[200] < 0.4 * gaps[20], gaps
