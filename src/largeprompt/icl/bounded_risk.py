"""R∞ of the §6 Q/K/V/O softmax model for covariates with i.i.d. bounded coordinates (Rademacher, uniform),
by exact quadrature, with its exact gradient and Hessian (docs/theory.md#bounded-token-risk).

Given the task β, the token z = (x, y) has CGF K(a_x, a_y) = Σⱼ κ(a_{x,j} + a_y βⱼ) + ½σ²a_y², κ the coordinate
CGF, so with a = U z_q = (a_x, a_y) = (M_x x_q, m_y·x_q) the infinite-prompt output uᵀ∇K(a) is

    ŷ∞ = Σⱼ (u_{x,j} + u_y βⱼ) κ'(a_{x,j} + a_y βⱼ) + u_y σ² a_y.

Given x_q the residual r = ŷ∞ − βᵀx_q is a sum of independent terms gⱼ(βⱼ) plus c = u_yσ²a_y, so
E_β r² = (Σⱼ μⱼ + c)² + Σⱼ (sⱼ − μⱼ²), with μⱼ = E gⱼ and sⱼ = E gⱼ²: one-dimensional Gaussian integrals, done by
Gauss–Hermite quadrature on ``task_nodes`` nodes. The query expectation is an exact sum over the 2^d corners of
the cube (Rademacher) or tensor Gauss–Legendre on ``query_nodes`` nodes per coordinate (uniform); then
R∞ = E_{x_q} E_β r² + σ². With κ' the identity and Gauss–Hermite queries this is the Gaussian closed form of
:mod:`largeprompt.icl.full_model_risk` with Λ = I (tests/test_bounded_risk.py checks it to round-off).

The gradient is the chain rule written out, the Hessian the complex-step derivative of the gradient (κ', κ'' are
analytic near the real axis), as for the Gaussian risk; θ is [..., P] in :func:`largeprompt.icl.models.flatten` order.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from largeprompt.icl.full_model_risk import COMPLEX_STEP, FullModelRisk, _t
from largeprompt.maths.measures import SQRT3

# Below this |x| the Langevin function and its derivative use their Taylor series. The torch versions in
# largeprompt.maths.measures compute in float64 only; these also take the complex arguments of the complex step.
_SERIES = 0.1


def _langevin_series(x):
    """Taylor series of 𝓛 to x¹¹ and of 𝓛' to x¹⁰: the first omitted term is below 1e-17 at |x| = 0.1."""
    x2 = x * x
    value = x * (1 / 3 - x2 * (1 / 45 - x2 * (2 / 945 - x2 * (1 / 4725 - x2 * (2 / 93555 - x2 * 1382 / 638512875)))))
    slope = 1 / 3 - x2 * (1 / 15 - x2 * (2 / 189 - x2 * (1 / 675 - x2 * (2 / 10395 - x2 * 1382 / 58046625))))
    return value, slope


def _langevin(x):
    """𝓛(x) = coth x − 1/x and 𝓛'(x) = 1/x² − 1/sinh²x = 1/x² + 1 − coth²x, for real or complex x near the real axis."""
    small = np.abs(x) < _SERIES
    series, dseries = _langevin_series(x)
    if not np.iscomplexobj(x):  # the hot path of flows: coth|x| = (1 + e)/(1 − e), e = exp(−2|x|) (no tanh: 3x faster)
        a = np.where(small, 1.0, np.abs(x))
        e = np.exp(-2.0 * a)
        coth, inv = (1.0 + e) / (1.0 - e), 1.0 / a
        return (np.where(small, series, np.copysign(coth - inv, x)),
                np.where(small, dseries, inv * inv + 1.0 - coth * coth))
    safe = np.where(small, 1.0, x)
    coth = 1.0 / np.tanh(safe)
    return np.where(small, series, coth - 1 / safe), np.where(small, dseries, 1 / (safe * safe) + 1.0 - coth * coth)


def coordinate_cgf_derivatives(measure: str, t):
    """(κ'(t), κ''(t)) of one unit-variance coordinate: t, 1 (gaussian); tanh t, 1 − tanh²t (rademacher);
    √3 𝓛(√3 t), 3 𝓛'(√3 t) (uniform on [−√3, √3]) (docs/theory.md#rademacher-and-uniform-limits)."""
    if measure == "gaussian":
        return t, np.ones_like(t)
    if measure == "rademacher":
        th = np.tanh(t)
        return th, 1.0 - th * th
    if measure == "uniform":
        value, slope = _langevin(SQRT3 * t)
        return SQRT3 * value, 3.0 * slope
    raise ValueError(f"unknown token measure {measure!r}; allowed: gaussian, rademacher, uniform")


def coordinate_rule(measure: str, nodes: int):
    """(points [n], weights [n]) integrating exactly over one unit-variance coordinate of ``measure``: the two points
    ±1 (rademacher), Gauss–Legendre on [−√3, √3] (uniform), Gauss–Hermite (gaussian), ``nodes`` of them."""
    if measure == "rademacher":
        return np.array([-1.0, 1.0]), np.array([0.5, 0.5])
    if measure == "uniform":
        points, weights = np.polynomial.legendre.leggauss(int(nodes))
        return SQRT3 * points, weights / 2.0
    if measure == "gaussian":
        points, weights = np.polynomial.hermite_e.hermegauss(min(int(nodes), 150))  # more: the weights underflow
        return points, weights / weights.sum()
    raise ValueError(f"unknown token measure {measure!r}; allowed: gaussian, rademacher, uniform")


def query_rule(measure: str, dim: int, nodes: int):
    """(x_q nodes [N, d], weights [N]): the tensor product of :func:`coordinate_rule` over the d coordinates (the 2^d
    corners for rademacher)."""
    points, weights = coordinate_rule(measure, nodes)
    grid = np.stack(np.meshgrid(*([points] * dim), indexing="ij"), -1).reshape(-1, dim)  # [N, d]
    mass = np.prod(np.stack(np.meshgrid(*([weights] * dim), indexing="ij"), -1).reshape(-1, dim), axis=-1)  # [N]
    return grid, mass


def task_rule(task_variance: float, nodes: int):
    """(β-coordinate nodes [K], weights [K]) of N(0, τ²): Gauss–Hermite, exact for polynomials of degree < 2K."""
    points, weights = np.polynomial.hermite_e.hermegauss(int(nodes))
    return points * math.sqrt(task_variance), weights / weights.sum()


@dataclass(frozen=True)
class Quadrature:
    """Config ``beyond_gaussian.quadrature``: Gauss–Legendre nodes per query coordinate (uniform) and
    Gauss–Hermite nodes per task coordinate; the error check doubles both (docs/theory.md#bounded-token-risk)."""

    query_nodes: int = 10
    task_nodes: int = 20

    def refined(self) -> Quadrature:
        return Quadrature(2 * self.query_nodes, 2 * self.task_nodes)

    def coarse(self) -> Quadrature:
        return Quadrature(min(self.query_nodes, 5), min(self.task_nodes, 8))


class BoundedTokenRisk(FullModelRisk):
    """R∞(θ) of the softmax §6 model for i.i.d. coordinates of ``measure`` (Λ = I); module docstring."""

    def __init__(self, measure: str, dim: int, task_variance: float, noise_variance: float,
                 quadrature: Quadrature = Quadrature()):
        super().__init__(np.eye(dim), task_variance, noise_variance)
        self.measure, self.quadrature = measure, quadrature
        self.x, self.w = query_rule(measure, dim, quadrature.query_nodes)  # [N, d], [N]
        self.b, self.omega = task_rule(task_variance, quadrature.task_nodes)  # [K], [K]


    def value(self, theta: np.ndarray) -> np.ndarray:
        """R∞ [...] at θ [..., P] alone (the forward half of :meth:`value_and_gradient`)."""
        return self._forward(theta)[0]

    def _forward(self, theta: np.ndarray):
        d, s2, x, w, b, omega = self.d, self.sigma2, self.x, self.w, self.b, self.omega
        weights = self.weights(theta)
        U, u = self.attention(theta)
        Mx, my, ux, uy = U[..., :d, :d], U[..., d, :d], u[..., :d], u[..., d]
        ax = x @ _t(Mx)  # [..., N, d]
        ay = x @ my[..., :, None]  # [..., N, 1]
        t = ax[..., None] + ay[..., None] * b  # [..., N, d, K]
        f, h = coordinate_cgf_derivatives(self.measure, t)
        coef = ux[..., None, :, None] + uy[..., None, None, None] * b  # u_x,j + u_y b_k  [..., 1, d, K]
        g = coef * f - b * x[..., None]  # [..., N, d, K]
        mu, s = g @ omega, (g * g) @ omega  # [..., N, d]
        S = mu.sum(-1) + s2 * uy[..., None] * ay[..., 0]  # [..., N]
        risk = (S * S + (s - mu * mu).sum(-1)) @ w + s2
        return risk, (weights, U, uy, ay, f, h, coef, g, mu, S)

    def value_and_gradient(self, theta: np.ndarray):
        """(R∞ [...], ∇R∞ [..., P]) at θ [..., P] (real or complex)."""
        d, s2, x, w, b, omega = self.d, self.sigma2, self.x, self.w, self.b, self.omega
        risk, (weights, U, uy, ay, f, h, coef, g, mu, S) = self._forward(theta)
        G = 2.0 * (S[..., None, None] - mu[..., None] + g) * (w[:, None, None] * omega)  # ∂R/∂g [..., N, d, K]
        E = G * coef * h  # ∂R/∂t
        grad_ax = E.sum(-1)  # [..., N, d]
        grad_ay = (E @ b).sum(-1) + 2.0 * s2 * uy[..., None] * S * w  # [..., N]
        grad_U = np.zeros(U.shape, dtype=U.dtype)
        grad_U[..., :d, :d] = _t(grad_ax) @ x  # Σ_n ∂R/∂a_x[n, j] x[n, i]
        grad_U[..., d, :d] = grad_ay @ x
        Gf = G * f
        grad_ux = Gf.sum((-1, -3))  # [..., d]
        grad_uy = (Gf @ b).sum((-1, -2)) + 2.0 * s2 * ((S * ay[..., 0]) @ w)
        grad_u = np.concatenate([grad_ux, grad_uy[..., None]], axis=-1)
        return risk, self.weight_gradient(theta.shape[:-1], weights, grad_U, grad_u)

    def hessian(self, theta: np.ndarray, chunk: int = 8) -> np.ndarray:
        """∇²R∞ [..., P, P] by the complex step, ``chunk`` probe directions at a time (memory ∝ chunk · N · d · K)."""
        P = theta.shape[-1]
        rows = []
        for start in range(0, P, chunk):
            eye = np.eye(P)[start:start + chunk]  # [c, P]
            probe = theta[..., None, :] + (1j * COMPLEX_STEP) * eye
            rows.append(self.gradient(probe).imag / COMPLEX_STEP)
        return np.concatenate(rows, axis=-2)

    def sharpness(self, theta: np.ndarray, batch: int = 1) -> np.ndarray:
        return super().sharpness(theta, batch=batch)

    @functools.cached_property
    def _coarse(self) -> BoundedTokenRisk:
        coarse = self.quadrature.coarse()
        return self if coarse == self.quadrature else BoundedTokenRisk(self.measure, self.d, self.tau2, self.sigma2, coarse)

    def solver_risk(self) -> BoundedTokenRisk:
        """This R∞ on the coarse rule of :meth:`Quadrature.coarse`, for the ODE solver's Jacobian (it only steers the
        Newton iterations; the flow's accuracy comes from the gradient) and the sharpness that sets step sizes (which
        keeps a stability margin of 1 − ``stability_fraction``): a tenth of the cost. Built once: the solver asks for its
        Hessian at every Jacobian update."""
        return self._coarse

    def solver_hessian(self, theta: np.ndarray) -> np.ndarray:
        return self.solver_risk().hessian(theta)

    def quadrature_error(self, theta: np.ndarray) -> np.ndarray:
        """|R∞ − R∞ on the refined rule| [...]: the stated integration error at θ (docs/theory.md#bounded-token-risk)."""
        fine = BoundedTokenRisk(self.measure, self.d, self.tau2, self.sigma2, self.quadrature.refined())
        return np.abs(self.value(theta) - fine.value(theta))


def task_limits(task, quadrature: Quadrature = Quadrature()) -> dict | None:
    """model → its R∞ where softmax's and linear attention's limits differ (bounded covariates), else None (both are
    the Gaussian closed form): what the training rows log and the transfer gaps measure against."""
    if task.token_measure == "gaussian":
        return None
    return {m: limit_risk(task, m, quadrature) for m in ("softmax", "linear")}


def icl_quadrature(icl: dict) -> Quadrature:
    """The quadrature of config section ``icl`` (or ``beyond_gaussian``): its key ``quadrature`` where present."""
    return Quadrature(**icl["quadrature"]) if "quadrature" in icl else Quadrature()


def limit_risk(task, model: str = "softmax", quadrature: Quadrature = Quadrature()) -> FullModelRisk:
    """R∞ of ``model`` on ``task`` (a :class:`largeprompt.icl.task.RegressionTask`): for Gaussian covariates both
    models share the closed form; linear attention sees only second moments, so its R∞ is that closed form (Λ = I)
    for every measure; softmax with bounded covariates is :class:`BoundedTokenRisk` (docs/theory.md#bounded-token-risk)."""
    if task.token_measure == "gaussian" or model == "linear":
        return FullModelRisk(task.covariance.numpy(), task.task_variance, task.noise_variance)
    return BoundedTokenRisk(task.token_measure, task.dim, task.task_variance, task.noise_variance, quadrature)
