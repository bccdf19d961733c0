"""Test tolerances derived from the dtype and the size of the computation, never tuned to one machine.

Floating point (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., ch. 3): with
u = eps(dtype) and γ_n = n·u / (1 − n·u), a computation in which every result passes through at most
n roundings satisfies |fl(f) − f| ≤ γ_n · f_abs, where f_abs is the same computation on |inputs| with
every subtraction turned into an addition (the "running" or |·| bound). The bound holds for every
summation order (blocked BLAS, threads, FMA), i.e. on every IEEE machine. u is taken as the machine
epsilon, twice the unit roundoff, so elementary functions (exp, log, tanh) accurate to 1 ulp rather
than ½ ulp are covered too.

These are worst-case bounds; typical rounding errors grow like √n·u, so on any machine the observed
error sits one or more orders of magnitude below them.

Solvers (ODE, quadrature, root finding) are held to their own tolerance parameters times a
documented safety factor; Monte Carlo checks to z standard errors.
"""
from __future__ import annotations

import numpy as np
import torch

# solve_ivp controls the *local* error of each step to rtol·|y| + atol; the global error at the
# output times is at most the sum of the local errors, propagated by the flow. The tests' gradient
# flows take 10²–10³ LSODA steps (215–1281 right-hand-side evaluations) and do not amplify errors
# much over their horizons, so 10³ local tolerances bound the accumulation.
ODE_SAFETY = 1e3
# QUADPACK stops once its (conservative) error estimate meets max(epsabs, epsrel·|I|); 10 covers
# an estimate that undershoots by an order of magnitude.
QUAD_SAFETY = 10.0
# Two-sided normal tail of 5 standard errors: 5.7e-7 per comparison, so a test making dozens of
# comparisons still fails by chance with probability < 1e-4 (and seeds are fixed anyway).
MC_Z = 5.0


def eps(dtype) -> float:
    """Machine epsilon of a torch or numpy floating dtype (2.2e-16 for float64, 1.2e-7 for float32)."""
    if isinstance(dtype, torch.dtype):
        return float(torch.finfo(dtype).eps)
    return float(np.finfo(dtype).eps)


def gamma(n, dtype=torch.float64):
    """γ_n = n·u/(1 − n·u), u = eps(dtype): |∏(1 + δ_i)^{±1} − 1| ≤ γ_n for n factors |δ_i| ≤ u (Higham Lemma 3.1).

    ``n`` may be an array (one count per entry); the result is then an array.
    """
    nu = np.asarray(n, dtype=np.float64) * eps(dtype)
    if np.any(nu >= 1.0):
        raise ValueError(f"γ_n undefined for n·u ≥ 1: the computation is too long for {dtype}")
    out = nu / (1.0 - nu)
    return float(out) if out.ndim == 0 else out


def rounding_tolerance(n_ops: float, abs_value, dtype=torch.float64):
    """γ_{n_ops} · abs_value: bound on the rounding error of a computation with at most ``n_ops`` roundings
    along any path, ``abs_value`` being the |·| evaluation of the module doc (a scalar or a tensor)."""
    return gamma(n_ops, dtype) * abs_value


def sum_tolerance(n_terms: int, abs_sum, dtype=torch.float64):
    """|fl(Σᵢ xᵢ) − Σᵢ xᵢ| ≤ γ_{n−1} Σᵢ|xᵢ| for n terms in any order (Higham (4.4)); ``abs_sum`` = Σᵢ|xᵢ|.

    This is what bounds a cancellation: a sum whose exact value is 0 comes out at most this far from 0.
    """
    return gamma(max(int(n_terms) - 1, 1), dtype) * abs_sum


def matmul_tolerance(k: int, abs_product, dtype=torch.float64):
    """|fl(AB) − AB| ≤ γ_k |A||B| entrywise for inner dimension k (Higham (3.13)); ``abs_product`` = |A||B|."""
    return gamma(k, dtype) * abs_product


def ode_tolerance(rtol: float, atol: float, scale, safety: float = ODE_SAFETY):
    """safety · (rtol·scale + atol): global error of a solve_ivp solution with local tolerances rtol, atol
    on components of magnitude ≤ ``scale`` (see ``ODE_SAFETY``)."""
    return safety * (rtol * scale + atol)


def quad_tolerance(value, epsrel: float, epsabs: float, safety: float = QUAD_SAFETY):
    """safety · max(epsabs, epsrel·|value|): error of a ``scipy.integrate.quad`` result run at epsrel, epsabs."""
    return safety * np.maximum(epsabs, epsrel * np.abs(value))


def mc_tolerance(standard_error, z: float = MC_Z):
    """z · standard_error: a Monte Carlo estimate within z standard errors of its expectation (see ``MC_Z``)."""
    return z * standard_error


def tilted_moments_tolerance(tilt: torch.Tensor, tokens: torch.Tensor, dtype=torch.float64, score_error=0.0):
    """Bounds on the rounding error of the softmax-weighted mean [..., D] and covariance [..., D, D].

    tilt a [..., D], tokens z [..., L, D] (broadcast like the attention code); weights w = softmax(⟨a, zᵢ⟩).
    Scores carry an absolute error δ ≤ γ_{D+2}·max_i(Σⱼ|aⱼ zᵢⱼ| + max_l|s_l|) (the dot product and the
    log-sum-exp shift) plus ``score_error`` [...] from upstream; to first order a weighted mean Σ wᵢfᵢ then
    moves by ≤ 2δ·Σ wᵢ|fᵢ − f̄| (factor 2: room for second-order terms while δ ≤ 0.1). The sums add
    γ_N Σ wᵢ|fᵢ| with N = 3L + D + 8: numerator and normaliser (L terms each), at most one rebase per
    token, exp, division. The covariance M₂ − mmᵀ adds the propagated mean error and γ_2(M₂_abs + |m||m|ᵀ).
    Arguments are evaluated in float64 (the reference); ``dtype`` is that of the code under test.
    """
    a, z = tilt.to(torch.float64), tokens.to(torch.float64)
    scores = torch.einsum("...d,...ld->...l", a, z)
    abs_scores = torch.einsum("...d,...ld->...l", a.abs(), z.abs())
    shift = scores.abs().amax(-1, keepdim=True)
    delta = rounding_tolerance(a.shape[-1] + 2, (abs_scores + shift).amax(-1), dtype) + score_error  # [...]
    w = torch.softmax(scores, dim=-1)
    g = gamma(3 * z.shape[-2] + a.shape[-1] + 8, dtype)
    z = z.expand(*w.shape, z.shape[-1])

    def average_tol(values):  # values [..., L, *F] → (Σ w f, bound on its error)
        avg = torch.einsum("...l,...lf->...f", w, values.flatten(w.ndim))
        dev = (values.flatten(w.ndim) - avg.unsqueeze(-2)).abs()
        tol = 2 * delta[..., None] * torch.einsum("...l,...lf->...f", w, dev)
        tol = tol + g * torch.einsum("...l,...lf->...f", w, values.flatten(w.ndim).abs())
        shape = (*w.shape[:-1], *values.shape[w.ndim:])
        return avg.reshape(shape), tol.reshape(shape)

    mean, mean_tol = average_tol(z)
    outer = z.unsqueeze(-1) * z.unsqueeze(-2)  # [..., L, D, D]
    _, second_tol = average_tol(outer)
    second_abs = torch.einsum("...l,...lij->...ij", w, outer.abs())
    m_abs = mean.abs()
    cov_tol = (
        second_tol
        + mean_tol.unsqueeze(-1) * m_abs.unsqueeze(-2)
        + m_abs.unsqueeze(-1) * mean_tol.unsqueeze(-2)
        + gamma(2, dtype) * (second_abs + m_abs.unsqueeze(-1) * m_abs.unsqueeze(-2))
    )
    return mean_tol, cov_tol


def attention_tolerance(query: torch.Tensor, tokens: torch.Tensor, U: torch.Tensor, V: torch.Tensor,
                        dtype=torch.float64):
    """Bound on the rounding error of T = V Σᵢ softmax(⟨U z_q, zᵢ⟩) zᵢ computed in ``dtype`` [..., Dout].

    The tilt a = U z_q carries γ_D|U||z_q|, moving every score by ≤ max_i Σⱼ γ_D(|U||z_q|)ⱼ|zᵢⱼ|; the
    weighted mean is then bounded by :func:`tilted_moments_tolerance`, and the readout V z̄ adds
    |V|·(mean error) + γ_D|V||z̄|.
    """
    q, z = query.to(torch.float64), tokens.to(torch.float64)
    U64, V64 = U.to(torch.float64), V.to(torch.float64)
    dim = q.shape[-1]
    tilt = q @ U64.T
    tilt_err = rounding_tolerance(dim, q.abs() @ U64.abs().T, dtype)  # [..., D]
    from_tilt = torch.einsum("...d,...ld->...l", tilt_err, z.abs()).amax(-1)
    mean_tol, _ = tilted_moments_tolerance(tilt, z, dtype, score_error=from_tilt)
    w = torch.softmax(torch.einsum("...d,...ld->...l", tilt, z), -1)
    mean = torch.einsum("...l,...ld->...d", w, z.expand(*w.shape, dim))
    return mean_tol @ V64.abs().T + rounding_tolerance(dim, mean.abs() @ V64.abs().T, dtype)


def infinite_prompt_risk_abs(task, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, O: torch.Tensor) -> torch.Tensor:
    """|·| evaluation (module doc) of ``largeprompt.icl.risks.infinite_prompt_risk``; pass |Q|, |K|, |V|, |O|.

    Λ → |Λ| and the −I of C₁ → +I; γ_N times this bounds the rounding error of R∞, and γ_N times its
    autograd gradient (differentiable, so call it on |θ| with requires_grad) that of ∇R∞.
    """
    lam = task.covariance.to(Q.dtype).abs()
    tau2, sigma2, d = task.task_variance, task.noise_variance, task.dim
    U = K.T @ Q / (d + 1) ** 0.5
    u = (O @ V).reshape(-1)
    Mx, my, ux, uy = U[:d, :d], U[d, :d], u[:d], u[d]
    c0 = Mx.T @ lam @ ux + sigma2 * uy * my
    C1 = uy * (Mx.T @ lam) + torch.outer(my, lam @ ux) + torch.eye(d, dtype=Q.dtype)
    c2 = uy * my
    tr, tr2 = torch.trace(lam), torch.trace(lam @ lam)
    return (c0 @ lam @ c0 + tau2 * torch.trace(C1.T @ lam @ C1) + 2 * tau2 * tr * (c0 @ lam @ c2)
            + tau2**2 * (tr**2 + 2 * tr2) * (c2 @ lam @ c2) + sigma2)


def assert_within(actual, expected, tolerance, what: str = "") -> None:
    """Assert |actual − expected| ≤ tolerance entrywise (tensors, arrays or floats); the message gives the
    worst error and its ratio to the bound."""
    def as_float64(x):
        return x.detach().to(torch.float64) if torch.is_tensor(x) else torch.from_numpy(np.array(x, dtype=np.float64))

    err = (as_float64(actual) - as_float64(expected)).abs()
    t = as_float64(tolerance)
    if not bool((err <= t).all()):
        ratio = float(torch.where(err == 0, torch.zeros_like(err), err / t).max())
        raise AssertionError(f"{what}: max error {float(err.max()):.3g}, worst error/bound ratio {ratio:.3g} > 1")
