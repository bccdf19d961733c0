"""The random-query rate at large tilt: exponents and a semi-analytic simulation (docs/theory.md#random-query-rate).

Gaussian tokens z_i = √c y_i, y_i ~ N(0, I_D), query z_q = g ~ N(0, I_D), U = I, V = I_D: the weights are
w_i = e^{θ x_i} with θ = √c‖g‖ = √κ and x_i = ⟨g/‖g‖, y_i⟩ ~ N(0, 1), and T_∞ = c g. Writing κ = α ln L, the
conditional mean squared error over prompts decays like L^{−f(α)} (:func:`conditional_exponent`) and the
query's κ has density ≈ L^{−α/(2c)}, so E‖T_L − T_∞‖² ≈ L^{−p} with p = min_α [α/(2c) + f(α)]
(:func:`asymptotic_mean_exponent`). :func:`mean_sq_error_curve` checks this independently of the pipeline: it
integrates over the query radius by quadrature and, per radius, samples the projected self-normalised estimator
from the exact law of the largest tokens and a Gaussian law of the rest, at any L up to 2^1000 (float range).

Nothing here imports :mod:`largeprompt.maths.rates` (which calls :func:`asymptotic_mean_exponent`).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special

BOUNDED_MEASURES = ("rademacher", "uniform")
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _check_measure(measure: str) -> bool:
    """True for Gaussian tokens, False for bounded ones; ValueError otherwise."""
    if measure == "gaussian":
        return True
    if measure in BOUNDED_MEASURES:
        return False
    raise ValueError(f"unknown token measure {measure!r}; allowed gaussian, {', '.join(BOUNDED_MEASURES)}")


def conditional_exponent(alpha) -> np.ndarray:
    """f(α): E_prompt‖T_L − T_∞‖² ≈ L^{−f(α)} at a query with κ = α ln L (docs/theory.md#random-query-rate).

    f = 1 − α (α ≤ 2/3, the CLT term e^κ/L), (α − 2)²/(8α) (2/3 ≤ α ≤ 2, one token of weight share O(1), a rare
    prompt event), 0 (α ≥ 2, the tilted mean lies beyond every token). f is C¹ at 2/3.
    """
    a = np.asarray(alpha, dtype=np.float64)
    jump = (a - 2.0) ** 2 / (8.0 * np.maximum(a, 1e-300))
    return np.where(a <= 2.0 / 3.0, 1.0 - a, np.where(a <= 2.0, jump, 0.0))


def jump_exponent(c) -> np.ndarray:
    """p_J(c) = (√(1 + 4/c) − 1)/2 = min_α [α/(2c) + (α − 2)²/(8α)], the exponent of the single-big-jump term,
    reached at α* = 2√(c/(4 + c)) (docs/theory.md#random-query-rate)."""
    c = np.asarray(c, dtype=np.float64)
    return 0.5 * (np.sqrt(1.0 + 4.0 / c) - 1.0)


def asymptotic_mean_exponent(c, measure: str = "gaussian") -> np.ndarray:
    """p(c) of E_{z_q, prompt}‖T_L − T_∞‖² ≍ polylog(L)·L^{−p} (docs/theory.md#random-query-rate).

    Gaussian tokens: p = 1 for c ≤ 1/2 and p = (√(1 + 4/c) − 1)/2 for c > 1/2 (0.618 at c = 1, 0.207 at c = 4).
    Bounded tokens (Rademacher, uniform): ρ(a) has every moment over Gaussian queries, so p = 1 at every c.
    """
    c = np.asarray(c, dtype=np.float64)
    if not _check_measure(measure):
        return np.ones_like(c)
    return np.minimum(1.0, jump_exponent(c))


def correction_exponent(c, measure: str = "gaussian") -> np.ndarray:
    """q(c) in E‖T_L − T_∞‖² = (A/L)(1 + O(L^{−q})), A = E tr C (docs/theory.md#random-query-rate).

    Gaussian tokens: q = min(1, p_J(c) − 1) = min(1, (√(1 + 4/c) − 3)/2) for c < 1/2 (1 for c ≤ 1/6, 0.56 at
    c = 1/4), the big-jump term L^{−p_J} relative to A/L; 0 for c ≥ 1/2, where A is infinite and there is no
    1/L leading term. Bounded tokens: 1 at every c.
    """
    c = np.asarray(c, dtype=np.float64)
    if not _check_measure(measure):
        return np.ones_like(c)
    return np.clip(jump_exponent(c) - 1.0, 0.0, 1.0)


def _jump_point(c):
    """(α*, β*) of the big-jump Laplace point: α* = 2√(c/(4 + c)), β* = 1/α* + 1/2."""
    alpha = 2.0 * np.sqrt(c / (4.0 + c))
    return alpha, 1.0 / alpha + 0.5


def asymptotic_constant(c, dim: int) -> np.ndarray:
    """K(c, D) of E‖T_L − T_∞‖² ~ K (ln L)^{D/2} L^{−p(c)} as L → ∞, for c > 1/2 (NaN otherwise).

    K = (α/c)^{D/2−1} α (α^{−1/2} − α^{1/2}/2)² Γ(2 − β) Γ(β) / (2^{D/2} Γ(D/2)) at the Laplace point (α*, β*)
    of :func:`_jump_point` (docs/theory.md#random-query-rate). Its relative corrections are O(1/ln L).
    """
    c = np.asarray(c, dtype=np.float64)
    safe = np.where(c > 0.5, c, 1.0)
    alpha, beta = _jump_point(safe)
    gammas = np.exp(special.gammaln(2.0 - beta) + special.gammaln(beta))
    value = ((alpha / safe) ** (dim / 2.0 - 1.0) * alpha * (alpha ** -0.5 - 0.5 * alpha ** 0.5) ** 2 * gammas
             / (2.0 ** (dim / 2.0) * math.gamma(dim / 2.0)))
    return np.where(c > 0.5, value, np.nan)


def asymptotic_mean_error(c: float, dim: int, prompt_lengths) -> np.ndarray:
    """The leading term K(c, D) (ln L)^{D/2} L^{−p(c)} of E‖T_L − T_∞‖² for c > 1/2 (docs/theory.md#random-query-rate)."""
    log_l = _log_lengths(prompt_lengths)
    return asymptotic_constant(c, dim) * log_l ** (dim / 2.0) * np.exp(-jump_exponent(c) * log_l)


# --- the semi-analytic simulation --------------------------------------------------------------------------------------

def _log_lengths(prompt_lengths) -> np.ndarray:
    """ln L for every L (exact for Python ints)."""
    return np.array([math.log(n) for n in np.atleast_1d(np.asarray(prompt_lengths, dtype=object))], dtype=np.float64)


def _radius_nodes(log_l: float, dim: int, n_nodes: int, per_panel: int = 8):
    """Composite Gauss–Legendre nodes r [M] on [0, R] and weights × the χ_D density of ‖g‖ [M]: at least
    ``n_nodes``, in panels of ``per_panel`` nodes no wider than min(1.5, 18/√ln L) (a prompt's error switches
    on over δθ ≈ 1/√ln L as its largest token takes over).

    R² = 2 ln L + 80 + 4D: beyond it P(‖g‖ > R) ≤ e^{−40}/L, and the squared error is O(polylog L) there.
    """
    upper = math.sqrt(2.0 * log_l + 80.0 + 4.0 * dim)
    n_panels = max(1, n_nodes // per_panel, math.ceil(upper / min(1.5, 18.0 / math.sqrt(log_l))))
    x, w = np.polynomial.legendre.leggauss(per_panel)
    edges = np.linspace(0.0, upper, n_panels + 1)
    half, mid = np.diff(edges)[:, None] / 2.0, (edges[:-1] + edges[1:])[:, None] / 2.0
    r, weights = (mid + half * x).ravel(), (half * w).ravel()
    log_density = (dim - 1) * np.log(r) - 0.5 * r * r - (dim / 2.0 - 1.0) * math.log(2.0) - math.lgamma(dim / 2.0)
    return r, weights * np.exp(log_density)


def _base_draws(n_draws: int, n_top: int, seed: int) -> dict:
    """The randomness shared by every L and radius (common random numbers): stratified uniforms for the first
    exponential spacing (half natural, half log-uniform), the next n_top spacings, a normal for the Gamma
    remainder Γ_{L+1} − Γ_k."""
    rng = np.random.default_rng(seed)
    n_nat = n_draws // 2
    return {
        "u_nat": (np.arange(n_nat) + rng.random(n_nat)) / n_nat,
        "u_log": (np.arange(n_draws - n_nat) + rng.random(n_draws - n_nat)) / (n_draws - n_nat),
        "spacings": rng.standard_exponential((n_draws, n_top)),
        "z_gamma": rng.standard_normal(n_draws),
    }


def _first_spacing(base: dict, log_l: float):
    """log E₁ [N] and its importance weight [N]: E₁ ~ Exp(1) for the first half, log E₁ uniform on
    [−ln L/2 − 10, 2] for the second (a rare large maximum carries the mean at large tilt); weights are the
    density ratio to the equal mixture of the two (deterministic-mixture importance sampling)."""
    lo, hi = -0.5 * log_l - 10.0, 2.0
    log_e1 = np.concatenate([np.log(-np.log(base["u_nat"])), lo + (hi - lo) * base["u_log"]])
    frac = len(base["u_nat"]) / len(log_e1)
    natural = np.exp(log_e1 - np.exp(log_e1))  # density of log E₁
    uniform = np.where((log_e1 >= lo) & (log_e1 <= hi), 1.0 / (hi - lo), 0.0)
    return log_e1, natural / (frac * natural + (1.0 - frac) * uniform)


def _top_tokens(base: dict, log_e1, length: float, log_l: float, n_top: int):
    """The k = min(n_top, L) largest of L standard normals [N, k], decreasing, and log(L − k).

    Φ̄(X_(j)) = Γ_j/Γ_{L+1} with Γ_j the partial sums of i.i.d. Exp(1) spacings (Rényi); Γ_{L+1} − Γ_k ~
    Gamma(L + 1 − k) by its inverse CDF (Wilson–Hilferty beyond shape 10⁴). Inverted in log space.
    """
    k = int(min(n_top, length))
    spacings = np.concatenate([np.exp(log_e1)[:, None], base["spacings"]], axis=1)
    partial = np.cumsum(spacings, axis=1)  # Γ_1 … Γ_{n_top+1} [N, n_top+1]
    if length <= n_top:
        log_total, log_rest = np.log(partial[:, int(length)]), -np.inf
    else:
        shape = length + 1.0 - k
        log_shape = log_l + math.log1p((1.0 - k) / length)
        z = base["z_gamma"]
        if shape < 1e4:
            log_g = np.log(special.gammaincinv(shape, special.ndtr(z)))
        else:
            inv = math.exp(-log_shape) if log_shape < 700 else 0.0
            log_g = log_shape + 3.0 * np.log1p(-inv / 9.0 + z * math.sqrt(inv) / 3.0)
        log_total = np.logaddexp(np.log(partial[:, k - 1]), log_g)
        log_rest = log_l + math.log1p(-k / length)  # log(L − k), the number of bulk tokens
    x = -special.ndtri_exp(np.log(partial[:, :k]) - log_total[:, None])
    return x, log_rest


def _truncated_moments(theta, t):
    """For x ~ N(0, 1) | x < t, d = x − θ and j = 1…3: log E e^{jθx} [j] and E[d e^{jθx}]/E e^{jθx},
    E[d² e^{jθx}]/E e^{jθx} (closed forms: under e^{jθx} the law is N(jθ, 1) truncated at t)."""
    log_trunc = special.log_ndtr(t)
    out = {}
    for j in range(1, 4):
        s = t - j * theta
        log_cdf = special.log_ndtr(s)
        lam = np.exp(-0.5 * s * s - _LOG_SQRT_2PI - log_cdf)  # inverse Mills ratio φ(s)/Φ(s)
        b = (j - 1) * theta
        out[j] = (0.5 * j * j * theta * theta + log_cdf - log_trunc, b - lam, 1.0 + b * b - lam * (s + 2.0 * b))
    return out


_HERMITE_NODES, _HERMITE_WEIGHTS = np.polynomial.hermite_e.hermegauss(8)  # as accurate as 24 nodes to ~1e-10
_HERMITE_WEIGHTS = _HERMITE_WEIGHTS / math.sqrt(2.0 * math.pi)  # E f(Z) ≈ Σ w_h f(z_h), Z ~ N(0, 1)


def _bulk_sums(theta, t, top_log_weight, log_n: float):
    """The bulk's sums (Σw, Σw d, Σw²) over the L − k tokens below t = X_(k), scaled by e^{−R}, e^{−R}, e^{−2R},
    with R = max(θ X_(1), log E Σw) [M, N], from their Gaussian (CLT) law with the exact truncated-normal mean
    and covariance (:func:`_truncated_moments`). Σw = m₀ + l₀₀ z is returned at the Gauss–Hermite nodes z
    [H, M, N] (clipped at 0); given it, Σw d as its conditional mean and variance and Σw² as its conditional
    mean (the error is quadratic in the first and linear in the second, so the rest integrates exactly).
    Returns (Σw, E[Σw d | Σw], Var[Σw d | Σw], E[Σw² | Σw], R)."""
    mom = _truncated_moments(theta, t)
    scale = np.maximum(top_log_weight, log_n + mom[1][0])
    s1, s2, s3 = (np.exp(log_n + mom[j][0] - j * scale) for j in range(1, 4))  # E Σ w^j e^{−jR}
    inv_n = math.exp(-log_n)
    m0, m1, m2 = s1, s1 * mom[1][1], s2
    c00, c01, c02 = s2 - s1 * s1 * inv_n, s2 * mom[2][1] - m0 * m1 * inv_n, s3 - s1 * s2 * inv_n
    c11 = s2 * mom[2][2] - m1 * m1 * inv_n
    l00 = np.sqrt(np.maximum(c00, 0.0))
    l10, l20 = (np.divide(v, l00, out=np.zeros_like(v), where=l00 > 0) for v in (c01, c02))
    z = _HERMITE_NODES[:, None, None]
    b0 = np.maximum(m0 + l00 * z, 0.0)
    return b0, m1 + l10 * z, np.maximum(c11 - l10 * l10, 0.0), np.maximum(m2 + l20 * z, 0.0), scale


def _conditional_sq_errors(c: float, dim: int, theta, x, log_n: float):
    """c E[(Σ w d/Σ w)² + (D − 1) Σ w²/(Σ w)²] [M, N] at radii θ [M, 1] for the prompts whose top tokens are
    x [N, k], the bulk integrated: the squared error along g/‖g‖ plus the exact conditional mean of the D − 1
    orthogonal components."""
    top = theta * x[:, 0]  # log weight of the largest token [M, N]
    if np.isfinite(log_n):
        b0, b1, b1_var, b2, scale = _bulk_sums(theta, x[:, -1], top, log_n)
        hermite = _HERMITE_WEIGHTS
    else:
        b0 = b1 = b1_var = b2 = np.zeros((1, 1, 1))
        scale, hermite = top, np.ones(1)
    w = np.exp(theta[..., None] * x[None] - scale[..., None])  # [M, N, k]
    s0 = np.maximum(w.sum(-1) + b0, 1e-300)  # [H, M, N]
    s1 = np.einsum("mnk,mnk->mn", w, x[None] - theta[..., None]) + b1
    s2 = np.einsum("mnk,mnk->mn", w, w) + b2
    return c * np.tensordot(hermite, (s1 * s1 + b1_var + (dim - 1) * s2) / (s0 * s0), axes=1)


def _draw_contributions(c: float, dim: int, prompt_lengths, nodes, n_draws: int, n_top: int, seed: int):
    """Per-draw contributions [P, N] whose mean is the self-normalised importance-sampling estimate
    E = Σ wᵢhᵢ/Σ wᵢ, hᵢ = Σ_m (node weight × conditional squared error) of draw i, ``nodes(j, ln L)`` → (θ [M],
    weights [M]) the radii of the j-th L: E + (wᵢ/w̄)(hᵢ − E), the estimate's linearisation in each draw (so
    their spread gives its standard error). Normalising removes the error of w̄ ≠ 1, which dominates where
    hᵢ hardly varies (the CLT range)."""
    base = _base_draws(n_draws, n_top, seed)
    lengths = np.atleast_1d(np.asarray(prompt_lengths, dtype=np.float64))
    out = []
    for j, (length, log_l) in enumerate(zip(lengths, _log_lengths(prompt_lengths))):
        theta, node_weights = nodes(j, log_l)
        log_e1, is_weight = _first_spacing(base, log_l)
        x, log_n = _top_tokens(base, log_e1, float(length), log_l, n_top)
        err = _conditional_sq_errors(c, dim, np.asarray(theta)[:, None], x, log_n)  # [M, N]
        h, rel = node_weights @ err, is_weight / is_weight.mean()
        estimate = (rel * h).mean()
        out.append(estimate + rel * (h - estimate))
    return np.stack(out)


def _mean_and_stderr(contrib, return_stderr: bool):
    """The mean over draws [P] and, optionally, its standard error (on contrib/mean: squares of values near
    1e-300 would underflow)."""
    curve = contrib.mean(axis=1)
    if return_stderr:
        return curve, curve * _stratified_stderr(contrib / curve[:, None], contrib.shape[1] // 2)
    return curve


def conditional_mean_sq_error(c: float, dim: int, kappa, prompt_lengths, n_draws: int = 512, n_top: int = 32,
                              seed: int = 0, return_stderr: bool = False):
    """E_prompt‖T_L − T_∞‖² [P] at a fixed query with κ = c‖g‖² (one value, or one per L: e.g. α ln L), by the
    prompt part of :func:`mean_sq_error_curve` (docs/theory.md#random-query-rate). Decays like L^{−f(α)}."""
    kappa = np.broadcast_to(np.asarray(kappa, dtype=np.float64), (len(_log_lengths(prompt_lengths)),))
    contrib = _draw_contributions(c, dim, prompt_lengths, lambda j, _: (np.sqrt(kappa[j:j + 1]), np.ones(1)),
                                  n_draws, n_top, seed)
    return _mean_and_stderr(contrib, return_stderr)


def _mean_contributions(c: float, dim: int, prompt_lengths, n_nodes: int, n_draws: int, n_top: int, seed: int):
    """Per-draw estimates [P, N] of E‖T_L − T_∞‖², the query radius integrated by :func:`_radius_nodes`."""
    def nodes(_, log_l):
        r, weights = _radius_nodes(log_l, dim, n_nodes)
        return math.sqrt(c) * r, weights
    return _draw_contributions(c, dim, prompt_lengths, nodes, n_draws, n_top, seed)


def mean_sq_error_curve(c: float, dim: int, prompt_lengths, n_nodes: int = 64, n_draws: int = 512, n_top: int = 32,
                        seed: int = 0, return_stderr: bool = False):
    """E_{z_q, prompt}‖T_L − T_∞‖² [P] for the Gaussian sweep (tokens N(0, cI_D), z_q ~ N(0, I_D), U = I, V = I_D) by
    the semi-analytic simulation of docs/theory.md#random-query-rate, for L up to ~2^1000.

    The query radius ‖g‖ is integrated by composite Gauss–Legendre quadrature (``n_nodes``) against its χ_D law
    up to ‖g‖² = 2 ln L + 80 + 4D; per radius, ``n_draws`` prompts (shared by every radius and L) take their
    ``n_top`` largest projected tokens exactly (Rényi spacings, the first importance-sampled) and the sums of the
    rest from a Gaussian with the truncated-normal moments; the orthogonal components enter through their exact
    conditional variance, the bulk's fluctuation by Gauss–Hermite quadrature. Deterministic given ``seed``.
    With ``return_stderr`` also the Monte Carlo standard error of each entry (collapsed strata: conservative).
    """
    return _mean_and_stderr(_mean_contributions(c, dim, prompt_lengths, n_nodes, n_draws, n_top, seed), return_stderr)


def _stratified_stderr(values, n_first: int) -> np.ndarray:
    """Standard error of the mean over the last axis of draws made one per stratum, in two stratified halves
    (the first ``n_first`` draws, then the rest), by collapsed strata: Var ≈ Σ over adjacent pairs of (a − b)²/N²
    (conservative; an odd draw out counts its squared deviation from its half's mean)."""
    total = 0.0
    for half in (values[..., :n_first], values[..., n_first:]):
        even = half.shape[-1] - half.shape[-1] % 2
        total = total + ((half[..., 0:even:2] - half[..., 1:even:2]) ** 2).sum(-1)
        if even < half.shape[-1]:
            total = total + (half[..., -1] - half.mean(-1)) ** 2
    return np.sqrt(total) / values.shape[-1]


def _slope_weights(log_l) -> np.ndarray:
    """a [P] with −slope = a · log values for the least-squares line on (log L, log values)."""
    x = log_l - log_l.mean()
    return -x / (x @ x)


def finite_range_exponent(c: float, dim: int, prompt_lengths, return_stderr: bool = False, **kwargs):
    """−slope of the least-squares line of log E‖T_L − T_∞‖² (:func:`mean_sq_error_curve`) on log L over the given
    L, e.g. the fitted upper half of the pipeline's grid (docs/theory.md#random-query-rate). ``kwargs`` go to
    the curve. With ``return_stderr`` also its Monte Carlo standard error (delta method over the draws, which
    every L shares)."""
    defaults = dict(n_nodes=64, n_draws=512, n_top=32, seed=0)
    contrib = _mean_contributions(c, dim, prompt_lengths, **{**defaults, **kwargs})  # [P, N]
    curve = contrib.mean(axis=1)
    a = _slope_weights(_log_lengths(prompt_lengths))
    exponent = float(a @ np.log(curve))
    if not return_stderr:
        return exponent
    influence = (a / curve) @ contrib  # [N]: the exponent's linearisation in each draw's contribution
    return exponent, float(_stratified_stderr(influence, contrib.shape[1] // 2))


def local_exponent_curve(c: float, dim: int, prompt_lengths, **kwargs) -> np.ndarray:
    """−d log E‖T_L − T_∞‖²/d log L [P] of :func:`mean_sq_error_curve` (central differences, one-sided at the ends)."""
    curve = mean_sq_error_curve(c, dim, prompt_lengths, **kwargs)
    return -np.gradient(np.log(curve), _log_lengths(prompt_lengths))
