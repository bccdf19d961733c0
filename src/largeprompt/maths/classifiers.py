"""Small, honest classifiers for "does this quantity predict the flow class?" (docs/experiments.md#init_dependence):
a one-threshold rule and a logistic regression, each scored by k-fold cross-validation, and the Wilson
interval of a proportion.

Folds are fixed by index (item i in fold i mod k), so the scores are deterministic.
"""
from __future__ import annotations

import numpy as np
from scipy import optimize, stats


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (exact endpoints 0 and 1 where the data reach them)."""
    if trials == 0:
        return float("nan"), float("nan")
    z = stats.norm.ppf(0.5 + level / 2)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * np.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))


def fit_stump(x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """(threshold, sign) of the rule ``sign·(x − threshold) > 0`` that classifies the most of ``y`` (bool) right;
    thresholds are midpoints between consecutive distinct values (and the two ends)."""
    v = np.unique(x)
    cuts = np.concatenate([[v[0] - 1.0], 0.5 * (v[1:] + v[:-1]), [v[-1] + 1.0]])
    above = x[None, :] > cuts[:, None]  # [cuts, n]
    right = (above == y[None, :]).sum(1)  # sign +1
    best_plus, best_minus = int(right.argmax()), int((len(y) - right).argmax())
    if right[best_plus] >= len(y) - right[best_minus]:
        return float(cuts[best_plus]), 1
    return float(cuts[best_minus]), -1


def _folds(n: int, k: int):
    index = np.arange(n)
    return [(index % k != f, index % k == f) for f in range(min(k, n))]


def stump_cv_accuracy(x, y, k: int) -> int:
    """Number of items the one-threshold rule, fitted on the other folds, classifies right."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=bool)
    correct = 0
    for train, test in _folds(len(x), k):
        threshold, sign = fit_stump(x[train], y[train])
        correct += int(((sign * (x[test] - threshold) > 0) == y[test]).sum())
    return correct


def fit_logistic(X: np.ndarray, y: np.ndarray, ridge: float = 1e-3):
    """Weights (w, b) of an L2-regularised logistic regression on standardised columns (mean, scale returned too)."""
    mean, scale = X.mean(0), X.std(0)
    scale[scale == 0] = 1.0
    Z = (X - mean) / scale
    sign = np.where(y, 1.0, -1.0)

    def loss(wb):
        margin = sign * (Z @ wb[:-1] + wb[-1])
        return np.logaddexp(0.0, -margin).mean() + ridge * wb[:-1] @ wb[:-1]

    def grad(wb):
        margin = sign * (Z @ wb[:-1] + wb[-1])
        g = -sign / (1.0 + np.exp(margin)) / len(y)
        return np.concatenate([Z.T @ g + 2 * ridge * wb[:-1], [g.sum()]])

    res = optimize.minimize(loss, np.zeros(Z.shape[1] + 1), jac=grad, method="L-BFGS-B")
    return res.x[:-1], res.x[-1], mean, scale


def logistic_cv_accuracy(X, y, k: int) -> int:
    """Number of items a logistic regression on all columns of ``X``, fitted on the other folds, classifies right."""
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=bool)
    correct = 0
    for train, test in _folds(len(y), k):
        w, b, mean, scale = fit_logistic(X[train], y[train])
        correct += int(((((X[test] - mean) / scale) @ w + b > 0) == y[test]).sum())
    return correct
