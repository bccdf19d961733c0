"""In-context regression task and its closed forms (docs/theory.md#icl-task, #full-model-infinite-prompt-risk,
#reduced-infinite-prompt-risk, #linear-attention-optimum) against Monte Carlo (tolerances in standard errors)
and against each other (rounding bounds from eps, tests/tolerance.py).
"""
import math

import numpy as np
import pytest
import torch

from largeprompt.core.seeding import stream_generator
from largeprompt.icl.risks import infinite_prompt_risk, linear_attention_fixed_point, reduced_infinite_prompt_risk
from largeprompt.icl.task import RegressionTask, ridge_predictions
from largeprompt.maths.measures import toeplitz_covariance
from tolerance import assert_within, infinite_prompt_risk_abs, mc_tolerance, rounding_tolerance


def paper_task():
    return RegressionTask(toeplitz_covariance(5, 0.5, dtype=torch.float64), 0.2, 0.1)


def test_sample_shapes_and_law():
    task = paper_task()
    gen = stream_generator(1, "test/sample")
    query, prompt, target, beta = task.sample_with_tasks(4000, 7, gen)
    assert query.shape == (4000, 6) and prompt.shape == (4000, 7, 6) and target.shape == (4000,)
    assert torch.all(query[:, -1] == 0)  # z_q = (x_q, 0)
    lam = task.covariance
    # Gaussian second moments (known zero mean): Var(x_i x_j) = Λ_iiΛ_jj + Λ_ij²
    moment_sd = torch.sqrt(torch.outer(torch.diagonal(lam), torch.diagonal(lam)) + lam**2)
    x = prompt[..., :5].reshape(-1, 5)
    cov = x.T @ x / len(x)
    assert_within(cov, lam, mc_tolerance(moment_sd / math.sqrt(len(x))), "prompt Λ")  # Λ applied once to every x
    xq_cov = query[:, :5].T @ query[:, :5] / len(query)
    # ...the query included (unlike the authors' code)
    assert_within(xq_cov, lam, mc_tolerance(moment_sd / math.sqrt(len(query))), "query Λ")
    resid = prompt[..., 5] - (prompt[..., :5] @ beta[:, :, None]).squeeze(-1)
    # sample variance of n normal draws: standard error v·√(2/(n − 1))
    assert_within(float(resid.var()), 0.1, mc_tolerance(0.1 * math.sqrt(2 / (resid.numel() - 1))), "σ²")
    assert_within(float(beta.var()), 0.2, mc_tolerance(0.2 * math.sqrt(2 / (beta.numel() - 1))), "τ²")
    # same stream, same numbers
    again = task.sample(4000, 7, stream_generator(1, "test/sample"))
    assert torch.equal(again[1], prompt)


def monte_carlo_infinite_risk(task, Q, K, V, O, n, seed):
    """E(ŷ∞ − y_q)² with ŷ∞ = uᵀ S_β U z_q built token by token from S_β (docs/theory.md#full-model-infinite-prompt-risk),
    not from c₀, C₁, c₂."""
    d, D = task.dim, task.token_dim
    gen = stream_generator(seed, "test/mc_risk")
    lam = task.covariance
    beta = torch.randn(n, d, generator=gen, dtype=torch.float64) * task.task_variance**0.5
    xq = torch.randn(n, d, generator=gen, dtype=torch.float64) @ torch.linalg.cholesky(lam).T
    yq = (xq * beta).sum(-1) + task.noise_variance**0.5 * torch.randn(n, generator=gen, dtype=torch.float64)
    S = torch.zeros(n, D, D, dtype=torch.float64)  # covariance of a token z = (x, y) given β
    S[:, :d, :d] = lam
    lb = beta @ lam  # [n, d]
    S[:, :d, d] = lb
    S[:, d, :d] = lb
    S[:, d, d] = (lb * beta).sum(-1) + task.noise_variance
    U = K.T @ Q / D**0.5
    zq = torch.cat([xq, torch.zeros(n, 1, dtype=torch.float64)], dim=-1)
    a = zq @ U.T  # [n, D]
    pred = ((S @ a[:, :, None]).squeeze(-1) @ V.T @ O.T).squeeze(-1)  # O V S_β a
    err2 = (pred - yq) ** 2
    return float(err2.mean()), float(err2.std() / n**0.5)


@pytest.mark.parametrize("scale,seed", [(0.4, 0), (0.8, 1), (1.2, 2)])
def test_infinite_prompt_risk_matches_monte_carlo(scale, seed):
    task = RegressionTask(toeplitz_covariance(3, 0.6, dtype=torch.float64), 0.7, 0.3)
    gen = stream_generator(seed, "test/weights")
    Q, K, V = (scale * torch.randn(4, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    O = scale * torch.randn(1, 4, generator=gen, dtype=torch.float64)
    closed = float(infinite_prompt_risk(task, Q, K, V, O))
    mc, se = monte_carlo_infinite_risk(task, Q, K, V, O, 400_000, seed)
    assert_within(mc, closed, mc_tolerance(se), "R∞")


def test_infinite_prompt_risk_minimum_is_noise():
    """At a Bayes point of the limit (u_y m_y = 0, u_y M_xᵀΛ = I) the risk is σ²; gradients vanish there."""
    task = paper_task()
    d, D = 5, 6
    lam = task.covariance
    Q = torch.zeros(D, D, dtype=torch.float64)
    Q[:d, :d] = torch.linalg.inv(lam) * D**0.5  # U = KᵀQ/√D with K = I: M_x = Λ⁻¹ (so M_xᵀΛ = I)
    K = torch.eye(D, dtype=torch.float64)
    V = torch.zeros(D, D, dtype=torch.float64)
    V[d, d] = 1.0
    O = torch.zeros(1, D, dtype=torch.float64)
    O[0, d] = 1.0
    params = [p.clone().requires_grad_(True) for p in (Q, K, V, O)]
    risk = infinite_prompt_risk(task, *params)
    # rounding: γ_N times the |·| evaluation (N: chains of three D×D products, traces, five terms);
    # the point's own error (Λ⁻¹ to ≈ d·cond(Λ)·u) moves R only at second order
    n_ops = 8 * D
    abs_params = [p.abs().requires_grad_(True) for p in (Q, K, V, O)]
    risk_abs = infinite_prompt_risk_abs(task, *abs_params)
    assert_within(float(risk.detach()), 0.1, rounding_tolerance(n_ops, float(risk_abs.detach())), "R∞ at the Bayes point")
    grads = torch.autograd.grad(risk, params)
    # ∇R: γ_N times the gradient of the |·| evaluation, plus |∇²R|·|δQ| for the point's error δQ
    grads_abs = torch.autograd.grad(risk_abs, abs_params)
    cond = float(torch.linalg.cond(lam))
    delta_q = torch.zeros(D, D, dtype=torch.float64)
    delta_q[:d, :d] = rounding_tolerance(d * cond, Q[:d, :d].abs().max())
    flat = torch.cat([p.reshape(-1) for p in (Q, K, V, O)])

    def risk_flat(theta):
        q, k, v, o = torch.split(theta, [D * D, D * D, D * D, D])
        return infinite_prompt_risk(task, q.reshape(D, D), k.reshape(D, D), v.reshape(D, D), o.reshape(1, D))

    hess = torch.autograd.functional.hessian(risk_flat, flat)
    delta = torch.cat([delta_q.reshape(-1), torch.zeros(2 * D * D + D, dtype=torch.float64)])
    from_point = torch.split(hess.abs() @ delta, [D * D, D * D, D * D, D])
    for g, g_abs, extra in zip(grads, grads_abs, from_point):
        assert_within(g, 0.0, rounding_tolerance(n_ops, g_abs) + extra.reshape(g.shape), "∇R∞ at the Bayes point")


def test_reduced_risk_is_the_full_risk_on_the_block_sparse_family():
    """R∞(v, A) (docs/theory.md#reduced-infinite-prompt-risk) equals the §6 closed form at U = diag(Aᵀ, 0), u = v e_D."""
    task = RegressionTask(toeplitz_covariance(3, 0.3, dtype=torch.float64), 0.5, 0.2)
    gen = stream_generator(3, "test/reduced")
    A = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    v = torch.tensor(0.7, dtype=torch.float64)
    Q = torch.zeros(4, 4, dtype=torch.float64)
    Q[:3, :3] = A.T * 2.0  # U = KᵀQ/√D with K = I, D = 4
    K = torch.eye(4, dtype=torch.float64)
    V = torch.zeros(4, 4, dtype=torch.float64)
    V[3, 3] = float(v)
    O = torch.zeros(1, 4, dtype=torch.float64)
    O[0, 3] = 1.0
    full = float(infinite_prompt_risk(task, Q, K, V, O))
    reduced = float(reduced_infinite_prompt_risk(task, v, A))
    lam = task.covariance.abs()
    G_abs = abs(float(v)) * A.abs() @ lam + torch.eye(3, dtype=torch.float64)  # |·| of vAΛ − I
    reduced_abs = task.task_variance * torch.trace(G_abs.T @ lam @ G_abs) + task.noise_variance
    full_abs = infinite_prompt_risk_abs(task, Q.abs(), K, V.abs(), O.abs())
    assert_within(full, reduced, rounding_tolerance(8 * 4, float(full_abs + reduced_abs)), "R∞ two ways")


def test_linear_attention_fixed_point_with_noisy_labels():
    """Γ* = ((1 + 1/L)Λ + (trΛ + σ²/τ²)/L I)⁻¹ is the least-squares Γ of ŷ = x_qᵀ Γ m̂
    (docs/theory.md#linear-attention-optimum).

    Independent check: Monte Carlo normal equations over vec(x_q m̂ᵀ), within 5 sandwich standard errors;
    the noiseless (ZFB) formula is rejected.
    """
    d, L, tau2, sigma2 = 3, 6, 0.7, 0.8
    lam = toeplitz_covariance(d, 0.4, dtype=torch.float64)
    task = RegressionTask(lam, tau2, sigma2)
    n = 300_000
    query, prompt, target = task.sample(n, L, stream_generator(4, "test/gamma"))
    m_hat = (prompt[..., -1:] * prompt[..., :-1]).mean(1)  # [n, d]  (1/L) Σ yᵢxᵢ
    phi = (query[:, :d, None] * m_hat[:, None, :]).reshape(n, -1)  # ŷ = Σ_jk Γ_jk x_qj m̂_k
    gram = phi.T @ phi / n
    coef = torch.linalg.solve(gram, phi.T @ target / n)
    # sandwich covariance of least-squares coefficients: G⁻¹ E[φφᵀr²] G⁻¹ / n
    scores = phi * (target - phi @ coef)[:, None]
    inv = torch.linalg.inv(gram)
    se = torch.sqrt(torch.diagonal(inv @ (scores.T @ scores / n) @ inv) / n).reshape(d, d).numpy()
    gamma_mc = coef.reshape(d, d).numpy()
    gamma = linear_attention_fixed_point(lam.numpy(), tau2, sigma2, L)
    zfb = linear_attention_fixed_point(lam.numpy(), tau2, 0.0, L)
    assert_within(gamma_mc, gamma, mc_tolerance(se), "Γ*")
    # the same check rejects the noiseless formula, by more than twice its tolerance: it tells noisy from noiseless labels
    assert np.any(np.abs(gamma_mc - zfb) > 2 * mc_tolerance(se))


def test_ridge_is_the_posterior_mean():
    """With λ = σ²/τ² the ridge predictor beats other ridges on fresh data (it is Bayes-optimal)."""
    task = RegressionTask(toeplitz_covariance(3, 0.5, dtype=torch.float64), 0.5, 0.5)
    query, prompt, target = task.sample(200_000, 4, stream_generator(5, "test/ridge"))
    risks = {lam: float(((ridge_predictions(query, prompt, lam) - target) ** 2).mean()) for lam in (0.25, 1.0, 4.0)}
    assert risks[1.0] < risks[0.25] and risks[1.0] < risks[4.0], risks


def test_optimal_linear_attention_risk_by_monte_carlo_and_optimality():
    """R(Γ) of ŷ = x_qᵀΓm̂ (docs/theory.md#linear-attention-optimum, general τ²) against Monte Carlo; Γ* minimises it."""
    from largeprompt.icl.risks import linear_attention_fixed_point, linear_attention_risk, optimal_linear_attention_risk
    from largeprompt.maths.measures import toeplitz_covariance

    lam = toeplitz_covariance(3, 0.5).numpy()
    tau2, s2, L = 0.4, 0.3, 12
    task = RegressionTask(lam, tau2, s2)
    gamma = linear_attention_fixed_point(lam, tau2, s2, L)
    gen = torch.Generator().manual_seed(3)
    query, prompt, target = task.sample(400_000, L, gen)
    m_hat = (prompt[..., -1:] * prompt[..., :-1]).mean(1)  # (1/L) Σ yᵢxᵢ, [B, d]
    err2 = ((query[:, :-1] @ torch.tensor(gamma) * m_hat).sum(-1) - target) ** 2
    mc, se = float(err2.mean()), float(err2.std()) / math.sqrt(len(err2))
    assert_within(mc, optimal_linear_attention_risk(lam, tau2, s2, L), mc_tolerance(se), "R(Γ*)")
    # Γ* is the minimiser: any perturbation raises the risk, and the risk tends to σ² + the Bayes gap as L grows
    rng = np.random.default_rng(0)
    best = linear_attention_risk(gamma, lam, tau2, s2, L)
    for _ in range(5):
        assert linear_attention_risk(gamma + 1e-2 * rng.standard_normal((3, 3)), lam, tau2, s2, L) > best
    # R(Γ*_L) → σ² at least as fast as 1/L: the excess at L = 10⁷ is below twice the L = 10⁵ excess × 10⁵/10⁷,
    # up to the rounding of R (|·| scale τ²trΛ + σ² + τ²tr(ΓMΓᵀΛ) ≈ 3τ²trΛ + σ², a few dozen operations)
    excess = {n: optimal_linear_attention_risk(lam, tau2, s2, n) - s2 for n in (10**5, 10**7)}
    rounding = rounding_tolerance(64, 3 * tau2 * np.trace(lam) + s2)
    assert excess[10**5] > 0
    assert_within(excess[10**7], 0.0, 2 * excess[10**5] * 1e-2 + rounding, "R(Γ*) − σ² at L = 10⁷")
