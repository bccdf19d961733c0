"""Closed-form risks of the in-context regression task: R∞ of the §6 model and of the reduced model, the finite-L
correction and the valley optimum, and the best linear-attention risk R(Γ*) (docs/theory.md#full-model-infinite-prompt-risk,
docs/theory.md#reduced-infinite-prompt-risk, docs/theory.md#finite-prompt-correction, docs/theory.md#valley-optimum,
docs/theory.md#linear-attention-optimum)."""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from largeprompt.icl.task import RegressionTask


def infinite_prompt_risk(task: RegressionTask, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, O: torch.Tensor) -> torch.Tensor:
    """Closed-form R∞(θ) of the §6 Q/K/V/O model (docs/theory.md#full-model-infinite-prompt-risk), differentiable in Q, K, V [D, D] and O [1, D].

    With U = KᵀQ/√D, M = U[:, :d] = [M_x; m_yᵀ] and u = VᵀOᵀ = (u_x, u_y), the prediction error
    given β is r(β)ᵀx_q with r(β) = c₀ + C₁β + c₂ βᵀΛβ. Softmax and linear attention share this limit.
    """
    dtype, dev = Q.dtype, Q.device
    lam = task.covariance.to(dtype=dtype, device=dev)  # Λ [d, d]
    tau2, sigma2, d = task.task_variance, task.noise_variance, task.dim
    D = d + 1
    U = K.T @ Q / D**0.5  # [D, D]
    u = (O @ V).reshape(-1)  # [D]  u = VᵀOᵀ
    Mx, my = U[:d, :d], U[d, :d]  # [d, d], [d]
    ux, uy = u[:d], u[d]  # [d], []
    c0 = Mx.T @ lam @ ux + sigma2 * uy * my  # [d]
    C1 = uy * (Mx.T @ lam) + torch.outer(my, lam @ ux) - torch.eye(d, dtype=dtype, device=dev)  # [d, d]
    c2 = uy * my  # [d]
    tr, tr2 = torch.trace(lam), torch.trace(lam @ lam)
    return (
        c0 @ lam @ c0
        + tau2 * torch.trace(C1.T @ lam @ C1)
        + 2 * tau2 * tr * (c0 @ lam @ c2)
        + tau2**2 * (tr**2 + 2 * tr2) * (c2 @ lam @ c2)
        + sigma2
    )


def reduced_infinite_prompt_risk(task: RegressionTask, v: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """R∞ of the block-sparse (v, A) model (docs/theory.md#reduced-infinite-prompt-risk): τ² tr((G − I)ᵀΛ(G − I)) + σ², G = vAΛ."""
    lam = task.covariance.to(dtype=A.dtype, device=A.device)  # [d, d]
    R = v * A @ lam - torch.eye(task.dim, dtype=A.dtype, device=A.device)  # G − I [d, d]
    return task.task_variance * torch.trace(R.T @ lam @ R) + task.noise_variance


def _sym_sqrt(lam: np.ndarray) -> np.ndarray:
    evals, evecs = np.linalg.eigh(lam)
    return (evecs * np.sqrt(evals)) @ evecs.T


def reduced_finite_prompt_correction(v: float, A, covariance, noise_variance: float) -> float:
    """F(v, A) = lim L·(R_L − R∞) for the reduced softmax model, τ² = 1 (docs/theory.md#finite-prompt-correction, general Λ).

    With M = Λ^{1/2} A Λ Aᵀ Λ^{1/2}, Σ_M = (I − 2M)⁻¹ and Z = det(I − 2M)^{−1/2}:
    F = Z[v²(trΛ + σ²) − v² tr(Λ^{1/2} A Λ² Aᵀ Λ^{1/2} Σ_M) + 2v tr(Λ^{1/2} A Λ^{3/2} Σ_M)].
    Finite only for ‖Λ^{1/2} A Λ^{1/2}‖₂ < 1/√2; returns +inf beyond.
    """
    A = np.asarray(A, dtype=np.float64)
    lam = np.asarray(covariance, dtype=np.float64)
    root = _sym_sqrt(lam)  # Λ^{1/2}
    d = lam.shape[0]
    M = root @ A @ lam @ A.T @ root
    I_minus = np.eye(d) - 2.0 * M
    if np.linalg.eigvalsh(I_minus).min() <= 0.0:
        return float("inf")
    sigma_m = np.linalg.inv(I_minus)
    Z = np.linalg.det(I_minus) ** -0.5
    variance = v**2 * (np.trace(lam) + noise_variance) - v**2 * np.trace(root @ A @ lam @ lam @ A.T @ root @ sigma_m)
    cross = 2.0 * v * np.trace(root @ A @ lam @ root @ sigma_m)  # Λ^{3/2} = Λ Λ^{1/2}
    return float(Z * (variance + cross))


def valley_optimal_scale(dim: int, noise_variance: float) -> float:
    """α* on the valley vA = I (Λ = I): the smaller root s of (d+2)(d+2σ²)s² − (d+4)(d+σ²)s + (d+σ²) = 0, α* = √s (docs/theory.md#valley-optimum)."""
    d, s2 = float(dim), float(noise_variance)
    roots = np.roots([(d + 2) * (d + 2 * s2), -(d + 4) * (d + s2), d + s2])
    return float(np.sqrt(np.min(roots.real)))


def valley_correction(alpha: float, covariance, task_variance: float, noise_variance: float) -> float:
    """f(α) = F_τ(1/α, αΛ⁻¹): the finite-L correction along the valley vA = Λ⁻¹ of R∞, general Λ and τ².

    The reduced predictor is linear in y, so R_L(v, A; τ², σ²) = τ² R_L(v, A; 1, σ²/τ²) at every L and
    F_τ(v, A; σ²) = τ² F(v, A; σ²/τ²) (docs/theory.md#valley-optimum). Finite for 0 < α < 1/√2.
    """
    lam = np.asarray(covariance, dtype=np.float64)
    A = alpha * np.linalg.inv(lam)
    return task_variance * reduced_finite_prompt_correction(1.0 / alpha, A, lam, noise_variance / task_variance)


def valley_optimum(covariance, task_variance: float, noise_variance: float) -> tuple[float, float]:
    """(α*, f(α*)): the scale on the valley vA = Λ⁻¹ with the smallest finite-L correction, by bounded
    scalar minimisation of :func:`valley_correction` over (0, 1/√2) (docs/theory.md#softmax-finite-prompt-optimum).

    The softmax model's best risk at prompt length L is then σ² + f(α*)/L + o(1/L).
    """
    edge = 2.0**-0.5
    res = minimize_scalar(lambda a: valley_correction(a, covariance, task_variance, noise_variance),
                          bounds=(1e-3, edge * (1 - 1e-6)), method="bounded", options={"xatol": 1e-10})
    return float(res.x), float(res.fun)


def linear_attention_fixed_point(covariance, task_variance: float, noise_variance: float, prompt_length: int,
                                 excess_kurtosis: float = 0.0) -> np.ndarray:
    """Γ* of linear attention ŷ = x_qᵀ Γ m̂, m̂ = (1/L) Σ yᵢxᵢ, with noisy labels (docs/theory.md#linear-attention-optimum).

    Γ* = ((1 + 1/L)Λ + (trΛ + σ²/τ² + κ₄)/L · I)⁻¹; τ² = 1 and σ = 0 give the noiseless fixed point of Zhang, Frei and
    Bartlett. κ₄ ≠ 0 only for i.i.d. non-Gaussian coordinates, Λ = I (docs/theory.md#bounded-linear-optimum).
    """
    lam = np.asarray(covariance, dtype=np.float64)
    n = float(prompt_length)
    shift = (np.trace(lam) + noise_variance / task_variance + excess_kurtosis) / n
    return np.linalg.inv((1.0 + 1.0 / n) * lam + shift * np.eye(lam.shape[0]))


def linear_attention_risk(gamma, covariance, task_variance: float, noise_variance: float, prompt_length: int,
                          excess_kurtosis: float = 0.0) -> float:
    """Population risk of the linear-attention predictor ŷ = x_qᵀ Γ m̂, m̂ = (1/L) Σ yᵢxᵢ (docs/theory.md#linear-attention-optimum, general τ²).

    R(Γ) = tr(Γ M Γᵀ Λ) − 2τ² tr(Γ Λ²) + τ² tr Λ + σ², with
    M = E m̂m̂ᵀ = τ²[Λ² + (Λ² + tr(Λ)Λ + κ₄ I)/L] + σ²Λ/L (κ₄ for i.i.d. coordinates, Λ = I; docs/theory.md#bounded-linear-optimum).
    """
    lam = np.asarray(covariance, dtype=np.float64)
    g = np.asarray(gamma, dtype=np.float64)
    tau2, s2, n = float(task_variance), float(noise_variance), float(prompt_length)
    m = tau2 * (lam @ lam + (lam @ lam + np.trace(lam) * lam) / n) + s2 * lam / n
    if excess_kurtosis:
        m = m + tau2 * excess_kurtosis * np.eye(lam.shape[0]) / n
    return float(np.trace(g @ m @ g.T @ lam) - 2 * tau2 * np.trace(g @ lam @ lam) + tau2 * np.trace(lam) + s2)


def optimal_linear_attention_risk(covariance, task_variance: float, noise_variance: float, prompt_length: int,
                                  excess_kurtosis: float = 0.0) -> float:
    """min_Γ R(Γ) = R(Γ*): the best risk linear attention can reach at prompt length L (docs/theory.md#linear-attention-optimum);
    for i.i.d. coordinates of excess kurtosis κ₄ (Λ = I), R(Γ*) = dτ²k/(L + k) + σ², k = d + 1 + κ₄ + σ²/τ²."""
    gamma = linear_attention_fixed_point(covariance, task_variance, noise_variance, prompt_length, excess_kurtosis)
    return linear_attention_risk(gamma, covariance, task_variance, noise_variance, prompt_length, excess_kurtosis)
