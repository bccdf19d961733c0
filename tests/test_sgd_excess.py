"""SGD's stationary excess (largeprompt.icl.sgd_excess, docs/theory.md#sgd-stationary-excess): per-prompt gradients
against autograd, tr Σ₁ against its closed form, and η·tr Σ₁/(4B) against a simulated SGD chain."""
import numpy as np
import torch

from largeprompt.icl import models
from largeprompt.icl.sgd_excess import gradient_noise_trace, per_prompt_gradients, stationary_excess
from largeprompt.icl.task import RegressionTask
from tolerance import MC_Z, rounding_tolerance


def test_per_prompt_gradients_are_autograd_of_each_prompts_loss():
    gen = torch.Generator().manual_seed(0)
    task = RegressionTask(torch.eye(3, dtype=torch.float64), 1 / 3, 0.1)
    params = models.init_parameters(4, gen)
    query, prompt, target = task.sample(5, 30, gen)
    for model in models.MODELS:
        got = per_prompt_gradients(params, query, prompt.contiguous(), target, model)
        for b in range(5):
            leaf = {k: v.clone().requires_grad_(True) for k, v in params.items()}
            ((models.predict_naive(leaf, query[b : b + 1], prompt[b : b + 1], model)[0] - target[b]) ** 2).backward()
            ref = torch.cat([leaf[n].grad.reshape(-1) for n in models.PARAMETER_NAMES])
            tol = rounding_tolerance(50 * 30, float(ref.abs().max()) + 1.0)
            assert float((got[b] - ref).abs().max()) <= tol


def test_gradient_noise_trace_of_a_zero_readout_is_the_label_variance_times_the_readout_gradient():
    """With O = 0 the prediction is 0, so ∇_O ℓ = −2y·(V head)ᵀ and every other gradient vanishes: tr Σ₁ is
    4 E[y² ‖V head‖²] − ‖E[…]‖², estimated here by the function and by an independent plain Monte Carlo."""
    gen = torch.Generator().manual_seed(1)
    task = RegressionTask(torch.eye(2, dtype=torch.float64), 0.5, 0.1)
    params = models.init_parameters(3, gen)
    params["O"] = torch.zeros_like(params["O"])
    trace, se = gradient_noise_trace(params, task, 20, "linear", 4000, torch.Generator().manual_seed(2))
    query, prompt, target = task.sample(20000, 20, torch.Generator().manual_seed(3))
    scores = (prompt @ params["K"].T @ (query @ params["Q"].T).unsqueeze(-1)).squeeze(-1) / np.sqrt(3) / 20
    head = (scores.unsqueeze(-2) @ (prompt @ params["V"].T)).squeeze(-2)  # [N, D]
    g = -2 * target[:, None] * head  # ∇_O ℓ, [N, D]
    ref = float((g * g).sum(1).mean() - (g.mean(0) ** 2).sum())
    ref_se = float((g * g).sum(1).std() / np.sqrt(len(g)))
    assert abs(trace - ref) <= MC_Z * np.hypot(se, ref_se)


def test_stationary_excess_matches_simulated_sgd_on_least_squares():
    """Least squares ℓ = (wᵀx − y)², x ~ N(0, I_d), y = w*ᵀx + σε: at w*, ∇ℓ = −2σεx, so tr Σ₁ = 4σ²d and the
    predicted excess is η·σ²d/B. A long SGD chain's mean excess E(w − w*)ᵀ(w − w*) matches it to its Monte Carlo
    error plus the O(η²) term (relative ηλ_max = 2η here)."""
    rng = np.random.default_rng(4)
    d, sigma, lr, batch, steps, burn = 4, 0.5, 0.02, 8, 200_000, 5_000
    w = np.zeros(d)
    x = rng.standard_normal((steps, batch, d))
    eps = rng.standard_normal((steps, batch))
    excess = np.empty(steps)
    for k in range(steps):  # w − w* follows the chain (the target's w* drops out)
        residual = x[k] @ w - sigma * eps[k]
        w -= lr * 2 * (x[k].T @ residual) / batch
        excess[k] = w @ w
    predicted = stationary_excess(lr, batch, 4 * sigma**2 * d)
    tail = excess[burn:]
    blocks = tail[: len(tail) // 1000 * 1000].reshape(1000, -1).mean(1)  # batch means: the chain is correlated
    mc = blocks.std(ddof=1) / np.sqrt(len(blocks))
    assert abs(tail.mean() - predicted) <= MC_Z * mc + 2 * (2 * lr) * predicted


def test_test_set_term_has_variance_four_excess_risk_over_n():
    """docs/theory.md#sgd-test-set-term on least squares (Σ₁ = 2R·H exactly, R = σ²): over many test sets of N
    prompts, the test-set difference R̂(w* + δ) − R̂(w*) at one fixed displacement δ has mean x = ½δᵀHδ and variance
    4·R·x/N + 2x²/N (the first-order term and the quadratic one), checked against the readings' constant."""
    from largeprompt.ledger.training_readings import TEST_SET_VARIANCE_PER_EXCESS

    rng = np.random.default_rng(11)
    d, sigma, n, n_sets = 4, 0.5, 400, 20_000
    scales = np.array([1.0, 0.5, 2.0, 1.5])
    delta = 0.03 * rng.standard_normal(d)
    x = float(np.sum((scales * delta) ** 2))  # ½δᵀHδ with H = 2Σ_x, Σ_x = diag(scales²)
    feats = scales * rng.standard_normal((n_sets, n, d))
    resid = sigma * rng.standard_normal((n_sets, n))  # y − x·w* at w*
    diffs = ((feats @ delta) ** 2 - 2 * resid * (feats @ delta)).mean(axis=1)  # ℓ(w* + δ) − ℓ(w*), averaged per set
    predicted = TEST_SET_VARIANCE_PER_EXCESS * sigma**2 * x / n + 2 * x**2 / n
    var_se = diffs.var() * np.sqrt(2 / (n_sets - 1))  # of a sample variance (near-Gaussian diffs)
    assert abs(diffs.mean() - x) <= MC_Z * diffs.std() / np.sqrt(n_sets)
    assert abs(diffs.var() - predicted) <= MC_Z * var_se
