"""The verdict rules of the claims ledger (docs/experiments.md#claims). Each returns one of VERDICTS."""
from __future__ import annotations

import math

AGREES, DISAGREES, INCONCLUSIVE, NOT_RUN = "agrees", "disagrees", "inconclusive", "not run"
DESCRIPTIVE = "descriptive"  # a fact of the run with its interval, not a test (a finding, docs/experiments.md#claims)
VERDICTS = (AGREES, DISAGREES, INCONCLUSIVE, NOT_RUN, DESCRIPTIVE)


def _finite(*values) -> bool:
    return all(v is not None and math.isfinite(float(v)) for v in values)


def interval(lo: float, hi: float, predicted: float, max_width: float = math.inf) -> str:
    """agrees: the 95% interval [lo, hi] contains the prediction; disagrees: it excludes it; inconclusive: no
    interval, or one wider than ``max_width`` (too few points to tell)."""
    if not _finite(lo, hi) or hi - lo > max_width:
        return INCONCLUSIVE
    return AGREES if lo <= predicted <= hi else DISAGREES


def at_most(value: float, bound: float) -> str:
    """agrees: value ≤ bound; disagrees: above it; inconclusive: no value."""
    if not _finite(value):
        return INCONCLUSIVE
    return AGREES if value <= bound else DISAGREES


def decreases(later: tuple[float, float], earlier: tuple[float, float]) -> str:
    """agrees: the later interval (lo, hi) lies wholly below the earlier one; disagrees: wholly above it;
    inconclusive: they overlap."""
    if not _finite(*later, *earlier):
        return INCONCLUSIVE
    if later[1] < earlier[0]:
        return AGREES
    return DISAGREES if later[0] > earlier[1] else INCONCLUSIVE
