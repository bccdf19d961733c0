"""In-context linear regression: the task, its closed-form risks and the Bayes risk
(docs/theory.md#icl-task, docs/theory.md#bayes-risk, docs/theory.md#reduced-infinite-prompt-risk).

Tokens z = (x, y) ∈ R^D, D = d + 1, with x ~ N(0, Λ), y = βᵀx + σε, β ~ N(0, τ² I) per prompt.
The query token is z_q = (x_q, 0) and its target is y_q = βᵀx_q + σε_q (docs/theory.md#icl-task).

Implemented as stated in docs/theory.md#icl-task. The authors' public generator differs
(docs/experiments.md#authors-data-generator): it applies the
covariance to the prompt x twice and never to x_q; we apply Λ once to every x, query included.
"""
from __future__ import annotations

import numpy as np
import torch

from .measures import toeplitz_covariance


class RegressionTask:
    """The in-context regression task (docs/theory.md#icl-task): Λ = ``covariance`` [d, d], τ² = ``task_variance``, σ² = ``noise_variance``."""

    def __init__(self, covariance, task_variance: float, noise_variance: float):
        self.covariance = torch.as_tensor(covariance, dtype=torch.float64, device="cpu")  # Λ [d, d], host copy
        self.task_variance = float(task_variance)  # τ²
        self.noise_variance = float(noise_variance)  # σ²
        self.dim = self.covariance.shape[0]  # d
        self.token_dim = self.dim + 1  # D
        self._chol = torch.linalg.cholesky(self.covariance)  # Λ = C Cᵀ
        self._templates = {}

    def _transform_parts(self, batch: int, dtype, device):
        """C in ``dtype`` and a fresh T_β [B, D, D] with its β-free blocks (Cᵀ and σ) filled: a copy of a cached template."""
        key = (batch, dtype, str(device))
        if key not in self._templates:
            d = self.dim
            chol = self._chol.to(dtype=dtype, device=device)
            template = torch.zeros(batch, d + 1, d + 1, dtype=dtype, device=device)
            template[:, :d, :d] = chol.T
            template[:, d, d] = self.noise_variance**0.5
            self._templates = {key: (chol, template)}  # one shape at a time: training draws one batch size
        chol, template = self._templates[key]
        return chol, template.clone()

    def sample(self, batch: int, prompt_length: int, generator: torch.Generator | None = None, dtype=torch.float64, device="cpu"):
        """Draw ``batch`` prompts: (query_tokens [B, D], prompt_tokens [B, L, D], targets [B])."""
        return self.sample_with_tasks(batch, prompt_length, generator, dtype, device)[:3]

    def sample_with_tasks(self, batch: int, prompt_length: int, generator: torch.Generator | None = None, dtype=torch.float64, device="cpu"):
        """As :meth:`sample`, also returning the task vectors β [B, d].

        One randn call g for the L + 1 tokens and their noise (the [B, L+1, D] floor), one for β, then a
        single batched product z = g T_β with T_β = [[Cᵀ, Cᵀβ], [0, σ]] (Λ = C Cᵀ): x = C g_x and
        y = βᵀx + σ g_y in one pass, written straight into the token layout (x, y). The prompt is a
        [B, L, D] view of feature-major storage (strides (D(L+1), 1, L+1)).
        """
        d, L = self.dim, int(prompt_length)
        g = torch.randn(batch, L + 1, d + 1, generator=generator, dtype=dtype, device=device)  # [B, L+1, D]
        beta = torch.randn(batch, d, generator=generator, dtype=dtype, device=device) * self.task_variance**0.5  # [B, d]
        chol, transform = self._transform_parts(batch, dtype, device)  # C [d, d]; T_β [B, D, D] without Cᵀβ
        transform[:, :d, d] = beta @ chol  # Cᵀβ
        # [B, L+1, D] rows (x, y), stored feature-major ([B, D, L+1]): the product with a wide output is the one
        # BLAS runs fast (6x faster than g @ T_β with MKL on an AMD EPYC), and so are the step's two passes over it
        tokens = (transform.mT @ g.mT).mT
        prompt = tokens[:, :L]  # [B, L, D] (a view)
        query = tokens[:, L].clone()  # [B, D]
        target = query[:, d].clone()  # [B]  y_q = βᵀx_q + σε_q
        query[:, d] = 0.0  # z_q = (x_q, 0)
        return query, prompt, target, beta


def regression_task(icl: dict) -> RegressionTask:
    """The task of config section ``icl``: Λ_ij = covariance_rho^|i−j| in ``dim`` dimensions, τ², σ²."""
    cov = toeplitz_covariance(int(icl["dim"]), float(icl["covariance_rho"]), dtype=torch.float64)
    return RegressionTask(cov, icl["task_variance"], icl["noise_variance"])


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
    from scipy.optimize import minimize_scalar

    edge = 2.0**-0.5
    res = minimize_scalar(lambda a: valley_correction(a, covariance, task_variance, noise_variance),
                          bounds=(1e-3, edge * (1 - 1e-6)), method="bounded", options={"xatol": 1e-10})
    return float(res.x), float(res.fun)


def linear_attention_fixed_point(covariance, task_variance: float, noise_variance: float, prompt_length: int) -> np.ndarray:
    """Γ* of linear attention ŷ = x_qᵀ Γ m̂, m̂ = (1/L) Σ yᵢxᵢ, with noisy labels (docs/theory.md#linear-attention-optimum).

    Γ* = ((1 + 1/L)Λ + (trΛ + σ²/τ²)/L · I)⁻¹; τ² = 1 and σ = 0 give the noiseless fixed point of Zhang, Frei and Bartlett.
    """
    lam = np.asarray(covariance, dtype=np.float64)
    n = float(prompt_length)
    shift = (np.trace(lam) + noise_variance / task_variance) / n
    return np.linalg.inv((1.0 + 1.0 / n) * lam + shift * np.eye(lam.shape[0]))


def linear_attention_risk(gamma, covariance, task_variance: float, noise_variance: float, prompt_length: int) -> float:
    """Population risk of the linear-attention predictor ŷ = x_qᵀ Γ m̂, m̂ = (1/L) Σ yᵢxᵢ (docs/theory.md#linear-attention-optimum, general τ²).

    R(Γ) = tr(Γ M Γᵀ Λ) − 2τ² tr(Γ Λ²) + τ² tr Λ + σ², with
    M = E m̂m̂ᵀ = τ²[Λ² + (Λ² + tr(Λ)Λ)/L] + σ²Λ/L.
    """
    lam = np.asarray(covariance, dtype=np.float64)
    g = np.asarray(gamma, dtype=np.float64)
    tau2, s2, n = float(task_variance), float(noise_variance), float(prompt_length)
    m = tau2 * (lam @ lam + (lam @ lam + np.trace(lam) * lam) / n) + s2 * lam / n
    return float(np.trace(g @ m @ g.T @ lam) - 2 * tau2 * np.trace(g @ lam @ lam) + tau2 * np.trace(lam) + s2)


def optimal_linear_attention_risk(covariance, task_variance: float, noise_variance: float, prompt_length: int) -> float:
    """min_Γ R(Γ) = R(Γ*): the best risk linear attention can reach at prompt length L (docs/theory.md#linear-attention-optimum)."""
    gamma = linear_attention_fixed_point(covariance, task_variance, noise_variance, prompt_length)
    return linear_attention_risk(gamma, covariance, task_variance, noise_variance, prompt_length)


def ridge_predictions(query: torch.Tensor, prompt: torch.Tensor, ridge: float) -> torch.Tensor:
    """Posterior-mean (ridge, λ = σ²/τ²) predictions x_qᵀ(XᵀX + λI)⁻¹Xᵀy, the Bayes predictor (docs/theory.md#bayes-risk).

    query [B, D], prompt [B, L, D] → [B].
    """
    X, y = prompt[..., :-1], prompt[..., -1]  # [B, L, d], [B, L]
    d = X.shape[-1]
    gram = X.transpose(-1, -2) @ X + ridge * torch.eye(d, dtype=X.dtype, device=X.device)  # [B, d, d]
    beta_hat = torch.linalg.solve(gram, (X.transpose(-1, -2) @ y.unsqueeze(-1)))  # [B, d, 1]
    return (query[:, None, :-1] @ beta_hat).reshape(-1)  # [B]
