"""R∞ of the §6 Q/K/V/O model with its exact gradient and Hessian, batched in numpy
(docs/theory.md#full-model-infinite-prompt-risk, docs/theory.md#risk-derivatives).

The gradient flows of R∞ (:mod:`largeprompt.icl.dynamics`) and their sharpness call these many thousand
times on 114 parameters, where torch's per-call overhead would dominate: here the gradient is the
chain rule written out (θ → (U, u) → (c₀, C₁, c₂) → R∞), and the Hessian is the complex-step
derivative of that gradient, ∇²R e_j = Im ∇R(θ + i h e_j)/h, exact to rounding because ∇R is a
polynomial in θ (no subtraction, so no cancellation, for any tiny h). Every function takes θ with any
leading batch shape [..., P], P = 3D² + D, in the order of :func:`largeprompt.icl.models.flatten`.
"""
from __future__ import annotations

import math

import numpy as np

COMPLEX_STEP = 1e-30  # h of the complex step; ∇R is a polynomial, so h only has to keep h² |∇³R| below rounding


def _t(x: np.ndarray) -> np.ndarray:
    """Transpose of the last two axes (never a conjugate: the complex step needs the plain transpose)."""
    return np.swapaxes(x, -1, -2)


def _mv(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """matrix [..., m, n] @ vector [..., n] → [..., m]."""
    return (matrix @ vector[..., None])[..., 0]


class FullModelRisk:
    """R∞(θ) of the task (Λ, τ², σ²) for θ = (Q, K, V, O) flattened; see the module docstring."""

    def __init__(self, covariance, task_variance: float, noise_variance: float):
        self.lam = np.asarray(covariance, dtype=np.float64)  # Λ [d, d]
        self.d = self.lam.shape[0]
        self.D = self.d + 1
        self.tau2, self.sigma2 = float(task_variance), float(noise_variance)
        trace, trace2 = np.trace(self.lam), np.trace(self.lam @ self.lam)
        self.cross = 2 * self.tau2 * trace  # 2τ² trΛ
        self.quartic = self.tau2**2 * (trace**2 + 2 * trace2)  # τ⁴((trΛ)² + 2 trΛ²)
        self.n_parameters = 3 * self.D * self.D + self.D

    def weights(self, theta: np.ndarray):
        """Q, K, V [..., D, D] and O [..., 1, D] from θ [..., P]."""
        D, batch = self.D, theta.shape[:-1]
        blocks = [theta[..., i * D * D:(i + 1) * D * D].reshape(batch + (D, D)) for i in range(3)]
        return (*blocks, theta[..., 3 * D * D:].reshape(batch + (1, D)))

    def attention(self, theta: np.ndarray):
        """U = KᵀQ/√D [..., D, D] and u = VᵀOᵀ [..., D]."""
        Q, K, V, O = self.weights(theta)
        return _t(K) @ Q / math.sqrt(self.D), (O @ V)[..., 0, :]

    def readout_determinant(self, theta: np.ndarray) -> np.ndarray:
        """det(u_y M_x) [...]: det Λ⁻¹ > 0 at every minimiser of R∞ (docs/theory.md#drifting-flows)."""
        U, u = self.attention(theta)
        return np.linalg.det(u[..., self.d, None, None] * U[..., :self.d, :self.d])

    def route_ratio(self, theta: np.ndarray) -> np.ndarray:
        """‖m_y‖·‖u_x‖ / (|u_y|·‖M_x‖_F) [...]: which of the two terms of C₁ carries the readout, the rank-one
        m_y u_xᵀΛ (large) or the full-rank u_y M_xᵀΛ that every minimiser uses (small) (docs/theory.md#drifting-flows)."""
        U, u = self.attention(theta)
        d = self.d
        rank_one = np.linalg.norm(U[..., d, :d], axis=-1) * np.linalg.norm(u[..., :d], axis=-1)
        return rank_one / (np.abs(u[..., d]) * np.linalg.norm(U[..., :d, :d], axis=(-1, -2)))

    def value_and_gradient(self, theta: np.ndarray):
        """(R∞ [...], ∇R∞ [..., P]) at θ [..., P] (real or complex)."""
        d, lam, tau2, sigma2 = self.d, self.lam, self.tau2, self.sigma2
        Q, K, V, O = self.weights(theta)
        U, u = _t(K) @ Q / math.sqrt(self.D), (O @ V)[..., 0, :]
        Mx, my, ux, uy = U[..., :d, :d], U[..., d, :d], u[..., :d], u[..., d]  # [.., d, d], [.., d], [.., d], [..]
        lux = ux @ lam  # Λu_x
        MtL = _t(Mx) @ lam  # M_xᵀΛ
        c0 = _mv(_t(Mx), lux) + sigma2 * uy[..., None] * my
        C1 = uy[..., None, None] * MtL + my[..., :, None] * lux[..., None, :] - np.eye(d)
        c2 = uy[..., None] * my
        Lc0, Lc2, LC1 = c0 @ lam, c2 @ lam, lam @ C1
        risk = ((Lc0 * c0).sum(-1) + tau2 * (C1 * LC1).sum((-1, -2)) + self.cross * (Lc0 * c2).sum(-1)
                + self.quartic * (Lc2 * c2).sum(-1) + sigma2)
        g0, g1, g2 = 2 * Lc0 + self.cross * Lc2, 2 * tau2 * LC1, self.cross * Lc0 + 2 * self.quartic * Lc2  # ∂R/∂(c₀, C₁, c₂)
        grad_U = np.zeros(U.shape, dtype=U.dtype)
        grad_U[..., :d, :d] = lux[..., :, None] * g0[..., None, :] + uy[..., None, None] * (lam @ _t(g1))
        grad_U[..., d, :d] = sigma2 * uy[..., None] * g0 + _mv(g1, lux) + uy[..., None] * g2
        grad_ux = (_mv(Mx, g0) + _mv(_t(g1), my)) @ lam
        grad_uy = sigma2 * (g0 * my).sum(-1) + (g1 * MtL).sum((-1, -2)) + (g2 * my).sum(-1)
        grad_u = np.concatenate([grad_ux, grad_uy[..., None]], axis=-1)
        return risk, self.weight_gradient(theta.shape[:-1], (Q, K, V, O), grad_U, grad_u)

    def weight_gradient(self, batch, weights, grad_U, grad_u) -> np.ndarray:
        """∇θ [..., P] from ∇U and ∇u, U = KᵀQ/√D and u = VᵀOᵀ: ∇Q = K∇U/√D, ∇K = Q∇Uᵀ/√D, ∇V = Oᵀ∇uᵀ, ∇O = (V∇u)ᵀ."""
        Q, K, V, O = weights
        grads = (K @ grad_U / math.sqrt(self.D), Q @ _t(grad_U) / math.sqrt(self.D),
                 _t(O) * grad_u[..., None, :], _t(_mv(V, grad_u)[..., None]))
        return np.concatenate([g.reshape(batch + (-1,)) for g in grads], axis=-1)

    def value(self, theta: np.ndarray) -> np.ndarray:
        return self.value_and_gradient(theta)[0]

    def gradient(self, theta: np.ndarray) -> np.ndarray:
        return self.value_and_gradient(theta)[1]

    def hessian(self, theta: np.ndarray) -> np.ndarray:
        """∇²R∞ [..., P, P] by one batched complex-step evaluation of the gradient."""
        P = theta.shape[-1]
        probe = theta[..., None, :] + (1j * COMPLEX_STEP) * np.eye(P)  # [..., P, P]: row j is θ + ih e_j
        return self.gradient(probe).imag / COMPLEX_STEP

    def solver_risk(self) -> FullModelRisk:
        """The R∞ whose Hessian steers an ODE solver and sets step sizes: this closed form itself."""
        return self

    def solver_hessian(self, theta: np.ndarray) -> np.ndarray:
        """The Jacobian −∇²R the ODE solver of a flow is given: the exact Hessian here."""
        return self.hessian(theta)

    def sharpness(self, theta: np.ndarray, batch: int = 64) -> np.ndarray:
        """λ_max(∇²R∞) [...] (docs/theory.md#sgd-stability), in batches of ``batch`` points to bound memory."""
        flat = theta.reshape(-1, theta.shape[-1])
        out = [np.linalg.eigvalsh(self.hessian(flat[i:i + batch]))[..., -1] for i in range(0, len(flat), batch)]
        return np.concatenate(out).reshape(theta.shape[:-1]) if out else np.empty(theta.shape[:-1])


def full_model_risk(task) -> FullModelRisk:
    """The :class:`FullModelRisk` of a :class:`largeprompt.icl.task.RegressionTask` with Gaussian covariates (other
    measures: :func:`largeprompt.icl.bounded_risk.limit_risk`, which knows that softmax and linear limits differ)."""
    if getattr(task, "token_measure", "gaussian") != "gaussian":
        raise ValueError(f"the closed-form R∞ is softmax's limit only for Gaussian covariates, not {task.token_measure}: "
                         "use largeprompt.icl.bounded_risk.limit_risk(task, model, quadrature)")
    return FullModelRisk(task.covariance.numpy(), task.task_variance, task.noise_variance)
