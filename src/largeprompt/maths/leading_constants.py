"""Leading coefficients A(c) = lim_L L·E_{z_q, prompt} err² of the random-query concentration sweep
(docs/theory.md#random-query-rate, docs/theory.md#jacobians).

The sweep (:mod:`largeprompt.maths.concentration`) draws z_q ~ N(0, I_D) and one prompt per repetition and records
three squared errors, with V = I_D and D_out = D. At a fixed query a = U z_q the delta method gives
(docs/theory.md#fixed-query-fluctuations, docs/theory.md#jacobians), with ρ = e^{K(2a)−2K(a)}, m_a = ∇K(a), H = ∇²K(a):

* output: L·E‖T_L − T_∞‖² → tr C = ρ E_{z~μ_{2a}} ‖z − m_a‖²;
* grad_V: L·E D‖z̄_L − ∇K(a)‖² → D tr C;
* grad_U: L·E‖Σ̂_L − H‖² ‖z_q‖² → ρ ‖z_q‖² E_{z~μ_{2a}} ‖(z − m_a)(z − m_a)ᵀ − H‖_F².

A(c) is the average of these over z_q. Scales are those of :func:`largeprompt.maths.concentration.tilt_scales`:
Gaussian tokens N(0, c I) with U = I (closed forms, finite only for c < 1/2: the weight is e^{c‖z_q‖²});
unit-variance Rademacher / uniform tokens with U = √c I (finite at every c).

Bounded tokens are products of one 1-D law, so μ_{2a} is a product measure and every fixed-query constant is a
sum of products of per-coordinate functions of t = (z_q)_j. A tensor-product rule over z_q applied to such a sum
equals the same sums of products of 1-D rules, which is how it is evaluated: O(D·n) work instead of O(n^D), any D.

The 1-D rule is the trapezoidal rule for ∫ φ(t) g(t) dt, not Gauss–Hermite: g (tanh(2√c t), 𝓛(2√(3c) t), …) has
poles at distance d = π/(4√c) (Rademacher) or π/(2√(3c)) (uniform) from the real axis, where Gauss–Hermite converges
only like e^{−O(d√n)} (Rademacher at c = 4: 100 and 200 nodes still differ by 3e-4; numpy's hermegauss(400) is NaN),
while the trapezoidal rule of step h on an integrand analytic in the strip |Im t| < d converges like e^{−2πd/h}.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.polynomial.legendre import leggauss
from scipy.special import logsumexp

METRICS = ("output", "grad_U", "grad_V")
MEASURES = ("gaussian", "rademacher", "uniform")
# Trapezoidal rule over each query coordinate: step h = QUERY_STEP/max(1, √c) keeps 2πd/h ≥ 2π²/(4·0.05) ≈ 99 at every
# c, so the discretisation error is ~e^{−2πd'/h} (any d' < d) times the integrand's size on |Im t| = d'; |t| ≤ 16
# leaves out a Gaussian mass below 1e-56 (tests/test_leading_constants.py::test_quadrature_converges_by_doubling).
QUERY_STEP = 0.05
QUERY_HALF_WIDTH = 16.0
# Gauss–Legendre nodes for the uniform law on [−√3, √3] = √3·[−1, 1] (exact to degree 399): e^{b u}·poly(u) to
# rounding for every tilt b = 2√(3c)·t ≤ 111 the query rule reaches at c ≤ 4; 100 and 400 nodes agree with 200 to 1e-13.
GL_NODES = 200


def gaussian_leading_coefficient(metric: str, c: float, dim: int) -> float:
    """A(c) for tokens N(0, c I_D), U = I (docs/theory.md#random-query-rate); NaN for c ≥ 1/2.

    Under the weight e^{c‖g‖²} the query law is (1 − 2c)^{−D/2} N(0, s I), s = 1/(1 − 2c), so ‖g‖² → s χ²_D with
    E r = D, E r² = D(D+2), E r³ = D(D+2)(D+4) for r ~ χ²_D. Fixed-query constants (Isserlis, B = I, S = cI, ν = c g):
    tr C = e^{c r}(cD + c² r), grad_U = e^{c r} r [c²D(D+1) + 2c³(D+1) r + c⁴ r²], r = ‖g‖². Hence
    output = cD(1−2c)^{−D/2}(1−c)s, grad_V = D·output, grad_U = (1−2c)^{−D/2} D [c²D(D+1)s + 2c³(D+1)(D+2)s²
    + c⁴(D+2)(D+4)s³].
    """
    if c >= 0.5:
        return math.nan
    s = 1.0 / (1.0 - 2.0 * c)
    pref = s ** (dim / 2.0)  # E e^{c‖g‖²}
    output = c * dim * pref * (1.0 - c) * s
    if metric == "output":
        return output
    if metric == "grad_V":
        return dim * output
    return pref * dim * (c**2 * dim * (dim + 1) * s + 2 * c**3 * (dim + 1) * (dim + 2) * s**2
                         + c**4 * (dim + 2) * (dim + 4) * s**3)


def _atoms(measure: str, gl_nodes: int = GL_NODES) -> tuple[np.ndarray, np.ndarray]:
    """(atoms x [K], log weights [K]) of the unit-variance 1-D law: Rademacher exactly, uniform by Gauss–Legendre."""
    if measure == "rademacher":
        return np.array([-1.0, 1.0]), np.log(np.array([0.5, 0.5]))
    if measure == "uniform":
        x, w = leggauss(gl_nodes)
        return math.sqrt(3.0) * x, np.log(w / 2.0)
    raise ValueError(f"no atoms for token measure {measure!r}; allowed: 'rademacher', 'uniform'")


def coordinate_functions(measure: str, c: float, t: np.ndarray, gl_nodes: int = GL_NODES):
    """Per-coordinate (log ρ₁, e, f) at query coordinates t [n], for the sweep's scales.

    With a = u t (u = 1 Gaussian, √c otherwise), m = k'(a), h = k''(a) and y = z − m under the tilt 2a of the 1-D law:
    log ρ₁ = k(2a) − 2k(a), e = E y², f = E (y² − h)². Then ρ = Π ρ₁, tr C = ρ Σ e_j and
    E_{μ_{2a}}‖yyᵀ − H‖_F² = Σ_j f_j + Σ_{i≠j} e_i e_j.
    """
    t = np.asarray(t, dtype=np.float64)
    if measure == "gaussian":  # σ² = c, a = t: y ~ N(c t, c)
        return c * t**2, c + c**2 * t**2, c**4 * t**4 + 4 * c**3 * t**2 + 2 * c**2
    x, log_w = _atoms(measure, gl_nodes)
    a = math.sqrt(c) * t[:, None]  # [n, 1]
    logits_a, logits_2a = log_w + a * x, log_w + 2.0 * a * x  # [n, K]
    log_m_a, log_m_2a = logsumexp(logits_a, axis=1), logsumexp(logits_2a, axis=1)
    p_a, p_2a = np.exp(logits_a - log_m_a[:, None]), np.exp(logits_2a - log_m_2a[:, None])
    m = (p_a * x).sum(1, keepdims=True)  # k'(a)
    h = (p_a * (x - m) ** 2).sum(1, keepdims=True)  # k''(a)
    y2 = (x - m) ** 2
    return log_m_2a - 2.0 * log_m_a, (p_2a * y2).sum(1), (p_2a * (y2 - h) ** 2).sum(1)


def query_rule(c: float, refine: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(nodes t, weights) of the trapezoidal rule for E_{t~N(0,1)}: step QUERY_STEP/(max(1, √c)·refine) on |t| ≤ 16."""
    step = QUERY_STEP / (max(1.0, math.sqrt(c)) * refine)
    t = step * np.arange(-math.floor(QUERY_HALF_WIDTH / step), math.floor(QUERY_HALF_WIDTH / step) + 1)
    return t, step * np.exp(-0.5 * t**2) / math.sqrt(2.0 * math.pi)


def query_averages(measure: str, c: float, rule=None, gl_nodes: int = GL_NODES) -> dict:
    """1-D averages over t ~ N(0, 1) of ρ₁·{1, t², e, t²e, f, t²f}, keyed rho, rho_t2, e, e_t2, f, f_t2, with
    (ρ₁, e, f) of :func:`coordinate_functions`, by the rule (nodes, weights), :func:`query_rule` by default."""
    t, w = query_rule(c) if rule is None else rule
    log_rho, e, f = coordinate_functions(measure, c, t, gl_nodes)
    weighted = w * np.exp(log_rho)  # [n]
    values = {"rho": 1.0, "rho_t2": t**2, "e": e, "e_t2": t**2 * e, "f": f, "f_t2": t**2 * f}
    return {key: float(np.sum(weighted * v)) for key, v in values.items()}


def product_coefficient(avg: dict, metric: str, dim: int) -> float:
    """A from the 1-D averages of :func:`query_averages` for a product law in dimension D (independent coordinates).

    With R = E ρ₁, R₂ = E ρ₁t², E = E ρ₁e, E₂ = E ρ₁t²e, Φ = E ρ₁f, Φ₂ = E ρ₁t²f: output = D·E·R^{D−1};
    grad_V = D·output; grad_U = E[ρ Σ_k t_k² (Σ_i f_i + Σ_{i≠j} e_i e_j)] =
    D Φ₂ R^{D−1} + D(D−1) Φ R₂ R^{D−2} + 2D(D−1) E₂ E R^{D−2} + D(D−1)(D−2) E² R₂ R^{D−3}.
    """
    d, r = dim, avg["rho"]
    output = d * avg["e"] * r ** (d - 1)
    if metric == "output":
        return output
    if metric == "grad_V":
        return d * output
    return (d * avg["f_t2"] * r ** (d - 1) + d * (d - 1) * avg["f"] * avg["rho_t2"] * r ** (d - 2)
            + 2 * d * (d - 1) * avg["e_t2"] * avg["e"] * r ** (d - 2)
            + d * (d - 1) * (d - 2) * avg["e"] ** 2 * avg["rho_t2"] * r ** (d - 3))


def leading_coefficient(measure: str, metric: str, c: float, dim: int) -> float:
    """A(c) = lim_L L·E_{z_q, prompt} err² for the sweep's metric at tilt strength c (module docstring); NaN if infinite."""
    if measure not in MEASURES:
        raise ValueError(f"unknown token measure {measure!r}; allowed: {MEASURES}")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; allowed: {METRICS}")
    if not (c >= 0.0 and math.isfinite(c)) or int(dim) != dim or dim < 1:
        raise ValueError(f"need finite c ≥ 0 and an integer dim ≥ 1; got c = {c}, dim = {dim}")
    if measure == "gaussian":
        return gaussian_leading_coefficient(metric, float(c), int(dim))
    return product_coefficient(query_averages(measure, float(c)), metric, int(dim))
