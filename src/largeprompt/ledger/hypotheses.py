"""The ledger's statistical tests (docs/experiments.md#claims): each claim is a hypothesis test with a p-value, so
that its size and power can be measured (:mod:`largeprompt.ledger.calibration`) and the whole ledger corrected for
multiple testing (Holm).

Every test takes an estimate with its standard error (a bootstrap or a t standard error, normal approximation) and
returns an :class:`Outcome`: the value, its 95% interval, the prediction, the p-value of the null hypothesis "the
theory holds" and the verdict at level :data:`ALPHA`. ``agrees``: the test does not reject; ``disagrees``: it
rejects; ``inconclusive``: no estimate, or an interval wider than the claim's stated resolution (the test could not
reject an error of that size, so not rejecting says nothing).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from largeprompt.ledger.verdicts import AGREES, DISAGREES, INCONCLUSIVE

ALPHA = 0.05  # each test's level, and the family-wise level of the Holm-adjusted verdicts
Z = float(stats.norm.ppf(1 - ALPHA / 2))


@dataclass(frozen=True)
class Outcome:
    """One test's result: ``value`` with its interval [lo, hi], the ``predicted`` value, the p-value and verdict."""

    value: float
    lo: float
    hi: float
    predicted: float
    p_value: float
    verdict: str


def _finite(*xs) -> bool:
    return all(x is not None and math.isfinite(float(x)) for x in xs)


def verdict_of(p_value: float, alpha: float = ALPHA) -> str:
    """agrees when the null (the theory) is not rejected at ``alpha``, disagrees when it is; inconclusive: no p."""
    if not _finite(p_value):
        return INCONCLUSIVE
    return DISAGREES if p_value < alpha else AGREES


def resolved(verdict: str, half_width: float, resolution: float | None) -> str:
    """An interval wider than ``resolution`` (half-width) cannot reject an error that large: inconclusive."""
    if resolution is not None and verdict == AGREES and not half_width <= resolution:
        return INCONCLUSIVE
    return verdict


def two_sided(estimate, se, predicted, resolution: float | None = None, dof: float | None = None) -> Outcome:
    """H0: θ = predicted, by z = (θ̂ − predicted)/se (normal approximation, or Student's t with ``dof`` degrees of
    freedom where se is itself estimated from few points); interval θ̂ ± q₀.₉₇₅ se."""
    if not _finite(estimate, se, predicted) or se <= 0:
        return Outcome(_f(estimate), math.nan, math.nan, _f(predicted), math.nan, INCONCLUSIVE)
    law = stats.norm if dof is None else stats.t(dof)
    p = float(2 * law.sf(abs(estimate - predicted) / se))
    q = float(law.ppf(1 - ALPHA / 2))
    verdict = resolved(verdict_of(p), q * se, resolution)
    return Outcome(float(estimate), estimate - q * se, estimate + q * se, float(predicted), p, verdict)


def at_least(estimate, se, bound, resolution: float | None = None) -> Outcome:
    """H0: θ ≥ bound (a one-sided bound of the theory); rejected when θ̂ lies significantly below it."""
    if not _finite(estimate, se, bound) or se <= 0:
        return Outcome(_f(estimate), math.nan, math.nan, _f(bound), math.nan, INCONCLUSIVE)
    p = float(stats.norm.cdf((estimate - bound) / se))
    verdict = resolved(verdict_of(p), Z * se, resolution)
    return Outcome(float(estimate), estimate - Z * se, estimate + Z * se, float(bound), p, verdict)


def at_most(estimate, se, bound, resolution: float | None = None) -> Outcome:
    """H0: θ ≤ bound; rejected when θ̂ lies significantly above it."""
    flipped = at_least(-_f(estimate), se, -_f(bound), resolution)
    return Outcome(_f(estimate), -flipped.hi, -flipped.lo, _f(bound), flipped.p_value, flipped.verdict)


def bracket(low_side: tuple, high_side: tuple, predicted: float, resolution: float | None = None,
            dof: int | None = None) -> Outcome:
    """H0: θ_low ≤ predicted ≤ θ_high for two estimates (θ̂, se) that bound the quantity from either side (raw and
    floor-corrected gaps, docs/theory.md#floor-corrected-gap). Rejected when the low side lies significantly above
    the prediction or the high side significantly below it (Bonferroni over the two sides). The value is the
    midpoint; the interval runs from the low side's lower end to the high side's upper end. The resolution applies
    to that whole interval: a bracket wider than it cannot tell the prediction from an error of that size. ``dof``:
    Student t quantiles (standard errors from few seeds) instead of normal ones."""
    (lo_est, lo_se), (hi_est, hi_se) = low_side, high_side
    law = stats.norm if dof is None else stats.t(dof)
    if not _finite(lo_est, lo_se, hi_est, hi_se, predicted) or lo_se <= 0 or hi_se <= 0:
        return Outcome(math.nan, math.nan, math.nan, _f(predicted), math.nan, INCONCLUSIVE)
    p_low = law.sf((lo_est - predicted) / lo_se)  # small when θ_low > predicted
    p_high = law.cdf((hi_est - predicted) / hi_se)  # small when θ_high < predicted
    p = float(min(1.0, 2 * min(p_low, p_high)))
    z = float(law.ppf(1 - ALPHA / 2))
    lo, hi = lo_est - z * lo_se, hi_est + z * hi_se
    verdict = resolved(verdict_of(p), (hi - lo) / 2, resolution)
    return Outcome((lo_est + hi_est) / 2, lo, hi, float(predicted), p, verdict)


def _draw_tails(y: np.ndarray, mean_excess: float, variance: float) -> tuple[np.ndarray, np.ndarray]:
    """(P(X ≤ y), P(X ≥ y)) of X = e·E + √(v·e·E)·Z, E ~ Exp(1), Z ~ N(0, 1): an asymmetric Laplace law with rates
    a = 2/(e + r) above 0 and b = (e + r)/(v·e) below, r = √(e² + 2v·e) (b = ∞, X = e·E, where v = 0)."""
    r = math.sqrt(mean_excess**2 + 2 * variance * mean_excess)
    up = 2 / (mean_excess + r)
    down = math.inf if variance == 0 else (mean_excess + r) / (variance * mean_excess)
    down_share = up / (up + down)  # P(X < 0)
    above = (1 - down_share) * np.exp(-up * np.maximum(y, 0.0))  # P(X ≥ y) for y ≥ 0
    below = down_share * np.exp(down * np.minimum(y, 0.0)) if variance else np.zeros_like(y)  # P(X ≤ y) for y < 0
    return np.where(y >= 0, 1 - above, below), np.where(y >= 0, above, 1 - below)


T_GRID = np.sinh(np.linspace(-math.asinh(1e4), math.asinh(1e4), 8001))  # T's nodes: dense near 0, to |T| = 10⁴


@functools.lru_cache(maxsize=64)
def _t_weights(dof: float) -> tuple[np.ndarray, float, float]:
    """Student t(dof)'s quadrature weights on :data:`T_GRID` and its mass below and above the grid."""
    law = stats.t(dof)
    return law.pdf(T_GRID) * np.gradient(T_GRID), float(law.cdf(T_GRID[0])), float(law.sf(T_GRID[-1]))


def shifted_by_one_draw(observed, se, dof, mean_excess, predicted_base, resolution: float | None = None,
                        test_variance_per_excess: float = 0.0) -> Outcome:
    """H0: observed = predicted_base + X + √(v·X)·Z + T·se, with X = e·E one draw of a non-negative excess of mean e
    (E ~ Exp(1): a quadratic form ½δθᵀHδθ over k ≥ 2 directions, whose tails are heaviest at k = 2), Z ~ N(0, 1)
    the test set's first-order term, whose variance grows with the draw (v = ``test_variance_per_excess``,
    docs/theory.md#sgd-test-set-term), and T ~ Student t(dof) (the seeds' mean). Two-sided: p = 2·min(P(D ≥ d),
    P(D ≤ d)); X + √(v·X)·Z in closed form (:func:`_draw_tails`), T by quadrature on :data:`T_GRID`, both tails
    directly."""
    if not _finite(observed, se, mean_excess, predicted_base, test_variance_per_excess) or se <= 0 or mean_excess < 0:
        return Outcome(_f(observed), math.nan, math.nan, _f(predicted_base), math.nan, INCONCLUSIVE)
    if mean_excess == 0:
        return two_sided(observed, se, predicted_base, resolution, dof)
    d, v = observed - predicted_base, test_variance_per_excess
    weights, below_grid, above_grid = _t_weights(float(dof))
    lower, upper = _draw_tails(d - T_GRID * se, mean_excess, v)
    tails = [float(weights @ lower) + below_grid, float(weights @ upper) + above_grid]
    p = float(min(1.0, 2 * min(tails)))
    q = float(stats.t(dof).ppf(1 - ALPHA / 2))
    tail = math.log(2 / ALPHA)  # E's 97.5% quantile
    test_half = Z * math.sqrt(v * mean_excess * tail)
    half = q * se + mean_excess * tail + test_half  # the three terms' 97.5% quantiles, side by side
    verdict = resolved(verdict_of(p), half / 2, resolution)
    return Outcome(float(observed), observed - q * se - mean_excess - test_half, observed + half,
                   predicted_base + mean_excess, p, verdict)


def binomial_at_most(successes: int, trials: int, rate: float) -> Outcome:
    """H0: an event's probability is at most ``rate`` (a bound's exceedance ≤ δ), by the exact binomial upper tail;
    the value is the observed frequency / rate with its Clopper–Pearson interval / rate."""
    if trials <= 0:
        return Outcome(math.nan, math.nan, math.nan, 1.0, math.nan, INCONCLUSIVE)
    p = float(stats.binom.sf(successes - 1, trials, rate))
    lo = stats.beta.ppf(ALPHA / 2, successes, trials - successes + 1) if successes > 0 else 0.0
    hi = stats.beta.ppf(1 - ALPHA / 2, successes + 1, trials - successes) if successes < trials else 1.0
    return Outcome(successes / trials / rate, lo / rate, hi / rate, 1.0, p, verdict_of(p))


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN entries are not tests and stay NaN): rejecting where the adjusted p is
    below α controls the family-wise error rate at α under any dependence."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full_like(p, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    m = len(order)
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p[i]))
        out[i] = running
    return out


def _f(x) -> float:
    return math.nan if x is None else float(x)
